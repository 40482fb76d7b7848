"""Crash ledger: which messages a receiver process was handling when it died.

A message that kills its receiver (a native crash, an out-of-memory kill, ``os._exit`` in a
handler) takes the in-memory failure count with it, so recoverability alone would hand it to
every replacement for ever. Each receiver therefore keeps the native ids of the messages whose
handlers are running in a small node-local memory-mapped file, one 16-byte record per slot
after a header with the owner's pid: a plain memory write when the handlers start and another
when they end, no system call, no database round trip and no Ray call per message. The file
is in shared memory (``/dev/shm``, else the temporary directory) and outlives the process.

When the peeker sees a receiver die, it reads the file (directly on its own node, else with a
Ray task pinned to the dead receiver's node) and counts a death for each id
(:class:`DeathCounts`, a bounded map). At :data:`MAX_RECEIVER_DEATHS` deaths the id and the
reason are handed to the receivers with the control calls they get anyway (``start``, and the
``status`` call of each peek cycle); their pipeline records the message as an unrecoverable
failure (:class:`ReceiverDiedError`), so its next delivery goes to the error queue, with the
usual ``NServiceBus.ExceptionInfo.*`` headers, like any other failure.

The files are created with ``O_EXCL | O_NOFOLLOW`` (mode 0600) and read with ``O_NOFOLLOW``,
only when they are regular files of this user with the ledger's magic: a name planted in the
shared directory (a symlink to another file, a file of another user) is refused, never
truncated, read or removed. A ledger whose owner process is gone is removed only
:data:`STALE_SECONDS` after a receiver start first *found* it dead (it stamps the time into the
header): never by its age, which says nothing (writes through the memory map do not move a
tmpfs file's mtime), so a receiver starting between a death and the peeker's read cannot take
the dead one's record away.

The peeker's counts outlive it on its node: it keeps them in a :class:`DeathTally` file (one
per endpoint and database, in the same directory), written whenever they change and read by
the next peeker of the endpoint that starts on that node (a restart after the peeker was
lost, a later deployment). A peeker that starts on another node starts from zero; several
deployments of one endpoint on one node share the file, the last to write wins.

Only the messages inside the chain's steps past screening count (their handlers, the user
steps, with the outbox its business transaction): the other rows of a batch, or messages
waiting for the receive transaction's commit, are not suspects. A message in flight beside the
culprit is counted too; it would need to be beside it at three deaths to go to the error queue.

Example (receiver side: the chain's ``crash_ledger`` step calls ``enter``/``leave`` around the
steps after it, the handlers among them; the receiver builds the chain with it)::

    ledger = CrashLedger.create("sales-1a2b3c4d", records=4)
    pipeline = endpoint.create_pipeline(settings, in_flight=ledger)
    record = ledger.enter(message.native_id)  # handlers start
    ledger.leave(record)                       # handlers end, however
    ledger.close()                             # a graceful stop removes the file
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import mmap
import os
import stat
import struct
import tempfile
import time
import uuid
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from endpoint_runtime.chain.recoverability.policy import FailedMessages
from endpoint_runtime.errors import EndpointRuntimeError

MAX_RECEIVER_DEATHS = 3
"""Receiver deaths with a message in its handlers after which it goes to the error queue."""
DEATH_COUNTS_SIZE = 10_000
"""Message ids whose deaths the peeker remembers (least recently counted dropped first)."""
DOOMED_SIZE = 1_000
"""Ids at the limit that receivers are told about (handed over whole, only when it changes)."""
RECORD_SIZE = 16
_EMPTY = bytes(RECORD_SIZE)
_MAGIC = b"ERLEDGR2"
"""First record: this magic and the owner's pid (a janitor removes files of dead owners)."""
HEADER_RECORDS = 2
"""The magic and pid record, then the time (a double, 0 until then) a janitor first found the
owner dead; the message records follow."""
_FOUND_DEAD_AT = RECORD_SIZE
LEDGER_DIRECTORY = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
LEDGER_PREFIX = "endpoint_runtime."
STALE_SECONDS = 600.0
"""A ledger whose process was found gone this long ago and that nobody read meanwhile is
removed (the peeker reads a dead receiver's ledger within a peek cycle; this is for whole
clusters stopped)."""
TALLY_STALE_SECONDS = 86_400.0
"""A peeker's :class:`DeathTally` that nobody wrote for this long is removed (written with
``write``, its mtime is the last change)."""

class _Identified(Protocol):
    @property
    def native_id(self) -> uuid.UUID: ...


M = TypeVar("M", bound=_Identified)
C = TypeVar("C")


class ReceiverDiedError(EndpointRuntimeError):
    """The receiver process died while handling the message, too many times: the exception a
    message is charged with when it goes to the error queue for that reason."""


class NotALedgerError(EndpointRuntimeError):
    """A ledger's name holds something else: a symlink, another user's file, other bytes."""


class CrashLedger:
    """The receiver's side: the ids of the messages in its handlers, in a shared file."""

    def __init__(self, path: Path, records: int) -> None:
        self.path = path
        self.records = records
        size = (records + HEADER_RECORDS) * RECORD_SIZE
        # A new file or nothing: never truncate (or write through a symlink to) what is there.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._map[:RECORD_SIZE] = _MAGIC + os.getpid().to_bytes(8, "little")
        self._free = list(range(HEADER_RECORDS, records + HEADER_RECORDS))

    @classmethod
    def create(cls, receiver_id: str, *, records: int) -> CrashLedger:
        remove_stale_ledgers()
        return cls(ledger_path(receiver_id), max(1, records))

    def enter(self, native_id: uuid.UUID) -> int | None:
        """The message's handlers start: its native id goes into a free record (one memory
        write). ``None`` when every record is taken (not expected; never blocks)."""
        if not self._free:
            return None
        record = self._free.pop()
        start = record * RECORD_SIZE
        self._map[start:start + RECORD_SIZE] = native_id.bytes
        return record

    def leave(self, record: int | None) -> None:
        """The handlers ended (however): the record is free again."""
        if record is None:
            return
        start = record * RECORD_SIZE
        self._map[start:start + RECORD_SIZE] = _EMPTY
        self._free.append(record)

    def close(self) -> None:
        """A graceful stop: nothing is in flight any more, the file goes."""
        with contextlib.suppress(ValueError, OSError):
            self._map.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def ledger_path(receiver_id: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in receiver_id)
    return LEDGER_DIRECTORY / f"{LEDGER_PREFIX}{safe}.ledger"


def read_ledger(path: str) -> list[uuid.UUID]:
    """The ids a dead receiver was handling; the file is removed (read once). Raises
    :class:`NotALedgerError` (and leaves it) when the name holds anything but a ledger of
    this user."""
    try:
        data = _read_own(Path(path))
    except FileNotFoundError:
        return []
    if data[:8] != _MAGIC:
        raise NotALedgerError(f"{path} is not a crash ledger")
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()
    start = HEADER_RECORDS * RECORD_SIZE
    records = (data[i:i + RECORD_SIZE] for i in range(start, len(data), RECORD_SIZE))
    return [uuid.UUID(bytes=r) for r in records if len(r) == RECORD_SIZE and r != _EMPTY]


def _open_own(path: Path, flags: int) -> int:
    """A descriptor of ``path`` if it is a regular file of this user (no symlink followed)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise NotALedgerError(f"{path} cannot be opened as a crash ledger: {exc}") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise NotALedgerError(f"{path} is not a regular file of this user")
    return fd


def _read_own(path: Path) -> bytes:
    fd = _open_own(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as file:
        return file.read()


def remove_stale_ledgers(
    now: float | None = None, directory: Path = LEDGER_DIRECTORY
) -> int:
    """Remove this user's ledgers of this node whose process was found gone at least
    :data:`STALE_SECONDS` ago (left by receivers killed with their whole cluster); returns how
    many. A ledger whose process is found gone for the first time gets the time stamped into
    its header instead, so that the peeker has that long to read it. Cheap: a directory
    listing and a header read per ledger, at each receiver start. Peekers' tallies nobody
    wrote for :data:`TALLY_STALE_SECONDS` go too."""
    now = time.time() if now is None else now
    removed = 0
    for path in directory.glob(f"{LEDGER_PREFIX}*.ledger"):
        with contextlib.suppress(OSError, ValueError, NotALedgerError):
            if _stale(path, now):
                path.unlink()
                removed += 1
    for path in directory.glob(f"{LEDGER_PREFIX}*.deaths"):
        with contextlib.suppress(OSError):
            info = path.lstat()
            if (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
                    and now - info.st_mtime >= TALLY_STALE_SECONDS):
                path.unlink()
                removed += 1
    return removed


def _stale(path: Path, now: float) -> bool:
    """Whether the ledger at ``path`` was found dead :data:`STALE_SECONDS` ago; stamps
    ``now`` as the time found dead when its owner is gone and it has no stamp yet."""
    fd = _open_own(path, os.O_RDWR)
    try:
        header = os.pread(fd, HEADER_RECORDS * RECORD_SIZE, 0)
        pid = int.from_bytes(header[8:16], "little")
        if header[:8] != _MAGIC or pid <= 0 or _alive(pid):
            return False
        (found_dead_at,) = struct.unpack("<d", header[_FOUND_DEAD_AT:_FOUND_DEAD_AT + 8])
        if found_dead_at <= 0:
            os.pwrite(fd, struct.pack("<d", now), _FOUND_DEAD_AT)
            return False
        return bool(now - found_dead_at >= STALE_SECONDS)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@ray.remote(num_cpus=0, max_retries=0)
def _read_ledger_task(path: str) -> list[uuid.UUID]:
    return read_ledger(path)


async def read_ledger_on_node(node_id: str, path: str) -> list[uuid.UUID]:
    """:func:`read_ledger` on the node ``node_id`` (where the receiver ran): a Ray task pinned
    there, or a direct read when that is this node."""
    with contextlib.suppress(Exception):
        if ray.get_runtime_context().get_node_id() == node_id:
            return read_ledger(path)
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    ids: list[uuid.UUID] = await _read_ledger_task.options(
        scheduling_strategy=strategy
    ).remote(path)
    return ids


class DeathCounts:
    """The peeker's side: receiver deaths per message id (bounded), and the ids that reached
    :data:`MAX_RECEIVER_DEATHS` ("doomed") with the reason their error-queue copy will carry.

    Receivers get the doomed ids whole whenever they change (``version``); one that has moved
    such a message to the error queue says so (``settle``), and the others then forget it: a
    copy retried from the error queue after a fix is handled again, with a fresh count.
    """

    def __init__(self, capacity: int = DEATH_COUNTS_SIZE, doomed: int = DOOMED_SIZE) -> None:
        self._capacity = capacity
        self._doomed_capacity = doomed
        self._deaths: collections.OrderedDict[uuid.UUID, int] = collections.OrderedDict()
        self.doomed: collections.OrderedDict[uuid.UUID, str] = collections.OrderedDict()
        """Ids to fail at their next delivery, with the reason."""
        self.version = 0
        """Grows with every change of ``doomed``: receivers behind it get the new one."""

    def count(self, native_id: uuid.UUID, where: str) -> int:
        """One more death with ``native_id`` in the handlers; returns the deaths so far."""
        deaths = self._deaths.pop(native_id, 0) + 1
        self._deaths[native_id] = deaths
        if len(self._deaths) > self._capacity:
            self._deaths.popitem(last=False)
        if deaths >= MAX_RECEIVER_DEATHS:
            self.doomed.pop(native_id, None)
            self.doomed[native_id] = (
                f"the receiver process died {deaths} times while handling this message (a "
                f"native crash, an out-of-memory kill or os._exit in a handler?); the last "
                f"time: {where}"
            )[:2000]
            if len(self.doomed) > self._doomed_capacity:
                self.doomed.popitem(last=False)
            self.version += 1
        return deaths

    def settle(self, native_ids: list[uuid.UUID]) -> None:
        """These doomed messages went to the error queue: forget them everywhere."""
        for native_id in native_ids:
            self._deaths.pop(native_id, None)
            if self.doomed.pop(native_id, None) is not None:
                self.version += 1

    def snapshot(self) -> dict[uuid.UUID, str]:
        return dict(self.doomed)

    def saved(self) -> TallyRecord:
        """What :class:`DeathTally` keeps of these counts."""
        return TallyRecord(deaths=[(i.bytes, n) for i, n in self._deaths.items()],
                           doomed=[(i.bytes, reason) for i, reason in self.doomed.items()])

    def restore(self, record: TallyRecord) -> None:
        """Take the counts a previous peeker saved (these counts start empty)."""
        for raw, deaths in record.deaths[-self._capacity:]:
            self._deaths[uuid.UUID(bytes=raw)] = deaths
        for raw, reason in record.doomed[-self._doomed_capacity:]:
            self.doomed[uuid.UUID(bytes=raw)] = reason
        if self.doomed:
            self.version += 1


class TallyRecord(msgspec.Struct, frozen=True):
    deaths: list[tuple[bytes, int]]
    doomed: list[tuple[bytes, str]]


class DeathTally:
    """A peeker's :class:`DeathCounts` in a node-local file, so that they outlive the peeker.

    Written whole (a new file renamed over the old one: never through a symlink) each time
    the counts change, which is rare (a receiver death, a doomed message settled); read by
    the next peeker of the same endpoint and database on this node.

    Example::

        tally = DeathTally.of(dsn, '"public"."sales"')
        deaths = tally.load()
        ...
        tally.save(deaths)
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def of(cls, dsn: str, queue: str, directory: Path = LEDGER_DIRECTORY) -> DeathTally:
        """The tally of the endpoint whose queue is ``queue`` in the database of ``dsn`` (only
        a digest of both names the file)."""
        digest = hashlib.sha256(f"{dsn}\n{queue}".encode()).hexdigest()[:24]
        return cls(directory / f"{LEDGER_PREFIX}{digest}.deaths")

    def load(self) -> DeathCounts:
        """The saved counts; empty when there are none or they cannot be read."""
        counts = DeathCounts()
        with contextlib.suppress(OSError, NotALedgerError, msgspec.DecodeError, ValueError):
            counts.restore(msgspec.msgpack.decode(_read_own(self.path), type=TallyRecord))
        return counts

    def save(self, counts: DeathCounts) -> None:
        """Replace the saved counts with ``counts`` (none left: the file goes)."""
        record = counts.saved()
        if not record.deaths and not record.doomed:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.{uuid.uuid4().hex}")
        fd = os.open(temporary,
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(msgspec.msgpack.encode(record))
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            raise


class DoomedMessages:
    """A receiver's copy of the doomed ids, kept as failures of its pipeline (``failures``):
    an unrecoverable :class:`ReceiverDiedError` each, so recoverability sends the message to
    the error queue at its next delivery, as any other failure."""

    def __init__(self, failures: FailedMessages) -> None:
        self._failures = failures
        self._ids: set[uuid.UUID] = set()

    def sync(self, doomed: dict[uuid.UUID, str]) -> None:
        """Take the peeker's current doomed ids (called only when they changed)."""
        for native_id in self._ids - doomed.keys():
            self._failures.forget(native_id)
        for native_id, reason in doomed.items():
            if native_id not in self._ids:
                self._failures.record(native_id, ReceiverDiedError(reason), unrecoverable=True)
        self._ids = set(doomed)

    def settled(self) -> list[uuid.UUID]:
        """Doomed ids whose failure record is gone: the message went to the error queue (or
        the record was pushed out of the cache; a message that kills again is doomed again
        at its next death)."""
        return [i for i in self._ids if self._failures.get(i) is None]
