"""Where the embedded server lives: one directory per user, whatever the current directory.

Pure rules (:func:`locate_data_dir`) for a user, root and the overrides, and
:func:`closed_directory_above`, the check that keeps root's server out of a closed home.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from endpoint_runtime.connections.embedded import (
    ROOT_DATA_DIR,
    _warn_of_opened_directories,
    closed_directory_above,
    data_dir,
    locate_data_dir,
)

HOME = Path("/home/ada")


def test_a_user_gets_a_directory_in_their_home() -> None:
    assert locate_data_dir({}, uid=1000, home=HOME) == HOME / ".local/share/endpoint-runtime"


def test_root_gets_a_directory_outside_its_home_that_the_server_user_can_enter() -> None:
    located = locate_data_dir({"HOME": "/root"}, uid=0, home=Path("/root"))

    assert located == ROOT_DATA_DIR == Path("/var/lib/endpoint-runtime")
    assert Path("/root") not in located.parents


@pytest.mark.parametrize("uid", [0, 1000])
def test_xdg_data_home_is_followed_when_absolute(uid: int) -> None:
    environ = {"XDG_DATA_HOME": "/srv/data"}

    assert locate_data_dir(environ, uid=uid, home=HOME) == Path("/srv/data/endpoint-runtime")


def test_a_relative_xdg_data_home_is_ignored_as_the_specification_says() -> None:
    environ = {"XDG_DATA_HOME": "relative/data"}

    assert locate_data_dir(environ, uid=1000, home=HOME) == HOME / ".local/share/endpoint-runtime"
    assert locate_data_dir(environ, uid=0, home=Path("/root")) == ROOT_DATA_DIR


@pytest.mark.parametrize("uid", [0, 1000])
def test_endpoint_runtime_data_dir_wins_over_every_default(uid: int) -> None:
    environ = {"ENDPOINT_RUNTIME_DATA_DIR": "/opt/er", "XDG_DATA_HOME": "/srv/data"}

    assert locate_data_dir(environ, uid=uid, home=HOME) == Path("/opt/er")


def test_every_directory_gets_the_same_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The issue: each directory a command ran in had its own ./.endpoint_runtime server."""
    monkeypatch.delenv("ENDPOINT_RUNTIME_DATA_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    seen = set()
    for name in ("app", "elsewhere"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        seen.add(data_dir())

    assert len(seen) == 1
    expected = ROOT_DATA_DIR if os.geteuid() == 0 else (
        tmp_path / "home/.local/share/endpoint-runtime").resolve()
    assert seen == {expected}


def test_a_relative_override_is_taken_from_the_current_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ENDPOINT_RUNTIME_DATA_DIR", "here")
    monkeypatch.chdir(tmp_path)

    assert data_dir() == tmp_path.resolve() / "here"


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory in /tmp that others may enter (pytest's own tmp_path sits below a 0700
    directory, which is what the check looks for)."""
    directory = Path(tempfile.mkdtemp(prefix="er-data-dir-", dir="/tmp"))
    directory.chmod(0o755)
    yield directory
    for path in (directory, *directory.rglob("*")):
        if path.is_dir():
            path.chmod(0o755)
    shutil.rmtree(directory)


def test_a_closed_directory_above_is_found(open_tmp: Path) -> None:
    closed = open_tmp / "closed"
    inner = closed / "inner"
    inner.mkdir(parents=True)
    closed.chmod(0o700)

    assert closed_directory_above(inner / "pgdata") == closed
    closed.chmod(0o711)  # enterable, not listable: enough to reach pgdata
    assert closed_directory_above(inner / "pgdata") is None


def test_directories_not_made_yet_are_not_counted_as_closed(open_tmp: Path) -> None:
    assert closed_directory_above(open_tmp / "not" / "yet" / "pgdata") is None
    open_tmp.chmod(0o700)
    assert closed_directory_above(open_tmp / "not" / "yet" / "pgdata") == open_tmp


def test_root_is_warned_before_the_wheel_opens_a_closed_directory(open_tmp: Path) -> None:
    closed = open_tmp / "home"
    (closed / "app").mkdir(parents=True)
    closed.chmod(0o700)
    installation = open_tmp / "venv" / "pginstall"

    with capture_logs() as logs:
        _warn_of_opened_directories(closed / "app" / "pgdata", installation)

    assert [(log["event"], log["directory"]) for log in logs] == [
        ("embedded_postgres_opens_directory", str(closed))]
    assert "data directory" in logs[0]["reason"]
