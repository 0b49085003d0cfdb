"""A fork server for the suite's `tune` processes (`python -m tuner.cli ...`).

Every such process spends most of its life importing torch, transformers, MLflow, Optuna and matplotlib
(~8 s on this machine) before it does anything, and the fault tests start well over a hundred of them. The
server imports those libraries once (`LIBRARIES`; posfair itself is not imported, so each process builds
posfair's own state afresh) and forks one child per command. The child takes the command's working folder,
environment, arguments and standard streams and runs `tuner.cli` as `python -m` would: its pid is real, so a
test signals it directly (SIGINT, SIGTERM, SIGKILL), and its exit status is the interpreter's (an uncaught
KeyboardInterrupt still ends it by SIGINT). A test gets a `Popen`-like `TuneProcess`.

What differs from a fresh interpreter: library state set at import time comes from the server's environment
(the suite's, which the commands here share; tests that change such variables, like the fake hub's endpoint,
start real processes), MLflow's map of installed modules to packages is the server's (the same venv), and the
child's parent is the server, which reaps it and reports its status.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from tests import mlflow_template

LIBRARIES = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.bert.modeling_bert",
    "transformers.models.xlm_roberta.modeling_xlm_roberta",
    "transformers.models.qwen3.modeling_qwen3",
    "sentence_transformers",
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "sqlalchemy",
    "optuna",
    "optuna.importance",
    "sklearn.ensemble",
    "matplotlib.pyplot",
    "ir_measures",
    "typer",
    "rich.console",
    "rich.progress",
    "pydantic",
    "yaml",
)
TUNE_COMMAND = (sys.executable, "-m", "tuner.cli")  # `tune` as the tests start it; the server runs these
_STATUS_POLL_SECONDS = 0.02


# ---------------------------------------------------------------------------------------------- the server


def serve(path: str) -> dict[str, Any]:
    """Listen on the Unix socket `path`; return (in the forked child only) the request the child must run.

    One connection per command: the client sends a JSON request with its three standard streams as file
    descriptors; the server answers the child's pid, then its exit status (Popen's form: -N for signal N)."""
    for name in LIBRARIES:
        __import__(name)
    from mlflow.utils.requirements_utils import _init_modules_to_packages_map

    # MLflow maps every installed module to its package at a model's first log: 1.2 s per export
    _init_modules_to_packages_map()
    mlflow_template.install(Path(path).parent)  # a new SQLite store is a copy, not 1.7 s of migrations
    gc.collect()
    gc.freeze()  # the children's collections skip what is here: otherwise each one would copy it all (copy-on-write)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"{path}.binding")
    listener.listen(64)
    os.rename(f"{path}.binding", path)  # the path appears once connections are accepted
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while os.getppid() == parent:  # the test process that started the server is gone: so is the server
        for _ in selector.select(timeout=_STATUS_POLL_SECONDS):
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                for other in (*children.values(), connection):
                    other.close()
                request = json.loads(message)
                _become(request, fds)
                return request
            for fd in fds:
                os.close(fd)
            connection.sendall(f"{pid}\n".encode())
            children[pid] = connection
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid)
            try:
                connection.sendall(f"{_returncode(status)}\n".encode())
            except OSError:
                pass  # the client is gone
            connection.close()
    raise SystemExit(0)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _become(request: dict[str, Any], fds: Sequence[int]) -> None:
    """In the child: take the command's streams, folder, environment, path and arguments."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # chosen again from this environment's TMPDIR
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *[p for p in sys.path[1:] if p not in extra]]
    sys.argv = ["-m", *request["args"]]  # run_module puts the module's file first, as `python -m` does


def _exit(status: object) -> None:
    """End the child as the interpreter ends a program that returned or raised SystemExit, without tearing
    down the modules it inherited: that teardown touches every object the server imported, so each child
    would copy the server's whole heap (copy-on-write) only to free it (~0.7 s a child here). What a program
    can observe of its exit still happens, in the interpreter's order: non-daemon threads are joined, atexit
    callbacks run, the standard streams are flushed. Any other exception ends it the usual way."""
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status
    else:
        print(status, file=sys.stderr)
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)


# ---------------------------------------------------------------------------------------------- the client


class TuneProcess:
    """What the tests use of `subprocess.Popen`, for a command run by the fork server."""

    def __init__(
        self,
        args: Sequence[str],
        server: str,
        *,
        cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        text: bool = False,
    ) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        opened: list[int] = []  # descriptors to close once the child has its own
        null = os.open(os.devnull, os.O_RDWR)
        opened.append(null)

        def stream(spec: int | IO[Any] | None, inherit: int) -> tuple[int, int | None]:
            if spec is None:
                return inherit, None
            if spec == subprocess.DEVNULL:
                return null, None
            if spec == subprocess.PIPE:
                read, write = os.pipe()
                opened.append(write)
                return write, read
            if isinstance(spec, int):
                return spec, None
            return spec.fileno(), None

        out, out_read = stream(stdout, 1)
        err, err_read = (out, None) if stderr == subprocess.STDOUT else stream(stderr, 2)
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._connection.connect(server)
        request = {
            "args": self.args[3:],
            "cwd": str(cwd or os.getcwd()),
            "env": dict(os.environ if env is None else env),
        }
        socket.send_fds(self._connection, [json.dumps(request).encode()], [null, out, err])
        for fd in opened:
            os.close(fd)
        self._received = b""
        line = self._line(timeout=None)
        if line is None:
            raise RuntimeError("the fork server closed the connection before starting the command")
        self.pid = line
        mode = "r" if text else "rb"
        self.stdout = open(out_read, mode) if out_read is not None else None  # noqa: SIM115 - the caller's stream
        self.stderr = open(err_read, mode) if err_read is not None else None  # noqa: SIM115

    def _line(self, timeout: float | None) -> int | None:
        """The server's next number (the pid, then the exit status), None if none came within `timeout`;
        the end of the connection without one means the server died, reported as a SIGKILL."""
        while b"\n" not in self._received:
            ready = selectors.DefaultSelector()
            ready.register(self._connection, selectors.EVENT_READ)
            readable = ready.select(timeout)
            ready.close()
            if not readable:
                return None
            chunk = self._connection.recv(64)
            if not chunk:
                return -signal.SIGKILL
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return int(line)

    def poll(self) -> int | None:
        return self.wait(timeout=0, raising=False)

    def wait(self, timeout: float | None = None, raising: bool = True) -> int | None:
        if self.returncode is None:
            self.returncode = self._line(timeout)
            if self.returncode is not None:
                self._connection.close()
            elif raising:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Read the piped streams to their end and wait, as Popen does; on timeout the child runs on."""
        read: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda name=name, handle=handle: read.__setitem__(name, handle.read()), daemon=True)
            for name, handle in (("stdout", self.stdout), ("stderr", self.stderr))
            if handle is not None
        ]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for handle in (self.stdout, self.stderr):
            if handle is not None:
                handle.close()
        return read.get("stdout"), read.get("stderr")

    def __enter__(self) -> TuneProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in (self.stdout, self.stderr):
            if handle is not None:
                handle.close()
        self.wait()


_server: dict[str, str] = {}
_server_lock = threading.Lock()


def _server_path() -> str:
    """The socket of this test process's fork server, started on first use and stopped at exit."""
    with _server_lock:
        if "path" not in _server:
            folder = tempfile.mkdtemp(prefix="posfair-forkserver-")
            atexit.register(shutil.rmtree, folder, ignore_errors=True)  # after the server's stop (registered below)
            path = os.path.join(folder, "socket")
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.forkserver", path],
                cwd=Path(__file__).resolve().parent.parent,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=None,
            )
            atexit.register(process.terminate)
            deadline = time.monotonic() + 300
            while not os.path.exists(path):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the fork server did not start (exit status {process.poll()})")
                time.sleep(0.05)
            _server["path"] = path
        return _server["path"]


def is_tune(args: Sequence[str]) -> bool:
    """Whether `args` is a `tune` command that the fork server runs (`POSFAIR_TEST_FRESH_INTERPRETERS=1`: none is,
    so that every command gets a fresh interpreter, as a user's does)."""
    fresh = os.environ.get("POSFAIR_TEST_FRESH_INTERPRETERS", "") == "1"
    return not fresh and tuple(args[:3]) == TUNE_COMMAND


def popen(args: Sequence[str], **kwargs: Any) -> TuneProcess | subprocess.Popen[Any]:
    """`subprocess.Popen` for any command; `python -m tuner.cli ...` goes through the fork server."""
    if not is_tune(args):
        return subprocess.Popen(args, **kwargs)
    return TuneProcess(args, _server_path(), **kwargs)


def run(
    args: Sequence[str],
    *,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """`subprocess.run` for any command; `python -m tuner.cli ...` goes through the fork server."""
    if not is_tune(args):
        return subprocess.run(args, capture_output=capture_output, timeout=timeout, check=check, **kwargs)
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process = TuneProcess(args, _server_path(), **kwargs)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        process.kill()
        process.wait()
        raise subprocess.TimeoutExpired(process.args, expired.timeout) from None
    done = subprocess.CompletedProcess(
        process.args, process.returncode if process.returncode is not None else -1, out, err
    )
    if check:
        done.check_returncode()
    return done


if __name__ == "__main__":
    serve(sys.argv[1])  # returns in a child only, set up as `python -m tuner.cli ARGS` would be
    try:
        runpy.run_module("tuner.cli", run_name="__main__", alter_sys=True)
        status: object = 0
    except SystemExit as exit:
        status = exit.code
    _exit(status)
