"""The receiver-death ledger's files (``endpoint_runtime.runtime.actors.crash_ledger``), without Ray
or a database: when a dead receiver's file may be removed, and names planted in the shared
directory (issue 26)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from endpoint_runtime.runtime.actors.crash_ledger import (
    LEDGER_PREFIX,
    MAX_RECEIVER_DEATHS,
    RECORD_SIZE,
    STALE_SECONDS,
    TALLY_STALE_SECONDS,
    CrashLedger,
    DeathCounts,
    DeathTally,
    NotALedgerError,
    read_ledger,
    remove_stale_ledgers,
)

DEAD_PID = 2**22 + 1
"""Above any pid_max: no process has it."""


def _dead_ledger(directory: Path, name: str, *in_flight: uuid.UUID) -> Path:
    """The file a receiver killed with ``in_flight`` in its handlers leaves behind."""
    ledger = CrashLedger(directory / f"{LEDGER_PREFIX}{name}.ledger", records=4)
    for native_id in in_flight:
        ledger.enter(native_id)
    ledger._map[8:RECORD_SIZE] = DEAD_PID.to_bytes(8, "little")
    ledger._map.close()  # the process is gone; its file stays
    return ledger.path


def test_a_receiver_starting_before_the_peekers_read_leaves_an_old_dead_ledger_alone(
    tmp_path: Path,
) -> None:
    """A receiver that ran for an hour dies with a message in its handlers; another receiver
    starts on the node (its janitor runs) before the peeker reads the file. The file's mtime
    is its creation time (writes through the memory map do not move it on tmpfs): judged by
    it, the record was removed and the death never counted."""
    culprit = uuid.uuid4()
    path = _dead_ledger(tmp_path, "sales-0001", culprit)
    created = time.time() - 3600
    os.utime(path, (created, created))

    assert remove_stale_ledgers(directory=tmp_path) == 0  # the starting receiver's janitor
    assert read_ledger(str(path)) == [culprit]  # the peeker's read, a cycle later


def test_a_dead_ledger_goes_stale_seconds_after_it_was_first_found_dead(
    tmp_path: Path,
) -> None:
    dead = _dead_ledger(tmp_path, "sales-0002", uuid.uuid4())
    live = CrashLedger(tmp_path / f"{LEDGER_PREFIX}live.ledger", records=1)
    try:
        found = time.time()
        assert remove_stale_ledgers(now=found, directory=tmp_path) == 0  # found dead: stamped
        assert remove_stale_ledgers(now=found + STALE_SECONDS - 1, directory=tmp_path) == 0
        assert dead.exists()
        much_later = found + 100 * STALE_SECONDS
        assert remove_stale_ledgers(now=much_later, directory=tmp_path) == 1
        assert not dead.exists()
        assert live.path.exists()  # its process (this one) lives, however old the file
    finally:
        live.close()


def test_a_planted_symlink_is_neither_followed_nor_truncated_nor_read(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * 8)
    planted = tmp_path / f"{LEDGER_PREFIX}sales-0003.ledger"
    planted.symlink_to(victim)

    with pytest.raises(FileExistsError):
        CrashLedger(planted, records=2)
    with pytest.raises(NotALedgerError):
        read_ledger(str(planted))
    assert remove_stale_ledgers(now=time.time() + 100 * STALE_SECONDS,
                                directory=tmp_path) == 0
    assert victim.read_bytes() == b"precious" * 8
    assert planted.is_symlink()


def test_a_file_already_at_the_name_is_not_taken_over(tmp_path: Path) -> None:
    """O_EXCL: a leftover or planted regular file is refused (the receiver's start fails and
    the peeker launches another, with a new id), not truncated and reused."""
    existing = tmp_path / f"{LEDGER_PREFIX}sales-0004.ledger"
    existing.write_bytes(b"x" * 48)
    with pytest.raises(FileExistsError):
        CrashLedger(existing, records=2)
    assert existing.read_bytes() == b"x" * 48


def test_a_file_that_is_not_a_ledger_is_refused_and_left(tmp_path: Path) -> None:
    other = tmp_path / f"{LEDGER_PREFIX}sales-0005.ledger"
    other.write_bytes(os.urandom(64))
    with pytest.raises(NotALedgerError):
        read_ledger(str(other))
    assert other.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_ledger_is_neither_read_nor_removed(tmp_path: Path) -> None:
    path = _dead_ledger(tmp_path, "sales-0006", uuid.uuid4())
    os.chown(path, 65534, 65534)  # nobody
    with pytest.raises(NotALedgerError):
        read_ledger(str(path))
    now = time.time()
    remove_stale_ledgers(now=now, directory=tmp_path)
    assert remove_stale_ledgers(now=now + 100 * STALE_SECONDS, directory=tmp_path) == 0
    assert path.exists()


def test_a_death_tally_brings_the_counts_to_the_next_peeker(tmp_path: Path) -> None:
    tally = DeathTally.of("postgresql://h/db", '"public"."sales"', directory=tmp_path)
    assert tally.load().snapshot() == {}  # nothing saved yet
    twice, doomed = uuid.uuid4(), uuid.uuid4()
    counts = DeathCounts()
    counts.count(twice, "r1")
    counts.count(twice, "r2")
    for n in range(MAX_RECEIVER_DEATHS):
        counts.count(doomed, f"r{n}")
    tally.save(counts)

    restored = tally.load()  # the next peeker
    assert restored.snapshot() == counts.snapshot()
    assert restored.version > 0  # its receivers get the doomed ids
    assert restored.count(twice, "r3") == MAX_RECEIVER_DEATHS
    # Another endpoint, or the same in another database, has a tally of its own.
    assert DeathTally.of("postgresql://h/other", '"public"."sales"',
                         directory=tmp_path).path != tally.path

    restored.settle([twice, doomed])
    tally.save(restored)
    assert not tally.path.exists()  # nothing left to keep


def test_a_death_tally_writes_no_symlink_target_and_reads_none(tmp_path: Path) -> None:
    tally = DeathTally.of("postgresql://h/db", '"public"."sales"', directory=tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    tally.path.symlink_to(victim)
    assert tally.load().snapshot() == {}  # not followed
    counts = DeathCounts()
    counts.count(uuid.uuid4(), "r1")
    tally.save(counts)  # replaces the link itself
    assert victim.read_bytes() == b"precious"
    assert not tally.path.is_symlink()
    assert len(tally.load().saved().deaths) == 1


def test_a_tally_nobody_wrote_for_a_day_is_removed(tmp_path: Path) -> None:
    tally = DeathTally.of("postgresql://h/db", '"public"."sales"', directory=tmp_path)
    counts = DeathCounts()
    counts.count(uuid.uuid4(), "r1")
    tally.save(counts)
    assert remove_stale_ledgers(directory=tmp_path) == 0
    assert remove_stale_ledgers(now=time.time() + TALLY_STALE_SECONDS + 1,
                                directory=tmp_path) == 1
    assert not tally.path.exists()
