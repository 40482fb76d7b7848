"""Two commands of one user, from two directories, reach one embedded server.

Before: each command started a server in ``./.endpoint_runtime/pgdata`` of the directory it
ran in, so a user's own app directory silently got a second, empty database. Through the
``endpoint-runtime`` command as a person runs it (a home of its own, none of the suite's
variables), against the default per-user data directory.
"""

from __future__ import annotations

import subprocess

from tests.support.user_home import COMMAND, UserHome

STARTED = "started the embedded PostgreSQL in"


def test_commands_in_two_directories_reach_the_same_embedded_server() -> None:
    with UserHome.create() as user:
        app, elsewhere = user.directory("app"), user.directory("elsewhere")

        first = user.command(app, "db", "url")
        second = user.command(elsewhere, "db", "url")
        created = user.command(app, "db", "psql", "--", "-v", "ON_ERROR_STOP=1", "-c",
                               "CREATE TABLE left_by_app (answer int); "
                               "INSERT INTO left_by_app VALUES (42)")
        seen = user.command(elsewhere, "db", "psql", "--", "-v", "ON_ERROR_STOP=1", "-tA",
                            "-c", "SELECT answer FROM left_by_app")

        for outcome in (first, second, created, seen):
            assert outcome.returncode == 0, outcome.stderr
        assert first.stdout == second.stdout
        assert f"{user.data_dir / 'pgdata'}" in first.stdout  # the socket is in pgdata
        assert seen.stdout.strip() == "42"
        assert (user.data_dir / "pgdata" / "PG_VERSION").is_file()
        assert not (app / ".endpoint_runtime").exists()
        assert not (elsewhere / ".endpoint_runtime").exists()
        # The command that started the server says so, once; the others, which reuse it, not.
        assert first.stderr.count(STARTED) == 1, first.stderr
        assert f"{STARTED} {user.data_dir / 'pgdata'}" in first.stderr
        for later in (second, created, seen):
            assert STARTED not in later.stderr, later.stderr
        for outcome in (first, second, created, seen):
            assert "XDG_RUNTIME_DIR" not in outcome.stderr, outcome.stderr


def test_commands_starting_the_server_at_once_all_reach_it() -> None:
    """`run` and `ingest` started together on a fresh data directory: before, one command
    could connect while another restarted the new server to raise max_connections, and
    fail."""
    with UserHome.create() as user:
        directories = [user.directory(f"terminal-{n}") for n in range(4)]
        processes = [
            subprocess.Popen([str(COMMAND), "db", "url"], cwd=cwd, env=user.env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for cwd in directories
        ]
        outcomes = [(process.wait(timeout=180), *process.communicate()) for process in processes]

        assert [code for code, _, _ in outcomes] == [0] * 4, outcomes
        assert len({out for _, out, _ in outcomes}) == 1, outcomes
        assert sum(err.count(STARTED) for _, _, err in outcomes) == 1, outcomes
