"""`--storage journal:PATH`: Optuna's journal file as a study storage, with the heartbeats Optuna gives only its
RDB storage, checked before any work. Each "process" here is a handle of its own on one journal file, which is
all two processes share (the accounting under real processes: tests/test_job_array.py, tests/test_faults.py)."""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.tuning.export_election import claim_export, record_export
from tuner.tuning.storage import (
    HEARTBEAT_ATTR,
    JOURNAL_LOCK_SECONDS,
    JournalWithHeartbeats,
    check_storage_url,
    grace_seconds,
    make_storage,
)

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")


def handle(journal: Path, heartbeat: int = 20) -> optuna.Study:
    """One process's view of study "s" on the journal (created by the first)."""
    return optuna.create_study(
        study_name="s", storage=make_storage(f"journal:{journal}", heartbeat), load_if_exists=True
    )


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


def writing(journal: Path, rest: bytes, after: float = 0.3) -> threading.Thread:
    """Another process appending a line, as Optuna's writers do: it holds the journal's lock (a symbolic link
    beside it) while the line's start is on disk, writes the rest `after` seconds later, then lets the lock go."""
    lock = Path(f"{journal}.lock")
    lock.symlink_to(journal)

    def finish() -> None:
        time.sleep(after)
        with journal.open("ab") as stream:
            stream.write(rest)
        lock.unlink()

    writer = threading.Thread(target=finish)
    writer.start()
    return writer


def test_a_first_line_still_being_written_by_another_process_is_no_reason_to_refuse_the_journal(tmp_path: Path) -> None:
    """Tasks of a job array start together: one may look at a new journal while another writes its first line."""
    journal = tmp_path / "study.journal"
    journal.write_bytes(b'{"op_code":0,"worker_id":"a-1","study_na')
    writer = writing(journal, b'me":"s","directions":[1]}\n')
    check_storage_url(f"journal:{journal}")
    writer.join()
    journal.write_bytes(b'{"op_code":0}\n')
    check_storage_url(f"journal:{journal}")
    journal.write_bytes(b'{"note": "mine"}\n')
    with pytest.raises(ValueError, match="is not an Optuna journal"):
        check_storage_url(f"journal:{journal}")


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def journal_of_three_trials(journal: Path) -> int:
    """A study of three finished trials on `journal`; the number of its lines."""
    handle(journal).optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=3)
    return len(journal.read_bytes().splitlines())


def follow(advice: str, journal: Path) -> None:
    """Run the command the refusal gives between backticks, as the user would."""
    [command] = re.findall(r"`([^`]*)`", advice)
    assert str(journal) in command
    subprocess.run(command, shell=True, check=True)


@pytest.mark.parametrize(
    ("tail", "said"),
    [
        (b"garbage\n", "its last line is not a journal entry"),
        (b'{"op_code":6,"worker_id":"killed","trial_id":2,"sta', "its last line ends without a line break"),
    ],
    ids=["garbage", "cut short"],
)
def test_a_journal_whose_last_line_is_garbage_or_cut_short_names_the_line_and_the_command_that_recovers_it(
    tmp_path: Path, tail: bytes, said: str
) -> None:
    """A writer killed mid-append leaves such a line. The next run appended to the journal, then failed with a bare
    `Expecting value: line 1 column 1 (char 0)`; from then on the file was "not an Optuna journal". It is refused
    before anything is written, naming the file, the line and the command that cuts the line off; that command
    recovers every trial."""
    journal = tmp_path / "study.journal"
    lines = journal_of_three_trials(journal)
    with journal.open("ab") as stream:
        stream.write(tail)
    before = md5(journal)
    for opening in (check_storage_url, make_storage):
        with pytest.raises(ValueError, match=re.escape(f"{journal}:{lines + 1}: {said}")) as error:
            opening(f"journal:{journal}")
        assert md5(journal) == before, "nothing appended"
    assert f"truncate -s {journal.stat().st_size - len(tail)} {journal}" in str(error.value)
    follow(str(error.value), journal)
    assert [t.state for t in handle(journal).trials] == [TrialState.COMPLETE] * 3


def test_a_garbage_line_inside_a_journal_is_named_with_the_command_that_removes_it(tmp_path: Path) -> None:
    """What the next run left when it appended after a garbage last line: the line is named, and deleting it (the
    command said) recovers the study."""
    journal = tmp_path / "study.journal"
    lines = journal_of_three_trials(journal)
    content = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join([*content[:-1], b"garbage\n", content[-1]]))
    with pytest.raises(
        ValueError, match=re.escape(f"{journal}:{lines}: line {lines} of {lines + 1} is not a journal entry")
    ) as error:
        check_storage_url(f"journal:{journal}")
    follow(str(error.value), journal)
    assert [t.state for t in handle(journal).trials] == [TrialState.COMPLETE] * 3


def test_a_line_cut_short_by_a_writer_killed_holding_the_lock_is_named_once_the_lock_is_stale(tmp_path: Path) -> None:
    """A writer killed mid-append also leaves its lock: once the lock is older than Optuna would wait, the line is
    no longer being written; the lock is named for removal too."""
    journal = tmp_path / "study.journal"
    journal_of_three_trials(journal)
    with journal.open("ab") as stream:
        stream.write(b'{"op_code":6,"worker_id":"killed"')
    lock = Path(f"{journal}.lock")
    lock.symlink_to(journal)
    stale = time.time() - JOURNAL_LOCK_SECONDS - 5
    os.utime(journal, (stale, stale))
    start = time.monotonic()
    with pytest.raises(ValueError, match="its last line ends without a line break") as error:
        check_storage_url(f"journal:{journal}")
    assert time.monotonic() - start < 5 and f"rm {lock}" in str(error.value)


@pytest.mark.parametrize("content", [b'{"a": 1}', b'{"op_code": 0}', b"[1, 2, 3]"])
def test_a_one_line_json_file_is_no_journal_and_is_left_as_it_was(tmp_path: Path, content: bytes) -> None:
    """A one-line JSON file without a line break given as `journal:` was appended to, then failed with a traceback."""
    path = tmp_path / "settings.json"
    path.write_bytes(content)
    for opening in (check_storage_url, make_storage):
        with pytest.raises(ValueError, match=f"{path}"):
            opening(f"journal:{path}")
    assert path.read_bytes() == content


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


@pytest.mark.parametrize(
    ("heartbeat", "grace"), [(20, 60), (5, JOURNAL_LOCK_SECONDS + 5), (1, JOURNAL_LOCK_SECONDS + 1)]
)
def test_a_trial_counts_as_dead_only_after_a_lock_left_by_a_killed_writer_would_have_been_broken(
    heartbeat: int, grace: int, tmp_path: Path
) -> None:
    """A writer killed inside a write leaves the journal's lock behind, and every process, beats included, waits
    until it is broken: silence that short is no sign of death. Measured with --heartbeat 2: four processes on one
    journal, one SIGKILLed holding the lock; the coordinator's live trial was failed as dead 31 s later."""
    assert grace_seconds(make_storage(f"journal:{tmp_path / 'study.journal'}", heartbeat)) == grace
    assert (
        grace_seconds(make_storage(f"sqlite:///{tmp_path / 'o.db'}", heartbeat)) == 3 * heartbeat
    )  # a database has no such lock


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


def cli(*args: str) -> str:
    """The command line's answer to a refusal: exit 2 and one message, no traceback; the output on one line."""
    from typer.testing import CliRunner

    from tuner.cli.app import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), f"{result.exception!r}\n{result.output}"
    return " ".join(result.output.split())


def test_reading_a_journal_that_is_not_there_creates_none(tmp_path: Path) -> None:
    """`tune export --storage journal:<a typo>` created an empty file there and reported "no study"."""
    typo = tmp_path / "stduy.journal"
    said = cli("export", "--study-name", "s", "--storage", f"journal:{typo}")
    assert f"no journal at {typo}, so no study 's'" in said and not typo.exists()


def test_a_journal_given_as_a_sqlite_store_is_named_with_the_url_to_give(tmp_path: Path) -> None:
    """`tune export --storage sqlite:///<a journal>` gave a raw `file is not a database`."""
    journal = tmp_path / "study.journal"
    handle(journal)
    before = md5(journal)
    said = cli("export", "--study-name", "s", "--storage", f"sqlite:///{journal}")
    assert f"{journal} is an Optuna journal, not an SQLite database; give it as --storage journal:{journal}" in said
    assert md5(journal) == before


@pytest.mark.parametrize("uri", ["journal:{}", "sqlite:///{}", "{}"])
def test_the_mlflow_ui_on_a_journal_says_what_reads_one(tmp_path: Path, uri: str) -> None:
    """`tune ui` given a journal printed the UI link, then a traceback: MLflow cannot read a journal."""
    journal = tmp_path / "study.journal"
    handle(journal)
    said = cli("ui", "--tracking-uri", uri.format(journal))
    assert f"{journal} is an Optuna journal (a study store), which MLflow cannot read" in said, said
    assert f"optuna-dashboard {journal}" in said and "MLflow UI:" not in said
