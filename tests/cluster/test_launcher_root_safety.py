"""``tests/cluster/launcher.sh setup`` runs as root: paths another local user could make first
are refused, before anything is changed.

A throwaway unprivileged user makes, ahead of the launcher, each path whose name it can know:
Ray's SSH control directory of the cluster user or of root (fixed names in /tmp), as a
directory of its own or as a symbolic link, and a state directory named by a stale record.
Each time setup must exit non-zero with a message naming the path, and leave the machine as
it was: no cluster user, no record, no state directory, no SSH key, no sshd, the planted
path untouched. Runs as root only (it makes a user); needs no sshd, Ray or database.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "tests" / "cluster" / "launcher.sh"
CLUSTER_USER = "ercluster"


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: it makes a throwaway user and runs launcher.sh setup as root"
    if not shutil.which("useradd") or not shutil.which("runuser"):
        return "no useradd/runuser to make the throwaway user"
    if not shutil.which("apt-get") or not (ROOT / ".venv" / "bin" / "ray").exists():
        return "launcher.sh cannot run here (no apt-get or no .venv): nothing to refuse"
    if subprocess.run(["id", CLUSTER_USER], capture_output=True).returncode == 0:
        return f"user {CLUSTER_USER} exists: a launcher cluster is set up on this machine"
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def ssh_control_dir(user: str) -> Path:
    """Ray's fixed SSH control directory of ``user`` (command_runner.py)."""
    return Path(f"/tmp/ray_ssh_{hashlib.sha256(user.encode()).hexdigest()[:10]}")


@pytest.fixture
def intruder() -> Iterator[str]:
    """A throwaway unprivileged user, removed afterwards."""
    name = f"erintr{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=True)


@pytest.fixture
def record(tmp_path: Path) -> Path:
    """Where this test's launcher keeps the path of its state directory (instead of /run)."""
    tmp_path.chmod(0o700)
    return tmp_path / "record"


def as_user(user: str, *command: str) -> None:
    subprocess.run(["runuser", "-u", user, "--", *command], check=True, cwd="/")


def remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def machine(record: Path) -> dict[str, object]:
    """What setup would change first."""
    home = Path(os.path.expanduser("~root"))
    return {
        "cluster user": subprocess.run(["id", CLUSTER_USER], capture_output=True).returncode,
        "record": record.exists(),
        "state directories": sorted(p.name for p in Path("/tmp").glob("er-launcher.*")),
        "ssh key": (home / ".ssh" / "endpoint_runtime_cluster").exists(),
        "settings directory": (home / ".config" / "endpoint-runtime-cluster").exists(),
        "launcher sshd": subprocess.run(["pgrep", "-f", "sshd -f /tmp/er-launcher"],
                                        capture_output=True).returncode,
    }


def snapshot(path: Path) -> tuple[object, ...]:
    info = path.lstat()
    target = os.readlink(path) if path.is_symlink() else None
    return info.st_uid, info.st_mode, target, sorted(os.listdir(path)) if path.is_dir() else None


def setup_refuses(record: Path, planted: Path) -> None:
    before, planted_before = machine(record), snapshot(planted)
    environ = {k: v for k, v in os.environ.items() if k != "SUDO_USER"}
    result = subprocess.run([str(LAUNCHER), "setup"], capture_output=True, text=True,
                            timeout=60, env={**environ, "LAUNCHER_RECORD": str(record)})
    try:
        assert result.returncode != 0, result.stderr
        assert "refusing" in result.stderr, result.stderr
        assert str(planted) in result.stderr, result.stderr
        assert machine(record) == before
        assert snapshot(planted) == planted_before
    finally:
        if result.returncode == 0:  # it went ahead: undo what it made
            subprocess.run([str(LAUNCHER), "teardown", "--purge"], timeout=120,
                           env={**environ, "LAUNCHER_RECORD": str(record)})


@pytest.mark.parametrize("kind", ["directory", "symlink"])
@pytest.mark.parametrize("owner", [CLUSTER_USER, "root"])
def test_a_control_directory_made_first_by_another_user_is_refused(
        intruder: str, record: Path, kind: str, owner: str) -> None:
    planted = ssh_control_dir(owner)
    if planted.exists() or planted.is_symlink():
        pytest.skip(f"{planted} exists already (Ray's launcher ran as {owner} here)")
    own = Path(f"/tmp/{intruder}-dir")
    as_user(intruder, "mkdir", "-m", "777", str(own))
    try:
        if kind == "directory":
            as_user(intruder, "mkdir", "-m", "777", str(planted))
        else:
            as_user(intruder, "ln", "-s", str(own), str(planted))
        setup_refuses(record, planted)
    finally:
        remove(planted)
        remove(own)


def test_a_stale_state_directory_made_by_another_user_is_refused(
        intruder: str, record: Path) -> None:
    # The record outlived its directory (a cleaned /tmp); another user made one of that name.
    planted = Path(f"/tmp/er-launcher.{uuid.uuid4().hex[:8]}")
    record.write_text(f"{planted}\n")
    as_user(intruder, "mkdir", "-m", "700", str(planted))
    try:
        setup_refuses(record, planted)
    finally:
        remove(planted)


def test_the_launcher_shares_nothing_writable() -> None:
    """What made the attacks possible stays out: files made world-writable, sshd trusting
    files anyone could replace, a fixed state directory in /tmp."""
    text = LAUNCHER.read_text()
    assert "chmod 666" not in text
    assert "StrictModes yes" in text
    assert "StrictModes no" not in text
    assert "STATE=/tmp" not in text
