"""Running the tests against a copy of the checkout: the copy, its environment, pytest, clean-up.

Each run gets a directory of its own under the system's temporary directory::

    er-mut-XXXXXXXX/        the run's root (0755: the embedded server's user must enter it)
        src/                the copy: the working tree's tracked and untracked, not ignored
                            files (never .git, .venv, .endpoint_runtime), one defect planted
        src/.endpoint_runtime/   its own embedded PostgreSQL (tests/conftest.py puts it there)
        ray/                RAY_TMPDIR: its own Ray sessions, never another local cluster's
        pytest/             --basetemp: its own tmp_path directories

The copy is really the code under test: pytest runs with the checkout's interpreter, with
``cwd`` the copy and ``PYTHONPATH`` the copy alone, which comes before the editable install's
finder (that one points at the checkout); Ray's workers get the driver's ``sys.path`` and every
command a test starts inherits the environment. :func:`verify_imports` checks it before each
run. Afterwards the copy's server is stopped (``endpoint-runtime db stop``), any process still
naming the run's root is ended (by its pid), and the root is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.mutations.core import Defect, plant_in_memory
from tests.mutations.plugin import FAILED_MARK

REPO_ROOT = Path(__file__).resolve().parents[2]

SUITE_ORDER = ("tests/unit", "tests/integration", "tests/e2e", "tests/fuzz", "tests/console",
               "tests/cluster", "tests/analytics", "tests/chaos")
"""The suite's folders, cheapest first: with ``-x`` a caught defect stops the run early."""

PYTEST_OPTIONS = ("-p", "no:randomly", "-q")
"""Always: the files' own order, pytest's short summary (its ``FAILED`` lines are parsed)."""

EXCLUDED = (".git", ".venv", ".endpoint_runtime")
"""Top-level directories never copied (the checkout's repository, interpreter and server)."""

REDIRECTING_VARIABLES = ("ENDPOINT_RUNTIME_DSN", "RAY_ADDRESS", "PGHOST", "PGPORT",
                         "PGDATABASE", "PGUSER", "PGPASSWORD", "PGSERVICE", "PYTHONHOME")
"""Variables that would send the copy's tests to another server, Ray cluster or Python:
removed from the runs' environment, so each copy uses its own embedded server and Ray."""

PLANTED_VARIABLE = "ENDPOINT_RUNTIME_MUTATION"
"""Set to the planted defect's name in a mutated copy's runs (unset in a control run):
``tests/unit/test_mutations.py`` skips its check that every defect plants in the checkout,
which fails by design where one is planted and would otherwise "catch" every defect."""

STOP_GRACE_SECONDS = 15.0

PLUGIN = ("-p", "tests.mutations.plugin")
"""The tests in the command line's order; each failed test said at once (see
:mod:`tests.mutations.plugin`)."""

SERIAL = ("-n", "0")
"""With pytest-xdist installed: one process, whatever the configuration asks (the order is
the run's, and ``-x`` stops at once)."""


class SetupError(Exception):
    """The copy cannot be made, or would not be the code under test: the run is refused."""


@dataclass(frozen=True)
class Workspace:
    """One run's directories (see the module docstring)."""

    root: Path

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def ray_tmp(self) -> Path:
        return self.root / "ray"

    @property
    def basetemp(self) -> Path:
        return self.root / "pytest"

    @property
    def data_dir(self) -> Path:
        return self.src / ".endpoint_runtime"


@dataclass(frozen=True)
class PytestRun:
    """What one pytest run did: its exit status (negative: killed by that signal), its
    combined output, how long it took, whether the run's own timeout ended it, and whether
    it was interrupted because it did not end after a test failed (see :func:`run_pytest`)."""

    exit_status: int
    output: str
    seconds: float
    timed_out: bool = False
    interrupted_after_failure: bool = False


def checkout_files(source: Path) -> list[str]:
    """The working tree's files to copy: tracked ones as they are now (edits included, files
    deleted from the working tree left out) and untracked ones git does not ignore (new test
    files not committed yet), never under :data:`EXCLUDED`.

    Raises:
        SetupError: ``source`` is not a git working tree.
    """
    try:
        listed = subprocess.run(
            ["git", "-C", str(source), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"],
            check=True, capture_output=True,
        ).stdout.decode("utf-8", "surrogateescape")
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SetupError(f"cannot list the files of {source} with git: {exc}") from exc
    files = []
    for path in dict.fromkeys(listed.split("\0")):
        if not path or path.split("/", 1)[0] in EXCLUDED:
            continue
        if (source / path).is_file() or (source / path).is_symlink():
            files.append(path)
    return files


def make_workspace(source: Path, base: Path | None = None) -> Workspace:
    """A fresh run directory with the copy of ``source`` in it."""
    root = Path(tempfile.mkdtemp(prefix="er-mut-", dir=base))
    root.chmod(0o755)  # as root, the embedded server runs as its own user: it must enter
    workspace = Workspace(root)
    try:
        for path in checkout_files(source):
            target = workspace.src / path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / path, target, follow_symlinks=False)
        workspace.src.chmod(0o755)
        workspace.ray_tmp.mkdir()
    except BaseException:
        remove_workspace(workspace)
        raise
    return workspace


def plant(copy: Path, defect: Defect) -> None:
    """Write ``defect`` into the copy at ``copy``: every edit checked first, then the files
    written byte for byte (no newline translation).

    Raises:
        DefectNotApplicable: an edit's old text is not in its file exactly once.
    """
    contents = plant_in_memory(defect, lambda path: _read_exact(copy / path))
    for path, text in contents.items():
        (copy / path).write_bytes(text.encode("utf-8"))


def _read_exact(path: Path) -> str:
    return path.read_bytes().decode("utf-8")


def child_environment(workspace: Workspace, planted: str | None) -> dict[str, str]:
    """The environment of pytest and, through it, of every command and Ray worker it starts."""
    env = {name: value for name, value in os.environ.items()
           if name not in REDIRECTING_VARIABLES}
    env["PYTHONPATH"] = str(workspace.src)
    env["ENDPOINT_RUNTIME_DATA_DIR"] = str(workspace.data_dir)
    env["RAY_TMPDIR"] = str(workspace.ray_tmp)
    env.pop(PLANTED_VARIABLE, None)
    if planted is not None:
        env[PLANTED_VARIABLE] = planted
    return env


IMPORT_CHECK = ("import importlib.util, endpoint_runtime, tests; "
                "print(endpoint_runtime.__file__); print(tests.__file__); "
                "print(importlib.util.find_spec('xdist') is not None)")


@dataclass(frozen=True)
class Imports:
    """What the runs' interpreter imports: the package's and the tests' files, and whether
    pytest-xdist is installed."""

    package: str
    tests: str
    xdist: bool


def verify_imports(python: Path, workspace: Workspace, env: dict[str, str]) -> Imports:
    """Where ``endpoint_runtime`` and ``tests`` import from with the runs' environment: both
    must be in the copy (the editable install points at the checkout).

    Raises:
        SetupError: either imports from elsewhere, or the interpreter fails.
    """
    done = subprocess.run([str(python), "-c", IMPORT_CHECK], cwd=workspace.src, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    lines = done.stdout.split()
    copy = workspace.src.resolve()
    if done.returncode != 0 or len(lines) != 3 or not all(
            Path(f).resolve().is_relative_to(copy) for f in lines[:2]):
        raise SetupError(f"the copy is not what imports (expected files under {copy}): "
                         f"{done.stdout.strip()} {done.stderr.strip()[-2000:]}")
    return Imports(lines[0], lines[1], lines[2] == "True")


def suite_targets(copy: Path) -> list[str]:
    """:data:`SUITE_ORDER`'s folders that exist, then any other folder of ``tests`` that holds
    test files (a new one is not left out of the suite)."""
    targets = [folder for folder in SUITE_ORDER if (copy / folder).is_dir()]
    tests = copy / "tests"
    others = sorted(
        f"tests/{entry.name}" for entry in tests.iterdir()
        if entry.is_dir() and f"tests/{entry.name}" not in SUITE_ORDER
        and any(entry.rglob("test_*.py"))) if tests.is_dir() else []
    return targets + others


def pytest_command(python: Path, targets: Sequence[str], *, stop_first: bool,
                   deselect: Sequence[str], basetemp: Path, xdist: bool = False) -> list[str]:
    """The pytest command line of a run (``xdist``: pytest-xdist is installed)."""
    command = [str(python), "-m", "pytest", *(["-x"] if stop_first else []), *PYTEST_OPTIONS,
               *PLUGIN, *(SERIAL if xdist else ()), f"--basetemp={basetemp}"]
    for node_id in deselect:
        command.append(f"--deselect={node_id}")
    return [*command, *targets]


def run_pytest(command: Sequence[str], *, cwd: Path, env: dict[str, str], timeout: float,
               echo: bool, hang_seconds: float | None) -> PytestRun:
    """Run ``command`` in a session of its own (so that a timeout or Ctrl-C can end it with
    everything it started), its output collected (and echoed to stderr with ``echo``).

    With ``hang_seconds`` (runs with ``-x``), a run still going that long after a test failed
    is interrupted (SIGINT, as Ctrl-C would): a test cut short by pytest-timeout can leave its
    fixtures' tear-down waiting forever (a pool that waits for the connection the test still
    holds), and the interrupt lets pytest end and report the failure it has recorded."""
    started = time.monotonic()
    lines: list[str] = []
    watch = FailureWatch()
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True,
    )

    def collect() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            watch.saw(line)
            if echo:
                sys.stderr.write(line)
                sys.stderr.flush()

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    timed_out = interrupted = False
    try:
        while process.poll() is None:
            now = time.monotonic()
            if now - started > timeout:
                timed_out = True
                _end_session(process)
                break
            if (not interrupted and hang_seconds is not None
                    and watch.hung(now, hang_seconds)):
                interrupted = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGINT)
                try:
                    process.wait(timeout=STOP_GRACE_SECONDS * 4)
                except subprocess.TimeoutExpired:
                    _end_session(process)
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1.0)
    except BaseException:  # Ctrl-C: end the run and what it started, then stop
        _end_session(process)
        raise
    reader.join(timeout=30)
    return PytestRun(process.returncode, "".join(lines), time.monotonic() - started,
                     timed_out, interrupted)


class FailureWatch:
    """When the run's first failed test was said (:mod:`tests.mutations.plugin`)."""

    def __init__(self) -> None:
        self.first_failure: float | None = None

    def saw(self, line: str, now: float | None = None) -> None:
        # Anywhere in the line: pytest's progress letters ("..F") come before it on its line.
        if self.first_failure is None and FAILED_MARK in line:
            self.first_failure = time.monotonic() if now is None else now

    def hung(self, now: float, seconds: float) -> bool:
        return self.first_failure is not None and now - self.first_failure > seconds


def _end_session(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the run's process group (pytest and what it started), SIGKILL after a grace
    period: the group is the run's own (``start_new_session``)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=STOP_GRACE_SECONDS)
            return
        except subprocess.TimeoutExpired:
            continue


def stop_database(python: Path, workspace: Workspace, env: dict[str, str]) -> str | None:
    """Stop the copy's embedded server if it runs; a message when that failed."""
    if not (workspace.data_dir / "pgdata" / "postmaster.pid").exists():
        return None
    command = [str(python.with_name("endpoint-runtime")), "db", "stop"]
    try:
        done = subprocess.run(command, cwd=workspace.src, env=env, capture_output=True,
                              text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"endpoint-runtime db stop: {exc}"
    if done.returncode != 0:
        return f"endpoint-runtime db stop: exit {done.returncode}: {done.stderr.strip()[-500:]}"
    return None


def leftover_processes(workspace: Workspace) -> Iterator[int]:
    """Pids of processes (not this one) whose command line names the run's root: Ray's
    daemons and a server ``db stop`` could not stop. Only the run can have started them."""
    import psutil  # a dependency of the project; imported late: only clean-up needs it

    marker = str(workspace.root)
    for process in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            cmdline = process.info["cmdline"] or []
            if process.info["pid"] != os.getpid() and any(marker in part for part in cmdline):
                yield process.info["pid"]


def end_leftovers(workspace: Workspace) -> list[int]:
    """SIGKILL each leftover process by its pid; the pids ended."""
    ended = []
    for pid in list(leftover_processes(workspace)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
    return ended


def remove_workspace(workspace: Workspace) -> None:
    shutil.rmtree(workspace.root, ignore_errors=True)


def default_python(source: Path) -> Path:
    """The checkout's interpreter: the one the project is installed in."""
    return source / ".venv" / "bin" / "python"
