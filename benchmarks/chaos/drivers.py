"""What acts on the deployment during a mode's run: the send stream, the supervisor that
recreates a lost peeker (as ``endpoint-runtime run`` does), and the fault injectors.

Every fault injector acts only on what the run started: receivers and the peeker are Ray
workers of the run's own cluster (killed by PID), the backends are those of the run's own
database (its own connections spared), the server is the run's own.

Each fault also notes what it cut, so that ``none`` mode's losses can be traced to it
(:mod:`benchmarks.chaos.checks`): a killed process is first stopped (``SIGSTOP``), the local
ports of its connections to the server are read, then it is killed; terminated backends are
noted by pid; a server restart cuts every backend of the runtime, noted by pid just before.
Behind the run's pooler a killed process's connections are those to the pooler, and a
pooler restart cuts every client connection it has, noted by port just before. The pooler's
server connections are the backends the other faults terminate; a terminated one cuts the
client whose transaction it runs, whatever backend that client received on, so those faults
also note the client port each backend's application_name ends with (the client it serves
now, or served last: the cut may name a client it did not reach, never miss one).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from collections.abc import Callable

import asyncpg
import msgspec
import psutil

from benchmarks.chaos.ledger import (
    RUN_APPLICATIONS,
    TRANSIENT_ERRORS,
    Item,
    LedgeredSender,
    connect,
    poison_item,
    sql,
)
from benchmarks.chaos.pooler import Pooler, client_port_of
from benchmarks.chaos.schedule import Fault, FaultKind, PoisonKind
from benchmarks.chaos.server import ChaosServer
from benchmarks.common import progress
from endpoint_runtime.runtime.deployment import EndpointDeployment
from tests.cluster.nodes import LocalCluster

SEND_BATCH = 500
STREAM_TICK = 0.1
SUPERVISE_EVERY = 0.5
STOP_TIMEOUT = 2.0
"""Seconds to wait for a ``SIGSTOP``-ed process to show as stopped."""


class Cut(msgspec.Struct, frozen=True):
    """What a fault cut: the connections a message received on may have died with."""

    ports: list[int] = []
    """Client ports of the killed processes' connections to the server."""
    backends: list[int] = []
    """Pids of the terminated backends."""
    at: float = 0.0
    """Epoch seconds of the cut (the processes stopped, the terminations or the server's
    stop asked for); 0: the fault's own time."""


KILL_RETRY_SECONDS = 3.0
"""How long a receiver kill that finds no receiver keeps looking for one."""
KILL_RETRY_PAUSE = 0.5


class FaultRecord(msgspec.Struct, frozen=True):
    """One injected fault: when (epoch seconds), what, and what it hit."""

    kind: str
    at: float
    detail: str
    injected: bool = True
    """False when there was nothing to hit (no receiver running at that moment)."""
    cut: Cut = Cut()


async def send_backlog(sender: LedgeredSender, items: list[Item]) -> None:
    for start in range(0, len(items), SEND_BATCH):
        await sender.send(items[start:start + SEND_BATCH])


async def send_stream(sender: LedgeredSender, items: list[Item], duration: float) -> None:
    """Send ``items`` evenly over ``duration`` seconds: every tick, whatever is due by then
    (a send held up by an outage catches up after it, as a real sender's backlog would)."""
    started = time.monotonic()
    done = 0
    while done < len(items):
        due = min(len(items), int(len(items) * (time.monotonic() - started) / duration) + 1)
        if due > done:
            await sender.send(items[done:due])
            done = due
        await asyncio.sleep(STREAM_TICK)


async def supervise(deployment: EndpointDeployment, stop: asyncio.Event,
                    on_status: Callable[[int], None]) -> None:
    """Ask for the status every half second; a lost peeker is recreated (with receivers)."""
    while not stop.is_set():
        status = await deployment.supervised_status(attempts=10, pause=1.0)
        on_status(status.in_flight)
        await asyncio.sleep(SUPERVISE_EVERY)


class FaultInjector:
    """Applies a :func:`~benchmarks.chaos.schedule.fault_schedule` to one deployment."""

    def __init__(self, *, rng: random.Random, cluster: LocalCluster, server: ChaosServer,
                 dsn: str, deployment: EndpointDeployment, sender: LedgeredSender,
                 poison_per_kind: int, pooler: Pooler | None = None) -> None:
        self.rng = rng
        self.cluster = cluster
        self.server = server
        self.pooler = pooler
        self.traced_port = pooler.port if pooler is not None else server.port
        """The port whose connections a killed process had in hand (the pooler's, behind it)."""
        self.dsn = dsn
        self.deployment = deployment
        self.sender = sender
        self.poison_per_kind = poison_per_kind
        self.records: list[FaultRecord] = []
        self.poison: list[uuid.UUID] = []

    async def run(self, schedule: list[Fault]) -> None:
        started = time.monotonic()
        actions = {
            FaultKind.KILL_RECEIVER: self.kill_receiver,
            FaultKind.KILL_PEEKER: self.kill_peeker,
            FaultKind.TERMINATE_BACKENDS: self.terminate_backends,
            FaultKind.RESTART_POSTGRES: self.restart_postgres,
            FaultKind.POISON_BURST: self.poison_burst,
            FaultKind.RESTART_POOLER: self.restart_pooler,
        }
        for fault in schedule:
            await asyncio.sleep(max(0.0, fault.at - (time.monotonic() - started)))
            at = time.time()
            detail, injected, cut = await actions[fault.kind]()
            self.records.append(FaultRecord(fault.kind.value, at, detail, injected, cut))
            progress(f"chaos: {fault.kind.value} at +{fault.at:.1f} s: {detail}")

    async def kill_receiver(self) -> tuple[str, bool, Cut]:
        """Kill a receiver; one that finds none (the peeker being recreated, on a loaded
        machine for seconds) looks again every :data:`KILL_RETRY_PAUSE` s for up to
        :data:`KILL_RETRY_SECONDS`, so that the run injects the kills its schedule holds."""
        deadline = time.monotonic() + KILL_RETRY_SECONDS
        while True:
            try:
                pids = await asyncio.wait_for(self.deployment.receiver_pids(), 10)
                missed = "no receiver running"
            except Exception as exc:  # the peeker itself may be down (killed, being recreated)
                pids, missed = [], f"no receiver list ({type(exc).__name__})"
            if pids:
                break
            if time.monotonic() >= deadline:
                return missed, False, Cut()
            await asyncio.sleep(KILL_RETRY_PAUSE)
        pid = self.rng.choice(sorted(pids))
        ports = await asyncio.to_thread(_stop_and_read_ports, [pid], self.traced_port)
        cut_at = time.time()
        detail, killed = _kill(pid, "receiver")
        return detail, killed, Cut(ports=ports, at=cut_at)

    async def kill_peeker(self) -> tuple[str, bool, Cut]:
        """Kill the peeker and, with it, its receivers: Ray ends the actors a dead actor
        owns, and killing them here, stopped, notes exactly which connections died."""
        peekers = await asyncio.to_thread(self._worker_pids, "ray::Peeker")
        if not peekers:
            return "no peeker process found", False, Cut()
        receivers = await asyncio.to_thread(self._worker_pids, "ray::Receiver")
        ports = await asyncio.to_thread(_stop_and_read_ports, receivers, self.traced_port)
        cut_at = time.time()
        detail, killed = _kill(peekers[0], "peeker")
        for pid in receivers:
            _kill(pid, "receiver")
        return (f"{detail}, with its {len(receivers)} receivers", killed,
                Cut(ports=ports, at=cut_at))

    def _worker_pids(self, title: str) -> list[int]:
        found = []
        for process in self.cluster.processes():
            try:
                if " ".join(process.cmdline()).startswith(title):
                    found.append(process.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    async def terminate_backends(self) -> tuple[str, bool, Cut]:
        """Terminate a random half (at least one) of the runtime's backends."""
        connection = await connect(self.dsn)
        try:
            pids = sorted(await connection.fetchval(sql("runtime_backends"), RUN_APPLICATIONS))
            chosen = self.rng.sample(pids, max(1, len(pids) // 2)) if pids else []
            ports = await _pooled_clients(connection, chosen)
            cut_at = time.time()
            ended = await connection.fetchval(sql("terminate_backends"), chosen)
        finally:
            await connection.close()
        return (f"{len(ended)} of {len(pids)} runtime backends terminated", bool(ended),
                Cut(backends=sorted(ended), ports=ports, at=cut_at))

    async def restart_postgres(self) -> tuple[str, bool, Cut]:
        """Restart the server; the runtime's backends of the moment are noted as cut."""
        try:
            connection = await connect(self.dsn)
            try:
                backends = await connection.fetchval(sql("runtime_backends"), RUN_APPLICATIONS)
                ports = await _pooled_clients(connection, backends)
            finally:
                await connection.close()
        except TRANSIENT_ERRORS as exc:
            return f"server not restarted: its backends could not be listed ({exc})", False, Cut()
        started, cut_at = time.monotonic(), time.time()
        await asyncio.to_thread(self.server.restart)
        return (f"server stopped (fast) and started in {time.monotonic() - started:.1f} s",
                True, Cut(backends=sorted(backends), ports=ports, at=cut_at))

    async def restart_pooler(self) -> tuple[str, bool, Cut]:
        """Kill the pooler and start it again; its client connections of the moment, noted by
        port just before, are cut (the run's own connections go to the server directly)."""
        if self.pooler is None:
            return "no pooler in this run", False, Cut()
        ports = await asyncio.to_thread(self.pooler.client_ports)
        started, cut_at = time.monotonic(), time.time()
        await asyncio.to_thread(self.pooler.restart)
        return (f"pooler killed with {len(ports)} client connections and started in "
                f"{time.monotonic() - started:.1f} s", True, Cut(ports=ports, at=cut_at))

    async def poison_burst(self) -> tuple[str, bool, Cut]:
        ids = [uuid.UUID(int=self.rng.getrandbits(128), version=4)
               for _ in range(self.poison_per_kind * len(PoisonKind))]
        items = [poison_item(message_id, kind)
                 for message_id, kind in zip(ids, list(PoisonKind) * self.poison_per_kind,
                                             strict=True)]
        try:
            await self.sender.send(items)
        except TRANSIENT_ERRORS as exc:
            return f"poison burst not sent: {exc}", False, Cut()
        self.poison.extend(ids)
        return f"{len(items)} poison rows ({self.poison_per_kind} of each kind)", True, Cut()


async def _pooled_clients(connection: asyncpg.Connection, backends: list[int]) -> list[int]:
    """The client ports behind ``backends`` where a pooler noted them in application_name
    (none without the run's pooler)."""
    names = await connection.fetchval(sql("backend_applications"), backends)
    return sorted(port for port in map(client_port_of, names) if port is not None)


def _stop_and_read_ports(pids: list[int], server_port: int) -> list[int]:
    """Stop each process (``SIGSTOP``: it opens nothing more) and return the local ports of
    its TCP connections to ``server_port`` (the server's, or the pooler's in front of it);
    the caller kills them next."""
    ports: list[int] = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            process.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + STOP_TIMEOUT
            while (process.status() != psutil.STATUS_STOPPED
                   and time.monotonic() < deadline):
                time.sleep(0.002)
            ports.extend(c.laddr.port for c in process.net_connections(kind="tcp")
                         if c.raddr and c.raddr.port == server_port)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return ports


def _kill(pid: int, what: str) -> tuple[str, bool]:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return f"{what} {pid} already gone", False
    return f"{what} {pid} killed (SIGKILL)", True
