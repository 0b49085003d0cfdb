"""Coordinating a study: spawn local workers, measure the baseline and set the HM floor, queue the reference
trials, take part in the trials, and conclude (`tuner.tuning.conclusion`)."""

from __future__ import annotations

import logging

from objectives import HmFloor
from tuner.common.trials import START_ATTR
from tuner.tracking.progress import Phase
from tuner.tracking.runs import Tracker
from tuner.tuning.conclusion import TuneOutcome, conclude
from tuner.tuning.hm_floor import FLOOR_ATTR
from tuner.tuning.local_workers import start_workers
from tuner.tuning.search_space import BASELINE_PARAMS, PAPER_DEFAULT_PARAMS, PAPER_SIBLINGS, depth_layers
from tuner.tuning.session import Session
from tuner.tuning.settings import TuneSettings
from tuner.tuning.study import describe_study, enqueue_once
from tuner.tuning.worker import run_session_trials

log = logging.getLogger(__name__)


def coordinate(session: Session) -> TuneOutcome | None:
    """Run (or resume) the study and export its winner (None: another process finishing it was elected to)."""
    settings, study, tracker, evaluator = session.settings, session.study, session.tracker, session.evaluator
    tuning, space = session.tuning, session.space
    workers = start_workers(settings, settings.workers - 1)  # they load while the baseline is measured
    for key, value in _reload_attrs(settings, tracker).items():  # what `tune export` needs to load it all again
        study.set_user_attr(key, value)
    with Phase(f"baseline: encoding {len(tuning.corpus)} documents and {len(tuning.queries)} queries of {tuning.name}"):
        baseline = evaluator.run(None)
    if baseline.report.hm is None:  # `prepare` requires position groups of the tuning set
        raise ValueError(f"{tuning.name} has no position groups, so no HM to place the floor by")
    floor = HmFloor.parse(settings.hm_floor).resolve(baseline.report.hm)
    study.set_user_attr(FLOOR_ATTR, floor)
    constraints = settings.constraints(baseline.report.hm)
    describe_study(study, settings.pareto, constraints, session.in_force(constraints), bool(session.structures))
    for reference, label in (
        (BASELINE_PARAMS, "the uncalibrated baseline"),
        (PAPER_DEFAULT_PARAMS, "the paper's default"),
    ):
        if space.admits(reference):
            enqueue_once(study, *space.reference_trial(reference))
        else:
            log.warning(
                "%s is not in this search space (%s), so it is not run as a reference trial",
                label,
                space.outside(reference),
            )
    if settings.paper_siblings:
        _queue_siblings(session)
    outcome = run_session_trials(
        session,
        floor,
        workers,
        lambda staging: conclude(settings, study, tracker, evaluator, session.heldout, floor, staging, session.storage),
    )
    assert outcome is None or isinstance(outcome, TuneOutcome)
    return outcome


def _queue_siblings(session: Session) -> None:
    """Queue the paper default's siblings (`PAPER_SIBLINGS`) that calibrate layers of their own on this model: a
    sibling whose depth resolves to the layers of the default or of an earlier sibling (a small model) would
    only repeat it, and one outside the space is left to the sampler."""
    num_layers = session.model.num_layers
    seen = {depth_layers(str(PAPER_DEFAULT_PARAMS["depth"]), num_layers)}
    for sibling, role in PAPER_SIBLINGS:
        layers = depth_layers(str(sibling["depth"]), num_layers)
        if session.space.admits(sibling) and layers not in seen:
            params, attrs = session.space.reference_trial(sibling)
            enqueue_once(session.study, params, {**attrs, START_ATTR: role})
            seen.add(layers)


def _reload_attrs(settings: TuneSettings, tracker: Tracker) -> dict[str, object]:
    """Study attributes beyond its identity: how to load the model again, where its runs are logged."""
    return {"trust_remote_code": settings.trust_remote_code, "tracking_uri": tracker.uri, "heldout": settings.heldout}
