"""One mode's run (deploy, backlog, stream with faults, drain, account) and the whole run."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import time
import uuid
from typing import Any

import msgspec

from benchmarks.chaos import checks, recovery, saga_checks
from benchmarks.chaos.drivers import FaultInjector, send_backlog, send_stream, supervise
from benchmarks.chaos.endpoints import ERROR_QUEUE, SINK, endpoint_path
from benchmarks.chaos.ledger import (
    SCHEMA,
    TRANSIENT_ERRORS,
    LedgeredSender,
    connect,
    watch_queue,
    work_item,
)
from benchmarks.chaos.observations import read_observed
from benchmarks.chaos.observer import DSN_VARIABLE
from benchmarks.chaos.plants import Planted, plant
from benchmarks.chaos.pooler import Pooler
from benchmarks.chaos.schedule import Purpose, fates, fault_schedule, generator, message_ids
from benchmarks.chaos.server import ChaosServer
from benchmarks.common import progress
from endpoint_runtime import TransportSettings
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.embedded import with_database
from endpoint_runtime.runtime.actors.cluster import ensure_ray
from endpoint_runtime.runtime.deployment import EndpointDeployment
from endpoint_runtime.transport import QueueAddress
from tests.cluster.nodes import LocalCluster, free_port

DATABASE = "chaos"
PEEK_DELAY = 0.5
QUIET_CHECKS = 3
"""Drain checks in a row (a second apart) that must find nothing queued, delayed or in flight."""


class Run(msgspec.Struct, kw_only=True):
    """What every mode's run shares."""

    args: argparse.Namespace
    cluster: LocalCluster
    server: ChaosServer
    dsn: str
    pooler: Pooler | None = None
    """``--pooler``: the PgBouncer the runtime's connections go through."""


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Start the run's PostgreSQL and Ray cluster, run each mode, stop both, report."""
    server = await asyncio.to_thread(ChaosServer.create, free_port())
    workers = [{f"node_{n}": 1000.0} for n in range(1, args.nodes)]
    cluster = LocalCluster(workers=workers, cpus_per_node=2)
    cluster.environment["ENDPOINT_RUNTIME_LOG_LEVEL"] = args.runtime_log_level
    cluster.environment[DSN_VARIABLE] = with_database(server.dsn, DATABASE)
    pooler: Pooler | None = None
    try:
        progress(f"chaos: PostgreSQL on port {server.port}; starting {args.nodes} Ray nodes")
        await asyncio.to_thread(cluster.start)
        os.environ.update(cluster.driver_environment())
        ensure_ray()  # in the main thread (a connection here; see endpoint_runtime.cli.run)
        dsn = await _prepare_database(server.dsn)
        if args.pooler:
            pooler = await asyncio.to_thread(
                Pooler.start, server.dsn, pool_size=args.pool_size,
                application_name_add_host=True)
            progress(f"chaos: PgBouncer (transaction mode, {args.pool_size} server "
                     f"connections) on port {pooler.port}")
        run = Run(args=args, cluster=cluster, server=server, dsn=dsn, pooler=pooler)
        modes = {mode: await run_mode(run, mode) for mode in args.modes}
    finally:
        import ray

        ray.shutdown()
        if pooler is not None:
            await asyncio.to_thread(pooler.stop)
        await asyncio.to_thread(cluster.shutdown)
        await asyncio.to_thread(server.destroy)
    faults: collections.Counter[str] = collections.Counter()
    for result in modes.values():
        faults.update(result["faults"])
    return {
        "benchmark": "chaos", "messages_per_mode": args.messages, "seed": args.seed,
        "nodes": args.nodes, "stream_seconds": args.stream_seconds,
        "kill_interval": args.kill_interval,
        "pooler": {"pool_mode": "transaction", "pool_size": args.pool_size} if args.pooler
        else None,
        "modes": modes, "faults": dict(faults),
        "fate_mismatches": sum(result["fate_mismatches"] for result in modes.values()),
        "ok": all(result["ok"] for result in modes.values()),
    }


async def _prepare_database(server_dsn: str) -> str:
    admin = await connect(server_dsn)
    try:
        await admin.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await admin.close()
    dsn = with_database(server_dsn, DATABASE)
    async with PostgresTransport.connect(TransportSettings(dsn=dsn)) as transport:
        await transport.pool.execute(SCHEMA)
        await transport.create_queue(SINK)
        await transport.create_queue(ERROR_QUEUE)
    return dsn


async def run_mode(run: Run, mode: str) -> dict[str, Any]:
    """Deploy ``mode``'s endpoint, send the backlog, then the stream with the faults (and
    the planted ones), wait until everything is settled, stop, and account for every
    message id."""
    args = run.args
    progress(f"chaos: {mode}: deploying")
    pooler_dsn = run.pooler.for_dsn(run.dsn) if run.pooler is not None else None
    deployment = await EndpointDeployment.start(
        endpoint_path(mode), transport=TransportSettings(dsn=run.dsn, peek_delay=PEEK_DELAY,
                                                         pooler_dsn=pooler_dsn),
        peeker_resources={"head": 1.0})
    address = deployment.config.address
    delayed = QueueAddress(address.table + ".delayed", address.schema)
    connection = await connect(run.dsn)
    try:
        await watch_queue(connection, address, receives=mode == "none")
    finally:
        await connection.close()
    rng = generator(args.seed, mode, Purpose.MESSAGES)
    items = [work_item(i, n, fate) for n, (i, fate) in enumerate(
        zip(message_ids(rng, args.messages), fates(rng, args.messages), strict=True))]
    schedule = fault_schedule(generator(args.seed, mode, Purpose.SCHEDULE),
                              args.stream_seconds, kill_interval=args.kill_interval,
                              pooler=run.pooler is not None)
    backlog = int(len(items) * args.backlog_share)
    sender = LedgeredSender(run.dsn, mode, address)
    injector = FaultInjector(
        rng=generator(args.seed, mode, Purpose.INJECTOR), cluster=run.cluster,
        server=run.server, dsn=run.dsn, deployment=deployment,
        sender=LedgeredSender(run.dsn, mode, address), poison_per_kind=args.poison_per_kind,
        pooler=run.pooler)
    await send_backlog(sender, items[:backlog])
    progress(f"chaos: {mode}: {backlog} messages of backlog sent; stream of "
             f"{len(items) - backlog} over {args.stream_seconds:.0f} s with faults")
    started = time.time()
    in_flight = [0]
    stop = asyncio.Event()
    supervisor = asyncio.create_task(
        supervise(deployment, stop, lambda n: in_flight.__setitem__(0, n)))
    plants: dict[str, asyncio.Task[list[uuid.UUID]]] = {}
    try:
        # A task group: if the stream fails, the injector stops too (no fault outlives it).
        async with asyncio.TaskGroup() as group:
            group.create_task(send_stream(sender, items[backlog:], args.stream_seconds))
            group.create_task(injector.run(schedule))
            if mode in args.plant_modes:
                plants = _plant(group, run.dsn, mode, address, args)
        progress(f"chaos: {mode}: stream sent; waiting until nothing is queued, delayed or "
                 "in flight")
        settled = await _settle(run.dsn, address, delayed, in_flight, supervisor,
                                args.drain_timeout)
    except BaseException as exc:
        progress(f"chaos: {mode}: the run failed: {exc!r}")
        supervisor.cancel()
        raise
    stop.set()
    await supervisor
    final = await deployment.stop()
    await sender.close()
    await injector.sender.close()
    connection = await connect(run.dsn)
    try:
        observed, times = await read_observed(connection, mode, address, delayed,
                                              injector.records)
        states = await saga_checks.read_states(connection, mode, address)
    finally:
        await connection.close()
    saga = None if states is None else saga_checks.saga_account(states, observed.effects)
    planted = Planted(**{kind: sorted(map(str, task.result())) for kind, task in plants.items()})
    return _mode_result(checks.account(observed), times, injector, started, settled,
                        deployment.restarts, final.replaced_receivers, planted, saga)


def _plant(group: asyncio.TaskGroup, dsn: str, mode: str, address: QueueAddress,
           args: argparse.Namespace) -> dict[str, asyncio.Task[list[uuid.UUID]]]:
    """The planted faults of ``mode``: the loss when the stream starts (the backlog still
    queued), the duplicates halfway through it (handled messages to pick from)."""
    tasks = {}
    if args.plant_loss:
        tasks["loss"] = group.create_task(plant(
            dsn, mode, address, block="plant_loss", count=args.plant_loss, after=0.0,
            until=args.stream_seconds))
    if args.plant_duplicate:
        tasks["duplicate"] = group.create_task(plant(
            dsn, mode, address, block="plant_duplicate", count=args.plant_duplicate,
            after=args.stream_seconds / 2, until=args.stream_seconds))
    return tasks


async def _settle(dsn: str, queue: QueueAddress, delayed: QueueAddress, in_flight: list[int],
                  supervisor: asyncio.Task[None], timeout: float) -> bool:  # noqa: ASYNC109
    """Wait until the queue and the delayed store are empty and nothing is in flight,
    :data:`QUIET_CHECKS` times in a row; ``False`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < QUIET_CHECKS:
        if supervisor.done():
            supervisor.result()  # the peeker could not be kept running: raise why
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(1.0)
        with contextlib.suppress(*TRANSIENT_ERRORS):
            connection = await connect(dsn)
            try:
                left = await connection.fetchval(
                    f"SELECT (SELECT count(*) FROM {queue.qualified}) "
                    f"+ (SELECT count(*) FROM {delayed.qualified})")
            finally:
                await connection.close()
            quiet = quiet + 1 if left == 0 and in_flight[0] == 0 else 0
    return True


def _mode_result(accounts: checks.Accounts, times: list[float], injector: FaultInjector,
                 started: float, settled: bool, restarts: int, replaced: int,
                 planted: Planted, saga: saga_checks.SagaAccounts | None) -> dict[str, Any]:
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for record in injector.records:
        if record.injected:
            by_kind[record.kind].append(record.at)
    recovered = {kind: recovery.recovery_times(times, at) for kind, at in by_kind.items()}
    failed = (checks.failed_checks(accounts) + saga_checks.saga_failed_checks(saga)
              + ([] if settled else ["settled"]))
    span = (times[-1] - times[0]) if len(times) > 1 else 0.0
    result = {
        **msgspec.to_builtins(accounts),
        **(msgspec.to_builtins(saga) if saga is not None else {}),
        "recovery_s": recovery.summarize_recovery(recovered),
        "planted": msgspec.to_builtins(planted),
        "faults": {kind: len(at) for kind, at in by_kind.items()},
        "faults_not_injected": [msgspec.to_builtins(r) for r in injector.records
                                if not r.injected],
        "handled_per_s": round(len(times) / span, 1) if span else None,
        "seconds": round(time.time() - started, 1),
        "peeker_restarts": restarts, "receivers_replaced_by_last_peeker": replaced,
        "failed_checks": failed, "ok": not failed,
    }
    progress(f"chaos: {accounts.mode}: sent {accounts.sent} handled {accounts.handled} "
             f"error_queue {accounts.error_queue} expired {accounts.expired} discarded "
             f"{accounts.discarded} lost {accounts.lost} (traced {accounts.lost_traced}) "
             f"duplicates {accounts.duplicate_effects} ghosts {accounts.ghost_sends} "
             f"fate_mismatches {accounts.fate_mismatches}; "
             + (f"saga updates {saga.saga_updates} lost {saga.saga_lost_updates} doubled "
                f"{saga.saga_doubled_updates} misplaced {saga.saga_misplaced_updates}; "
                if saga is not None else "")
             + f"{'ok' if not failed else 'FAILED: ' + ', '.join(failed)}")
    return result
