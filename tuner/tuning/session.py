"""A study prepared: model and data there and loaded, storage and tracking opened, the study created or resumed.

Both the coordinating `tune` and every worker start from the same `Session` (`prepare`); what they do
with it is `tuner.tuning.coordinator`'s and `tuner.tuning.worker`'s.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from objectives import Constraints
from tuner.common.budget import store_study_budget
from tuner.common.messages import UserError
from tuner.common.scratch import clean_orphans
from tuner.common.trials import SAMPLER_ATTR, SELECTION_ATTR
from tuner.common.waiting import NOTICE_SECONDS, wait_until
from tuner.data import DatasetUnavailableError, PositionalDataset, is_crops, load_benchmark, load_structures, require_position_groups
from tuner.data import check_available as check_benchmark
from tuner.data.wikipos import TRANSFER_SPLITS
from tuner.engine.models import LoadedModel, load_model
from tuner.engine.specs import ModelUnavailableError, locate, resolve_spec
from tuner.evaluation.cost import StudyCost
from tuner.evaluation.evaluator import Evaluator
from tuner.evaluation.visible import within_reach
from tuner.tracking.runs import Tracker
from tuner.tuning.estimate import estimate_study
from tuner.tuning.search_space import GRIDS, SearchSpace
from tuner.tuning.settings import EXPERIMENT, TuneSettings, process_identity
from tuner.tuning.storage import check_storage_url, default_storage
from tuner.tuning.study import open_study

log = logging.getLogger(__name__)

FLOOR_ATTR = "floor_value"
COORDINATOR_WAIT_SECONDS = 3600.0  # how long a worker waits for the coordinator's HM floor


def await_floor(
    study: optuna.Study,
    settings: TuneSettings,
    timeout: float = COORDINATOR_WAIT_SECONDS,
    every: float = NOTICE_SECONDS,
    poll: float = 2.0,
) -> float:
    """The HM floor, once the coordinating `tune` has measured the baseline and stored it; a worker waits for it,
    saying so at once and periodically (`wait_until`), and gives up after `timeout` seconds."""
    array = settings.array_task is not None
    coordinator = "task 0 of the job array (the coordinator)" if array else "the coordinating `tune` (without --worker)"
    wait_until(
        lambda: FLOOR_ATTR in study.user_attrs,
        waiting=f"waiting for {coordinator} to measure the baseline and set the HM floor of study {study.study_name!r}",
        gave_up=f"no coordinator set the HM floor of study {study.study_name!r}: start {coordinator} first, or read "
        "its log for why it stopped, then start this one again",
        timeout=timeout,
        every=every,
        poll=poll,
    )
    return float(study.user_attrs[FLOOR_ATTR])


class UnavailableError(UserError, RuntimeError):
    """What the run needs is neither here nor downloadable from here; the message lists every download."""


def check_available(settings: TuneSettings) -> None:
    """Before any work: the model and every benchmark the run reads must be here (or the hub reachable).

    One error names everything missing, each with its `hf download` command, so a user fetches all at once.
    """
    spec = resolve_spec(settings.model, settings.pooling, settings.padding_side)  # type: ignore[arg-type]
    problems = []
    try:
        locate(spec, settings.revision)
    except ModelUnavailableError as error:
        problems.append(str(error))
    names = [settings.dataset, settings.heldout if settings.heldout != "auto" else None, settings.general]
    for name in dict.fromkeys(n for n in names if n):
        try:
            check_benchmark(name)
        except DatasetUnavailableError as error:
            problems.append(str(error))
            if name == settings.dataset and settings.dataset_defaulted:
                problems.append(
                    f"{name} is {settings.model}'s default dataset; to tune offline on the embedded "
                    "WikiPos instead, add --dataset wikipos-dev"
                )
    if problems:
        raise UnavailableError("\n".join(problems))


WIKIPOS_HELDOUT = ("wikipos-test", *(f"wikipos-{split}" for split in TRANSFER_SPLITS))
AUTO_HELDOUT: dict[str, tuple[str, ...]] = {
    "wikipos-dev": WIKIPOS_HELDOUT,
    "wikipos-dev+titles": WIKIPOS_HELDOUT,
    "squad-tune": ("squad-test",),
}
"""What `--heldout auto` checks a winner on, by tuning set: WikiPos-dev's test split and transfer sets; the natural
SQuAD set's held-out articles (FineWeb-PosQ holds its own part out: `split_datasets`)."""


def tuning_dataset(settings: TuneSettings) -> str:
    """The name of the tuning set: `--dataset`, or the model's default that `TuneSettings` fills in."""
    if settings.dataset is None:
        raise ValueError("TuneSettings.dataset is unset: the settings skipped their __post_init__")
    return settings.dataset


def split_datasets(settings: TuneSettings) -> tuple[PositionalDataset, list[PositionalDataset]]:
    """The tuning set and the held-out sets selection never sees."""
    name = tuning_dataset(settings)
    if name.startswith("fineweb-posq"):
        tuning = load_benchmark(name, part="tune")
        heldout = [load_benchmark(name, part="heldout")] if settings.heldout == "auto" else []
    else:
        tuning = load_benchmark(name)
        heldout = [load_benchmark(h) for h in AUTO_HELDOUT.get(name, ())] if settings.heldout == "auto" else []
    if settings.heldout not in (None, "auto"):
        heldout = [load_benchmark(h.strip()) for h in settings.heldout.split(",") if h.strip()]
    return tuning, heldout


def check_held_out(tuning: PositionalDataset, heldout: list[PositionalDataset]) -> None:
    """A held-out set must be evidence the tuning never saw: neither the tuning set itself nor one whose relevant
    passages (compared by text, whatever their ids) are relevant passages of the tuning set."""

    def relevant(dataset: PositionalDataset) -> set[str]:
        return {dataset.corpus[d] for judged in dataset.qrels.values() for d, grade in judged.items() if grade > 0 and d in dataset.corpus}

    tuned = relevant(tuning)
    for held in heldout:
        if held.fingerprint() == tuning.fingerprint():
            raise ValueError(
                f"--heldout {held.name} is the tuning set itself (--dataset {tuning.name}), so its figures would "
                "not be held out; choose a set built from other passages, or --heldout none"
            )
        theirs = relevant(held)
        if shared := len(theirs & tuned):
            raise ValueError(
                f"--heldout {held.name} is not held out: {shared} of its {len(theirs)} relevant passages are "
                f"relevant passages of the tuning set {tuning.name}; choose a set built from other passages, "
                "or --heldout none"
            )


def _fitting_space(space: SearchSpace, evaluator: Evaluator) -> SearchSpace:
    """Drop basket sizes that no passage of the tuning data fills (trials that could only repeat the baseline)."""
    longest = evaluator.longest_content()
    fitting = space.fitting(longest)
    if fitting != space:
        dropped = sorted(set(space.basket_sizes) - set(fitting.basket_sizes))
        log.info("basket sizes %s dropped from the search: the longest passage has %d content tokens", dropped, longest)
    return fitting


@dataclass(frozen=True)
class Session:
    """Everything a study's coordinator and its workers share, prepared once per process."""

    settings: TuneSettings
    tracker: Tracker
    storage: str
    model: LoadedModel
    tuning: PositionalDataset
    heldout: list[PositionalDataset]
    evaluator: Evaluator
    space: SearchSpace
    general: PositionalDataset | None
    structures: list[PositionalDataset]  # the tuning passages in other structures: every trial's later rungs
    name: str
    identity: dict[str, object]
    study: optuna.Study
    cost: StudyCost | None = None  # the estimate printed before the study (the coordinator's; a worker has none)

    def in_force(self, constraints: Constraints) -> tuple[str, ...]:
        """The constraints this study checks (`Constraints.in_force`), given the structures and sets it scores."""
        return constraints.in_force(
            structures=bool(self.structures),
            crops=any(is_crops(s) for s in self.structures),
            general=self.general is not None,
        )


def prepare(settings: TuneSettings) -> Session:
    """Check, load and open what a study needs; a missing model or dataset, an unreachable tracking server
    or a malformed storage URL fails here, before any work."""
    check_available(settings)  # a missing model or dataset fails here, before anything is loaded or written
    tuning, heldout, general = _load_datasets(settings)  # so does a broken dataset (read before the model loads)
    tracker = Tracker(settings.tracking_uri, EXPERIMENT)  # an unreachable server fails here; a store is made later
    storage = settings.storage or default_storage()
    check_storage_url(storage)  # a malformed URL fails here too; the database is created with the study
    clean_orphans()  # temporary folders of killed runs
    model = _load_model(settings)
    tuning, heldout = within_reach(tuning, model), [within_reach(held, model) for held in heldout]
    _require_groups(tuning, heldout)  # again: queries past the model's reach are gone, and no store exists yet
    evaluator = Evaluator(
        model,
        tuning,
        settings.batch_size,
        show_progress=sys.stderr.isatty() and not settings.worker,
        batch_tokens=settings.batch_tokens,
        cache_budget=settings.cache_budget,
        prefix_layers=settings.space.starting_layers(model.num_layers),
    )
    space = _fitting_space(settings.space, evaluator)
    if settings.grid is not None:
        space.check_grid(GRIDS[settings.grid])  # a basket no passage fills was dropped: the grid cannot run as the paper's
    structures = _structures(settings, tuning, model)
    budget, cost = (None, None) if settings.worker else estimate_study(settings, evaluator, heldout, general, structures, space)
    name = settings.study_name_for(model)
    identity = study_identity(settings, model, tuning, general, structures, space)
    study = open_study(
        name,
        storage,
        seed=settings.seed,
        pareto=settings.pareto,
        identity=identity,
        heartbeat=settings.heartbeat,
        worker=process_identity(settings),
        grid=GRIDS[settings.grid] if settings.grid else None,
        sampler_name=settings.sampler,
    )
    if not settings.worker:  # workers read it from the study: a resume without --budget lifts it
        store_study_budget(study, budget)
        study.set_user_attr(SELECTION_ATTR, settings.selection)  # the rule `tune export` names the winner by
        study.set_user_attr(SAMPLER_ATTR, settings.sampler)  # how the latest session drew its trials
    return Session(settings, tracker, storage, model, tuning, heldout, evaluator, space, general, structures, name, identity, study, cost)


def reload_tuned(settings: TuneSettings, attrs: Mapping[str, Any]) -> tuple[LoadedModel, PositionalDataset, list[PositionalDataset]]:
    """The model and the tuning and held-out sets of a stored study (its attributes `attrs`, its `settings`), loaded as
    `tune` loaded them: the recorded revision, each set within the model's reach; one that changed since is named."""
    model = _load_model(settings)
    if model.revision != attrs["revision"]:
        raise ValueError(
            f"study {settings.study_name!r} tuned {attrs['model']} at revision {attrs['revision']}, "
            f"but {model.revision} loaded; restore that revision locally to re-export"
        )
    tuning, heldout = split_datasets(settings)
    tuning, heldout = within_reach(tuning, model), [within_reach(held, model) for held in heldout]  # as `tune` scored them
    if tuning.fingerprint() != attrs["dataset_fingerprint"]:
        raise ValueError(f"dataset {settings.dataset!r} changed since study {settings.study_name!r} ran (fingerprint differs)")
    return model, tuning, heldout


def _load_model(settings: TuneSettings) -> LoadedModel:
    """The model as the settings name it (its revision, pooling and padding side, remote code if allowed)."""
    return load_model(
        settings.model,
        revision=settings.revision,
        trust_remote_code=settings.trust_remote_code,
        pooling=settings.pooling,  # type: ignore[arg-type]
        padding_side=settings.padding_side,  # type: ignore[arg-type]
    )


def _load_datasets(settings: TuneSettings) -> tuple[PositionalDataset, list[PositionalDataset], PositionalDataset | None]:
    """The tuning set, the held-out sets and the general set, each checked before the model loads."""
    tuning, heldout = split_datasets(settings)
    general = load_benchmark(settings.general) if settings.general else None
    _require_groups(tuning, heldout)
    check_held_out(tuning, heldout)
    return tuning, heldout, general


def _require_groups(tuning: PositionalDataset, heldout: list[PositionalDataset]) -> None:
    require_position_groups(tuning, "--dataset")
    for held in heldout:
        require_position_groups(held, "--heldout")


def _structures(settings: TuneSettings, tuning: PositionalDataset, model: LoadedModel) -> list[PositionalDataset]:
    """The tuning passages in their other structures (`--structures`), within the model's reach."""
    structures = [within_reach(s, model) for s in load_structures(tuning_dataset(settings), tuning)] if settings.structures else []
    if settings.structures and not structures and not settings.worker:
        log.info("%s has no other structures (its passages' segments are unknown): trials are scored on it alone", tuning.name)
    if settings.max_crops_psi is not None and not any(is_crops(s) for s in structures) and not settings.worker:
        log.info("%s has no crops view (its passages' segments are unknown): --max-crops-psi does not apply", tuning.name)
    return structures


def study_identity(
    settings: TuneSettings,
    model: LoadedModel,
    tuning: PositionalDataset,
    general: PositionalDataset | None,
    structures: list[PositionalDataset],
    space: SearchSpace,
) -> dict[str, object]:
    """What a resumed study must match (`open_study`): the model, the data, the constraints, the space."""
    return {
        "model_name": settings.model,
        "pooling": model.spec.pooling,
        "padding_side": settings.padding_side,  # as given (None: the model's own), so studies made without it still resume
        "dataset_name": settings.dataset,
        "model": model.spec.source,
        "revision": model.revision,
        "dataset": tuning.name,
        "dataset_fingerprint": tuning.fingerprint(),
        "hm_floor": settings.hm_floor,
        "max_ndcg_drop": settings.max_ndcg_drop,
        "max_crops_psi": settings.max_crops_psi,
        "max_reversal": settings.max_reversal,
        "max_drift": settings.max_drift,
        "structures": [s.name for s in structures],
        "general": settings.general,
        "general_fingerprint": general.fingerprint() if general is not None else None,
        "max_general_drop": settings.max_general_drop,
        "space": space.as_dict(),
        "pareto": settings.pareto,
        "seed": settings.seed,
        "grid": settings.grid,
        "prune": settings.prune,
        "bisect": settings.bisect,
        "screen_queries": settings.screen_queries,
    }
