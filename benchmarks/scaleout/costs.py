"""What one message costs the runtime and PostgreSQL, and the scaling model built on it.

Per message, for the single-message atomic mode and the batched atomic mode (each a
deployment of ``benchmarks.endpoints``: receive, send one message to a sink queue, commit; a
backlog drained at ``--concurrency``), over whole drains:

- CPU seconds of the receiver processes (``psutil`` over ``receiver_pids()``; the peeker and
  Ray's own daemons are per-deployment overhead and left out);
- CPU seconds of PostgreSQL: every child of the postmaster (backends, WAL writer, checkpointer,
  autovacuum) plus the children it reaped meanwhile. This needs the server on this machine,
  and a server nobody else uses during the run (its WAL and CPU are counted whole);
- WAL bytes (``pg_current_wal_flush_lsn`` before and after), WAL flushes (``pg_stat_wal``),
  and commits: COMMIT records in that WAL (``pg_walinspect``) where the extension exists,
  else ``pg_stat_database.xact_commit`` (which also counts read-only transactions);
- TCP connections each receiver process holds to the server.

:func:`project` turns them into the throughput of N worker nodes against one PostgreSQL server
of K cores, naming the first limit reached. Run ``python -m benchmarks.scaleout.costs --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg
import psutil

from benchmarks.common import median, progress, run_benchmark, throwaway_database
from benchmarks.throughput import (
    INPUT,
    SINK_ADDRESS,
    deploy,
    reset_queues,
    sink_baseline,
    wait_for_sink,
    work_messages,
)
from endpoint_runtime.connections.connection_budget import receiver_pool_size
from endpoint_runtime.connections.embedded import redact_dsn, resolve_dsn, with_database
from endpoint_runtime.runtime.deployment import EndpointDeployment
from endpoint_runtime.transport import QueueAddress, queues, sending
from endpoint_runtime.wire.messages import OutgoingMessage

MODES = {"single": ("benchmarks.endpoints:atomic", "bench_atomic"),
         "batched": ("benchmarks.endpoints:batched", "bench_batched")}
COMMIT_RECORDS = """
SELECT coalesce(sum(count), 0) FROM pg_get_wal_stats($1::text::pg_lsn, $2::text::pg_lsn, true)
WHERE "resource_manager/record_type" = 'Transaction/COMMIT'"""
SERVER_STATS = """
SELECT (SELECT wal_sync FROM pg_stat_wal) AS wal_syncs,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits
"""
OTHER_BACKENDS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name <> $1"""
PROBE = "er_costs_probe"
"""The probe's own connections' application_name (they only read)."""


@dataclass(frozen=True)
class MessageCosts:
    """The measured cost of one message in one mode (medians over the rounds)."""

    mode: str
    msgs_per_s: float  # one node, ``concurrency`` slots, this machine
    concurrency: int
    runtime_cpu_us: float
    postgres_cpu_us: float | None  # None when the server is not on this machine
    wal_bytes: float
    commits: float  # per message
    wal_flushes: float  # per message
    connections_per_receiver: float | None

    @property
    def per_slot_msgs_per_s(self) -> float:
        """What one slot (one message in flight) handled per second."""
        return self.msgs_per_s / self.concurrency


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def receivers_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds so far of each receiver process."""
    return {pid: cpu_seconds(psutil.Process(pid)) for pid in pids}


def postgres_cpu(postmaster: psutil.Process) -> dict[int, float]:
    """CPU seconds so far of the postmaster's children, by pid, and under key 0 those of the
    postmaster itself plus every child it has reaped (autovacuum workers come and go)."""
    reaped = postmaster.cpu_times()
    counts = {0: float(reaped.user + reaped.system + reaped.children_user
                       + reaped.children_system)}
    for child in postmaster.children():
        try:
            counts[child.pid] = cpu_seconds(child)
        except psutil.NoSuchProcess:
            continue
    return counts


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two snapshots (a process new since ``before`` counts whole;
    one that ended between them is in the postmaster's reaped total)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def server_connections(pids: list[int], port: int) -> list[int]:
    """TCP connections each process holds to the server's port."""
    return [sum(1 for c in psutil.Process(pid).net_connections(kind="tcp")
                if c.raddr and c.raddr.port == port) for pid in pids]


async def load_marked(pool: asyncpg.Pool, queue: QueueAddress,
                      messages: list[OutgoingMessage]) -> str:
    """Insert the backlog in one transaction; returns the WAL position just before its commit
    (no receiver can write before it commits, so later WAL is the drain's)."""
    async with pool.acquire() as connection, connection.transaction():
        for start in range(0, len(messages), 1000):
            await sending.send_many(connection, queue, messages[start:start + 1000])
        lsn: str = await connection.fetchval("SELECT pg_current_wal_insert_lsn()::text")
    return lsn


class CostProbe:
    """Counters of one server and one deployment, read around a drain."""

    def __init__(self, pool: asyncpg.Pool, postmaster: psutil.Process | None, port: int,
                 walinspect: bool) -> None:
        self.pool = pool
        self.postmaster = postmaster
        self.port = port
        self.walinspect = walinspect

    @classmethod
    async def attach(cls, pool: asyncpg.Pool) -> CostProbe:
        backend = await pool.fetchval("SELECT pg_backend_pid()")
        port = await pool.fetchval("SELECT inet_server_port()")
        try:
            postmaster = psutil.Process(backend).parent()
        except psutil.Error:
            postmaster = None  # the server is elsewhere: no PostgreSQL CPU figure
        try:
            await pool.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            walinspect = True
        except asyncpg.PostgresError:
            walinspect = False
        return cls(pool, postmaster, int(port or 0), walinspect)

    async def drain(self, deployment: EndpointDeployment, queue: QueueAddress,
                    messages: int) -> dict[str, float]:
        """Drain a backlog of ``messages``; the run's totals and its rate."""
        await reset_queues(self.pool, queue)
        baseline = await sink_baseline(self.pool)
        receivers = await deployment.receiver_pids()
        start_lsn = await load_marked(self.pool, queue, work_messages(messages))
        visible = time.perf_counter()
        cpu_before = receivers_cpu(receivers)
        pg_before = postgres_cpu(self.postmaster) if self.postmaster else {}
        done = await wait_for_sink(self.pool, baseline, messages)
        pg_after = postgres_cpu(self.postmaster) if self.postmaster else {}
        cpu_after = receivers_cpu(receivers)
        end_lsn = await self.pool.fetchval("SELECT pg_current_wal_flush_lsn()::text")
        connections = server_connections(receivers, self.port) if self.port else []
        return {
            "msgs_per_s": messages / (done - visible),
            "runtime_cpu_s": cpu_spent(cpu_before, cpu_after),
            "postgres_cpu_s": cpu_spent(pg_before, pg_after) if self.postmaster else -1.0,
            "wal_bytes": float(await self.pool.fetchval(
                "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)", end_lsn, start_lsn)),
            "commits": (float(await self.pool.fetchval(COMMIT_RECORDS, start_lsn, end_lsn))
                        if self.walinspect else -1.0),
            "receivers": float(len(receivers)),
            "connections_per_receiver": (sum(connections) / len(connections)
                                         if connections else -1.0),
        }

    async def settled_stats(self) -> dict[str, float]:
        """``pg_stat_wal`` flushes and the database's commits once every backend but the
        probe's has ended: a backend reports its counters when idle outside a transaction
        or when it exits, and the receivers' connections wait inside one between messages."""
        deadline = time.perf_counter() + 60.0
        while await self.pool.fetchval(OTHER_BACKENDS, PROBE):
            if time.perf_counter() > deadline:
                raise TimeoutError("the deployment's connections are still open after 60 s")
            await asyncio.sleep(0.1)
        row = await self.pool.fetchrow(SERVER_STATS)
        return {"wal_syncs": float(row["wal_syncs"]), "commits": float(row["commits"])}


def per_message(runs: list[dict[str, float]], totals: dict[str, float], mode: str,
                messages: int, concurrency: int) -> MessageCosts:
    """Medians over the runs, divided by the messages of a run; the flushes (and, without
    ``pg_walinspect``, the commits) from the mode's totals over all its messages."""
    def each(key: str) -> float:
        return median([run[key] for run in runs]) / messages

    connections = median([run["connections_per_receiver"] for run in runs])
    walinspect = runs[0]["commits"] >= 0
    return MessageCosts(
        mode=mode,
        msgs_per_s=median([run["msgs_per_s"] for run in runs]),
        concurrency=concurrency,
        runtime_cpu_us=each("runtime_cpu_s") * 1e6,
        postgres_cpu_us=(each("postgres_cpu_s") * 1e6
                         if runs[0]["postgres_cpu_s"] >= 0 else None),
        wal_bytes=each("wal_bytes"),
        commits=each("commits") if walinspect else totals["commits"] / totals["messages"],
        wal_flushes=totals["wal_syncs"] / totals["messages"],
        connections_per_receiver=connections if connections >= 0 else None,
    )


@dataclass(frozen=True)
class Cluster:
    """The machines of a projection: N worker nodes against one PostgreSQL server."""

    nodes: int
    node_cores: int
    server_cores: int
    slots_per_node: int = 16  # messages in flight per worker node
    slots_per_receiver: int = 4
    max_connections: int = 100  # PostgreSQL's default
    wal_mb_per_s: float = 200.0  # sustained WAL writes the server's disk takes
    flushes_per_s: float = 1_000.0  # WAL flushes (fdatasync) the disk takes


def project(costs: MessageCosts, cluster: Cluster) -> tuple[float, str]:
    """The throughput ``cluster`` can reach in the mode of ``costs``, and what stops it.

    Every limit is a ceiling at 100% of its resource; the lowest one binds. Slots are capped
    by the server's connections (a receiver's pool is sized per slot); each slot handles
    messages at the per-slot rate measured here, and commits wait for WAL flushes that the
    slots in flight share (group commit).
    """
    receivers = cluster.slots_per_node / cluster.slots_per_receiver
    per_receiver = costs.connections_per_receiver or receiver_pool_size(
        cluster.slots_per_receiver)
    connection_slots = cluster.max_connections / per_receiver * cluster.slots_per_receiver
    slots = min(cluster.nodes * receivers * cluster.slots_per_receiver, connection_slots)
    limits = {
        "worker CPU": cluster.nodes * cluster.node_cores / (costs.runtime_cpu_us * 1e-6),
        "slots" if slots < connection_slots else "connections":
            slots * costs.per_slot_msgs_per_s,
        "WAL bytes": cluster.wal_mb_per_s * 2**20 / costs.wal_bytes,
        "WAL flushes": cluster.flushes_per_s * slots / max(costs.commits, 1e-9),
    }
    if costs.postgres_cpu_us:
        limits["PostgreSQL CPU"] = cluster.server_cores / (costs.postgres_cpu_us * 1e-6)
    binding = min(limits, key=lambda name: limits[name])
    return limits[binding], binding


def projection_table(costs: MessageCosts, nodes: list[int], server_cores: list[int],
                     node_cores: int, **cluster: Any) -> list[dict[str, Any]]:
    """One row per node count: the projected rate and binding limit per server size."""
    rows = []
    for count in nodes:
        row: dict[str, Any] = {"nodes": count}
        for cores in server_cores:
            rate, limit = project(costs, Cluster(count, node_cores, cores, **cluster))
            row[f"K={cores}"] = {"msgs_per_s": round(rate), "limit": limit}
        rows.append(row)
    return rows


async def measure_mode(probe: CostProbe, dsn: str, mode: str,
                       args: argparse.Namespace) -> MessageCosts:
    """A deployment of ``mode``: one uncounted drain, then ``args.rounds`` measured ones."""
    path, queue = MODES[mode]
    overrides = {"batch_size": args.batch_size} if mode == "batched" else {}
    before = await probe.settled_stats()
    deployment = await deploy(path, dsn, args.concurrency, **overrides)
    try:
        await probe.drain(deployment, QueueAddress(queue), args.warmup)
        runs = []
        for index in range(args.rounds):
            run = await probe.drain(deployment, QueueAddress(queue), args.messages)
            runs.append(run)
            progress(f"{mode} {index + 1}/{args.rounds}: {run['msgs_per_s']:.0f} msg/s, "
                     f"runtime {run['runtime_cpu_s']:.2f} s, postgres "
                     f"{run['postgres_cpu_s']:.2f} s CPU, WAL {run['wal_bytes'] / 2**20:.1f}"
                     f" MB, {run['commits']:.0f} commits")
    finally:
        await deployment.stop()
    after = await probe.settled_stats()
    totals = {key: after[key] - before[key] for key in after}
    totals["messages"] = args.warmup + args.rounds * args.messages
    return per_message(runs, totals, mode, args.messages, args.concurrency)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    costs: dict[str, MessageCosts] = {}
    async with throwaway_database(server, "er_costs") as database:
        dsn = with_database(server, database)
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4,
                                         server_settings={"application_name": PROBE})
        try:
            for queue in (INPUT, SINK_ADDRESS, *(QueueAddress(q) for _, q in MODES.values())):
                async with pool.acquire() as connection:
                    await queues.create_queue(connection, queue,
                                              notify_on_send=queue != SINK_ADDRESS)
            probe = await CostProbe.attach(pool)
            settings = {name: await pool.fetchval(f"SHOW {name}") for name in
                        ("server_version", "synchronous_commit", "max_connections")}
            for mode in args.modes.split(","):
                costs[mode] = await measure_mode(probe, dsn, mode, args)
        finally:
            await pool.close()
    nodes, cores = [1, 2, 4, 8, 16, 32], [4, 8, 16, 32]
    return {
        "benchmark": "scaleout-costs",
        "costs": {mode: asdict(cost) for mode, cost in costs.items()},
        "projection": {mode: projection_table(cost, nodes, cores, args.node_cores,
                                              max_connections=args.max_connections,
                                              wal_mb_per_s=args.wal_mb_per_s,
                                              flushes_per_s=args.flushes_per_s)
                       for mode, cost in costs.items()},
        "commits_from": "WAL COMMIT records" if probe.walinspect else "xact_commit",
        "server_settings": settings,
        "messages": args.messages, "rounds": args.rounds, "concurrency": args.concurrency,
        "batch_size": args.batch_size, "server": redact_dsn(server),
        "assumptions": {"node_cores": args.node_cores, "wal_mb_per_s": args.wal_mb_per_s,
                        "flushes_per_s": args.flushes_per_s,
                        "max_connections": args.max_connections},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaleout.costs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run, result not kept")
    parser.add_argument("--dsn", help="a PostgreSQL server on this machine, used by no one else")
    parser.add_argument("--modes", default="single,batched", help="single, batched or both")
    parser.add_argument("--messages", type=int, help="backlog per drain")
    parser.add_argument("--rounds", type=int, help="drains per mode (medians reported)")
    parser.add_argument("--warmup", type=int, default=500, help="uncounted first drain")
    parser.add_argument("--concurrency", type=int, default=4, help="slots of the deployment")
    parser.add_argument("--batch-size", type=int, default=50, help="batched mode's batch")
    parser.add_argument("--node-cores", type=int, default=2, help="cores of a worker node")
    parser.add_argument("--max-connections", type=int, default=100, help="server's limit")
    parser.add_argument("--wal-mb-per-s", type=float, default=200.0, help="disk's WAL rate")
    parser.add_argument("--flushes-per-s", type=float, default=1_000.0,
                        help="WAL flushes a second the disk takes (pg_test_fsync)")
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 2_000 if args.quick else 10_000
    if args.rounds is None:
        args.rounds = 2 if args.quick else 3
    return args


if __name__ == "__main__":
    run_benchmark("scaleout-costs", parse_args, main)
