"""Which of the processes that finish a study together exports it: an election through the storage they share."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import optuna

from tuner.common.trials import complete_trials
from tuner.tuning.optuna_access import set_study_system_attr, storage_of, study_system_attrs
from tuner.tuning.owners import OWNER_ATTR, process_alive, this_process

log = logging.getLogger(__name__)


EXPORT_ATTR = "posfair:export"  # a study system attribute: {"trials", "export", "owner"} of its last export


def _export_mark(study: optuna.Study) -> str:
    """The name of the marker of an export of `study` as it stands (`~` is outside study names' characters)."""
    return f"{study.study_name}~export~{len(complete_trials(study))}"


def _exported(study: optuna.Study) -> dict[str, object] | None:
    """The study's export as it stands ({"export": path, OWNER_ATTR: who}), if one was written (`record_export`)."""
    done = study_system_attrs(study).get(EXPORT_ATTR)
    return done if done is not None and done.get("trials") == len(complete_trials(study)) else None


def claim_export(study: optuna.Study) -> dict[str, object] | None:
    """Elect the one process that exports `study` with its current complete trials: None if it is this one,
    else what the elected one recorded (its `owner`, and `export`, the path, once written).

    Processes that finish a study together all reach its conclusion; the election is the creation of a
    marker study named after the study and its trial count, which the storage every process shares lets
    exactly one of them create. The marker lives only while the export is written (`record_export` moves what it
    says onto the study itself and deletes it), so optuna-dashboard lists no study beside the real one once it is
    done. A marker whose exporter died on this machine before it finished is taken over.
    """
    storage, mark = storage_of(study), _export_mark(study)
    while True:
        if (done := _exported(study)) is not None:
            return done
        try:
            mark_id = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], mark)
        except optuna.exceptions.DuplicatedStudyError:
            try:
                mark_id = storage.get_study_id_from_name(mark)
                attrs = storage.get_study_user_attrs(mark_id)
            except KeyError:  # deleted by a process taking over, or by the exporter as it finished: look again
                continue
            owner = attrs.get(OWNER_ATTR) or {}
            if owner.get("host") != socket.gethostname() or process_alive(int(owner.get("pid", os.getpid()))):
                return attrs
            log.warning(
                "the export of study %s by process %s did not finish (it is gone); it is done here",
                study.study_name,
                owner["pid"],
            )
            try:
                storage.delete_study(mark_id)
            except KeyError:
                pass
            continue
        if (done := _exported(study)) is not None:  # written, and its marker deleted, between the two looks above
            storage.delete_study(mark_id)
            return done
        storage.set_study_user_attr(mark_id, OWNER_ATTR, this_process())
        return None


def record_export(study: optuna.Study, path: Path) -> None:
    """Mark the elected export as written (`claim_export`) on the study (later runs say where it is instead of
    exporting again), then remove the marker: written first, so a process that looks between the two finds one."""
    record: dict[str, Any] = {"trials": len(complete_trials(study)), "export": str(path), OWNER_ATTR: this_process()}
    set_study_system_attr(study, EXPORT_ATTR, record)
    storage = storage_of(study)
    try:
        storage.delete_study(storage.get_study_id_from_name(_export_mark(study)))
    except KeyError:
        pass


def describe_elected(elected: dict[str, object], study: optuna.Study) -> str:
    """What `claim_export` elected, in words: which process exports (or exported) the study, and where to."""
    owner: dict[str, object] = elected.get(OWNER_ATTR) or {}  # type: ignore[assignment]
    who = f"the other process (pid {owner.get('pid', '?')} on {owner.get('host', '?')})"
    trials = len(complete_trials(study))
    if "export" in elected:
        return (
            f"study {study.study_name} is complete ({trials} trials) and its winner was exported by {who} to "
            f"{elected['export']}, so not again here; `tune export --study-name {study.study_name}` exports it again"
        )
    return (
        f"study {study.study_name} is complete ({trials} trials); its winner is being exported by {who}, so not "
        "again here"
    )
