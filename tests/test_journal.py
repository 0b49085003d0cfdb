"""`--storage journal:PATH`: Optuna's journal file as a study storage, with the heartbeats Optuna gives only its
RDB storage, checked before any work. Each "process" here is a handle of its own on one journal file, which is
all two processes share (the accounting under real processes: tests/test_job_array.py, tests/test_faults.py)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.tuning.storage import HEARTBEAT_ATTR, JOURNAL_LOCK_SECONDS, JournalWithHeartbeats, check_storage_url, grace_seconds, make_storage
from tuner.tuning.study import claim_export, record_export

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")


def handle(journal: Path, heartbeat: int = 20) -> optuna.Study:
    """One process's view of study "s" on the journal (created by the first)."""
    return optuna.create_study(study_name="s", storage=make_storage(f"journal:{journal}", heartbeat), load_if_exists=True)


def test_a_journal_is_made_with_its_folder_and_read_by_every_handle(tmp_path: Path) -> None:
    journal = tmp_path / "new" / "study.journal"
    writer = handle(journal)
    writer.enqueue_trial({"x": 0.5})
    assert journal.is_file() and isinstance(writer._storage, JournalWithHeartbeats)
    assert [t.system_attrs["fixed_params"] for t in handle(journal).trials] == [{"x": 0.5}]


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("journal:", "cannot open study storage 'journal:': no file named after 'journal:'. Use e.g. "),
        ("journal:{tmp}", "is a folder; name a file in it, e.g. journal:{tmp}/study.journal"),
        ("journal:{tmp}/optuna.db", "optuna.db is a SQLite database, not a journal; use sqlite:///{tmp}/optuna.db"),
    ],
)
def test_a_journal_path_that_names_no_journal_fails_before_any_work(spec: str, said: str, tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "optuna.db").execute("create table t (x)").connection.close()
    with pytest.raises(ValueError) as error:
        check_storage_url(spec.format(tmp=tmp_path))
    assert said.format(tmp=tmp_path) in str(error.value)


def test_a_first_line_still_being_written_by_another_process_is_no_reason_to_refuse_the_journal(tmp_path: Path) -> None:
    """Tasks of a job array start together: one may look at a new journal while another writes its first line."""
    journal = tmp_path / "study.journal"
    journal.write_bytes(b'{"op_code":0,"worker_id":"a-1","study_na')
    check_storage_url(f"journal:{journal}")
    journal.write_bytes(b'{"op_code":0}\n')
    check_storage_url(f"journal:{journal}")
    journal.write_bytes(b'{"note": "mine"}\n')
    with pytest.raises(ValueError, match="is not an Optuna journal"):
        check_storage_url(f"journal:{journal}")


def test_a_trial_silent_past_the_grace_period_is_failed_and_queued_again(tmp_path: Path) -> None:
    """The heartbeats Optuna's RDB storage has: a running trial whose process stopped beating is failed by the
    next process that checks, and queued again with what it had drawn; a beating one is left alone."""
    journal = tmp_path / "study.journal"
    study = handle(journal, heartbeat=1)
    grace = grace_seconds(study._storage)
    silent, beating = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), study.ask()
    for trial in (silent, beating):
        study._storage.record_heartbeat(trial._trial_id)
    other = handle(journal, heartbeat=1)
    optuna.storages.fail_stale_trials(other)
    assert [t.state for t in other.trials] == [TrialState.RUNNING] * 2, "nothing is stale within the grace period"

    beats = study._storage.get_trial(silent._trial_id).system_attrs[HEARTBEAT_ATTR]
    backdated = {"trial_id": beats["trial_id"], "at": time.time() - grace - 1}  # as if its process had stopped then
    study._storage.set_trial_system_attr(silent._trial_id, HEARTBEAT_ATTR, backdated)
    study._storage.record_heartbeat(beating._trial_id)
    optuna.storages.fail_stale_trials(other)
    trials = other.trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING]
    assert trials[2].system_attrs["failed_trial"] == silent.number and trials[2].params == trials[0].params

    retry = handle(journal, heartbeat=1).ask()  # another process takes the retry: it carries the old trial's beat
    assert retry.number == 2 and HEARTBEAT_ATTR in other._storage.get_trial(retry._trial_id).system_attrs
    optuna.storages.fail_stale_trials(other)
    assert other.trials[2].state == TrialState.RUNNING, "a beat inherited from the failed trial is not the retry's"


def test_a_beat_of_a_trial_another_process_failed_is_dropped_quietly(tmp_path: Path) -> None:
    """Optuna's heartbeat thread keeps beating while the trial loop has not yet learnt that its trial was failed."""
    journal = tmp_path / "study.journal"
    study = handle(journal)
    trial = study.ask()
    handle(journal)._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    study._storage.record_heartbeat(trial._trial_id)
    assert study._storage.get_trial(trial._trial_id).state == TrialState.FAIL


@pytest.mark.parametrize(("heartbeat", "grace"), [(20, 60), (5, JOURNAL_LOCK_SECONDS + 5), (1, JOURNAL_LOCK_SECONDS + 1)])
def test_a_trial_counts_as_dead_only_after_a_lock_left_by_a_killed_writer_would_have_been_broken(
    heartbeat: int, grace: int, tmp_path: Path
) -> None:
    """A writer killed inside a write leaves the journal's lock behind, and every process, beats included, waits
    until it is broken: silence that short is no sign of death. Measured with --heartbeat 2: four processes on one
    journal, one SIGKILLed holding the lock; the coordinator's live trial was failed as dead 31 s later."""
    assert grace_seconds(make_storage(f"journal:{tmp_path / 'study.journal'}", heartbeat)) == grace
    assert grace_seconds(make_storage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat)) == 3 * heartbeat  # a database has no such lock


def test_of_two_processes_finishing_a_study_on_one_journal_one_exports(tmp_path: Path) -> None:
    """The election of the exporter (`claim_export`) is the creation of a marker study, which a journal lets only
    the first of two processes make."""
    journal = tmp_path / "study.journal"
    first, second = handle(journal), handle(journal)
    first.tell(first.ask(), 0.1)
    claims = [claim_export(first), claim_export(second)]
    assert claims[0] is None and claims[1] is not None and "export" not in claims[1]  # the second is told who exports
    record_export(first, tmp_path / "best.yaml")
    assert claim_export(handle(journal))["export"] == str(tmp_path / "best.yaml")  # a rerun says where it is


def test_tune_export_opens_a_journal_study_and_names_one_that_is_not_there(tmp_path: Path) -> None:
    """`tune export --storage journal:PATH` opens the journal as the study's processes do."""
    from typer.testing import CliRunner

    from tuner.cli.app import app

    journal = tmp_path / "study.journal"
    handle(journal)
    result = CliRunner().invoke(app, ["export", "--study-name", "other", "--storage", f"journal:{journal}"])
    assert result.exit_code == 2 and f"no study 'other' in journal:{journal}" in " ".join(result.output.split())
