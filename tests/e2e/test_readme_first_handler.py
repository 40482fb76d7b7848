"""The README's "A first handler", followed literally by a new user.

The code and the commands are read from README.md itself, so this breaks when the README and
the runtime disagree. In a temporary directory outside the checkout, with a home of its own
(the per-user embedded server, never the real user's; ``tests/support/user_home.py``) and none
of the suite's variables, it writes the README's module where its first line says, runs the
commands of its command block in order (``run`` and ``ingest``, whichever it names, in the
background, as "until Ctrl-C" in terminals of their own; each other command must succeed),
waits for the endpoint's queue, sees the row the handler wrote from a second directory's
command (``db psql``: the same embedded server), then presses Ctrl-C (SIGINT to each
background command's process group, as a terminal does): each must exit within 8 s and leave
none of the processes it started (its Ray) running 3 s after it exited. No command prints an
``XDG_RUNTIME_DIR`` warning or Ray's start-up notices; the first command says once that it
started the embedded server.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from pathlib import Path

import pytest

from tests.support.readme import first_handler_section, readme_commands, readme_module
from tests.support.user_home import Started, UserHome, family, kill, still_running

BACKGROUND = {"run", "ingest"}  # "until Ctrl-C": a terminal of their own each
EXIT_WITHIN = 8.0  # as tests/e2e/test_run_command.py: ~1 s quiet, 16.5 s before the fix
LEFTOVERS_WITHIN = 3.0
READY_WITHIN = 240.0
ROW_WITHIN = 120.0
STARTED = "started the embedded PostgreSQL in"
# What a person should not have to read: warnings about their environment, Ray's start-up talk.
NOISE = ("XDG_RUNTIME_DIR", "Started a local Ray instance", "SIGTERM handler",
         "token authentication", "RuntimeDirWarning")


def test_following_the_readme_first_handler_literally() -> None:
    section = first_handler_section()
    module_path, code = readme_module(section)
    commands = readme_commands(section)
    (send,) = [argv for argv in commands if argv[1] == "send"]
    queue = send[2]
    payload = json.loads(send[send.index("--json") + 1])
    table = re.search(r"CREATE TABLE IF NOT EXISTS (\w+)", code)
    assert table is not None, "the README's handler no longer creates its table"

    with UserHome.create() as user:
        app, elsewhere = user.directory("app"), user.directory("elsewhere")
        (app / module_path).parent.mkdir(parents=True, exist_ok=True)
        (app / module_path).write_text(code, encoding="utf-8")
        background: list[Started] = []
        try:
            for argv in commands:
                if argv[1] in BACKGROUND:
                    background.append(user.start(app, *argv[1:]))
                    continue
                if argv is send:
                    _wait_for_queue(user, elsewhere, queue, background)
                if argv[1] == "status":
                    _wait_for_row(user, elsewhere, table[1], payload)
                done = user.command(app, *argv[1:])
                assert done.returncode == 0, f"{shlex.join(argv)}:\n{done.stdout}{done.stderr}"
                if argv[1] == "status":
                    assert queue in done.stdout
            _wait_for_row(user, elsewhere, table[1], payload)

            for started in background:
                _ctrl_c(started)
        finally:
            for started in background:
                kill(family(started.process.pid) | started.family)
        # Every command's, the waits' queues list and db psql included.
        outputs = user.outputs + [started.text() for started in background]
        assert not (app / ".endpoint_runtime").exists()
        assert not (elsewhere / ".endpoint_runtime").exists()
        assert (user.data_dir / "pgdata" / "PG_VERSION").is_file()

    everything = "\n".join(outputs)
    assert everything.count(STARTED) == 1, everything
    for noise in NOISE:
        assert noise not in everything, f"{noise!r} in the commands' output:\n{everything}"


def _wait_for_queue(user: UserHome, cwd: Path, queue: str, background: list[Started]) -> None:
    """As a user waits for `run` to say it started: until the endpoint's queue exists."""
    deadline = time.monotonic() + READY_WITHIN
    while True:
        for started in background:
            assert started.process.poll() is None, f"{started.args} ended:\n{started.text()}"
            started.family |= family(started.process.pid)
        listed = user.command(cwd, "queues", "list")
        if listed.returncode == 0 and re.search(rf"\b{re.escape(queue)}\b", listed.stdout):
            return
        assert time.monotonic() < deadline, f"no queue {queue} within {READY_WITHIN} s: " \
            + "\n".join(started.text() for started in background)
        time.sleep(1)


def _wait_for_row(user: UserHome, cwd: Path, table: str, payload: dict[str, object]) -> None:
    """From another directory, through `db psql`: the handler's row, with the sent values."""
    columns = ", ".join(payload)
    key, value = next(iter(payload.items()))
    query = f"SELECT json_build_object({', '.join(f'{c!r}, {c}' for c in payload)}) " \
            f"FROM {table} WHERE {key} = '{value}'"
    deadline = time.monotonic() + ROW_WITHIN
    while True:
        seen = user.command(cwd, "db", "psql", "--", "-v", "ON_ERROR_STOP=1", "-tA", "-c", query)
        if seen.returncode == 0 and seen.stdout.strip():
            assert json.loads(seen.stdout) == payload, (columns, seen.stdout)
            return
        assert time.monotonic() < deadline, f"no row in {table}: {seen.stdout}{seen.stderr}"
        time.sleep(1)


def _ctrl_c(started: Started) -> None:
    """SIGINT to the command's process group, as a terminal's Ctrl-C: it exits within 8 s and
    what it started is gone 3 s later."""
    if started.process.poll() is not None:
        pytest.fail(f"{started.args} ended before Ctrl-C:\n{started.text()}")
    members = started.family = family(started.process.pid)
    pressed = time.monotonic()
    os.killpg(started.process.pid, signal.SIGINT)
    try:
        started.process.wait(timeout=60)
    finally:
        took = time.monotonic() - pressed
    assert took <= EXIT_WITHIN, f"{started.args} took {took:.1f} s to exit after SIGINT:\n" \
        + started.text()[-3000:]
    print(f"{shlex.join(started.args)}: exited {took:.2f} s after SIGINT")  # shown by -rP
    deadline = time.monotonic() + LEFTOVERS_WITHIN
    while still_running(members) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert still_running(members) == [], f"{started.args} left processes running"
