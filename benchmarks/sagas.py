"""Saga messages against a plain handler doing the same work by hand, two queues at once.

In one process, without Ray, atomic mode (``--batch-size N``: batched): side ``saga`` is an
endpoint whose saga ``Counter`` counts ``Increment`` messages per key (find by correlation
value, decode the state, change it, save with the version check); side ``by_hand`` is an
endpoint whose plain handler does the same work itself, in the same transaction: ``SELECT`` the
row by its correlation value, decode the state, change it, ``UPDATE ... WHERE "Id" = $1 AND
"Concurrency" = $2``. Both tables have the same layout and the same ``--keys`` live instances
(every message is an update). Both sides run at the same moment, each ``--slots`` receive slots
on its own queue, so the load of a shared machine falls on both alike; the side started first
alternates. Per window: messages the saga side processed / messages the by-hand side processed
(target >= 0.9). Each window also checks that every side's instances add up to the messages it
processed (nothing lost or doubled).

Run ``python -m benchmarks.sagas --help``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from typing import Any

import asyncpg
import msgspec

from benchmarks.common import run_async, throwaway_database
from endpoint_runtime import Endpoint, HandlerContext
from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.sagas.storage import SagaTable
from endpoint_runtime.connections.connecting import PostgresTransport, connect_pool
from endpoint_runtime.connections.embedded import resolve_dsn, with_database
from endpoint_runtime.errors import SagaConcurrencyError
from endpoint_runtime.sagas import Saga, starts
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress, sending


class Increment(msgspec.Struct):
    __message_type_name__ = "Benchmarks.Messages.Increment"
    key: str


class CounterState(msgspec.Struct):
    key: str = ""
    count: int = 0


class Counter(Saga[CounterState]):
    correlation = "key"

    @starts(correlate="key")
    async def increment(self, message: Increment, context: HandlerContext) -> None:
        self.state.count += 1


BY_HAND = SagaTable(QueueAddress("bench_by_hand_Counter"), "key")
_state = msgspec.json.Decoder(CounterState)
_encoder = msgspec.json.Encoder()


async def increment_by_hand(message: Increment, context: HandlerContext) -> None:
    """The saga's work written out: load by correlation value, change, save with the check."""
    row = await context.connection.fetchrow(
        f'SELECT "Id", "Concurrency", "Data" FROM {BY_HAND.address.qualified} '
        f'WHERE "Correlation_key" = $1', message.key)
    if row is None:
        raise LookupError(f"no instance for {message.key}")
    state = _state.decode(row["Data"])
    state.count += 1
    status = await context.connection.execute(
        f'UPDATE {BY_HAND.address.qualified} SET "Data" = $3::jsonb, "Concurrency" = $2 + 1 '
        f'WHERE "Id" = $1 AND "Concurrency" = $2', row["Id"], row["Concurrency"],
        _encoder.encode(state).decode())
    if status != "UPDATE 1":
        raise SagaConcurrencyError(f"counter {message.key} changed")


Sides = dict[str, tuple[Endpoint, SagaTable]]


def make_sides(batch_size: int) -> Sides:
    """The two endpoints (``batch_size`` > 1: batched atomic receive) and their tables."""
    options = {"immediate_retries": 5, "delayed_retries": 0, "batch_size": batch_size}
    saga_side = Endpoint("bench_saga", **options)
    saga_side.saga(Counter)
    by_hand_side = Endpoint("bench_by_hand", **options)
    by_hand_side.register(increment_by_hand)
    return {"saga": (saga_side, saga_side.sagas.definitions[0].table),
            "by_hand": (by_hand_side, BY_HAND)}


async def run_side(pool: asyncpg.Pool, endpoint: Endpoint, slots: int,
                   stop: asyncio.Event) -> None:
    strategy = endpoint.create_strategy(endpoint.create_pipeline(), pool, endpoint.settings)

    async def slot() -> None:
        async with pool.acquire() as connection:
            receive_slot = strategy.open_slot(connection)
            while not stop.is_set():
                await receive_slot.round()
            await receive_slot.close()

    await asyncio.gather(*(slot() for _ in range(slots)))


async def reset(pool: asyncpg.Pool, sides: Sides, keys: int, backlog: int) -> None:
    """Every side: ``keys`` instances at count 0, a backlog of increments spread over them."""
    messages = [create_outgoing(Increment(f"k{i % keys}"), originating_endpoint="bench")
                for i in range(backlog)]
    version = sides["saga"][0].sagas.definitions[0].version
    for endpoint, table in sides.values():
        await pool.execute(f"TRUNCATE {table.address.qualified}, {endpoint.address.qualified}")
        await pool.execute(
            f'INSERT INTO {table.address.qualified} ("Id", "Metadata", "Data", '
            f'"PersistenceVersion", "SagaTypeVersion", "Concurrency", "Correlation_key") '
            f"SELECT gen_random_uuid(), '{{}}', json_build_object('key', 'k' || i, 'count', 0),"
            f" 'bench', $2, 1, 'k' || i FROM generate_series(0, $1 - 1) AS i",
            keys, version)
        async with pool.acquire() as connection, connection.transaction():
            for start in range(0, backlog, 1000):
                await sending.send_many(connection, endpoint.address,
                                        messages[start:start + 1000])
        await pool.execute(f"VACUUM ANALYZE {table.address.qualified}")
        await pool.execute(f"VACUUM ANALYZE {endpoint.address.qualified}")


async def processed(pool: asyncpg.Pool, endpoint: Endpoint, table: SagaTable,
                    backlog: int) -> int:
    done = backlog - await pool.fetchval(f"SELECT count(*) FROM {endpoint.address.qualified}")
    counted = await pool.fetchval(
        f"""SELECT coalesce(sum(("Data"->>'count')::int), 0) FROM {table.address.qualified}""")
    if counted != done:
        raise SystemExit(f"{endpoint.name}: counted {counted}, processed {done}")
    return done


async def compare(pool: asyncpg.Pool, sides: Sides,
                  args: argparse.Namespace) -> dict[str, Any]:
    ratios, windows = [], []
    for window in range(args.windows):
        await reset(pool, sides, args.keys, args.backlog)
        stop = asyncio.Event()
        order = list(sides.values()) if window % 2 == 0 else list(sides.values())[::-1]
        running = [asyncio.create_task(run_side(pool, endpoint, args.slots, stop))
                   for endpoint, _ in order]
        await asyncio.sleep(args.seconds)
        stop.set()
        await asyncio.gather(*running)
        done = {name: await processed(pool, endpoint, table, args.backlog)
                for name, (endpoint, table) in sides.items()}
        if max(done.values()) >= args.backlog:
            raise SystemExit(f"a backlog of {args.backlog} ran out within the window: raise it")
        ratios.append(done["saga"] / done["by_hand"])
        windows.append([done["by_hand"], done["saga"]])
    return {"ratio_median": round(statistics.median(ratios), 3),
            "ratios": [round(r, 3) for r in ratios],
            "processed_by_hand_saga": windows}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = resolve_dsn(args.dsn)
    sides = make_sides(args.batch_size)
    async with throwaway_database(server, "er_sagas_bench") as name:
        dsn = with_database(server, name)
        async with PostgresTransport.connect(TransportSettings(dsn=dsn)) as transport:
            for endpoint, table in sides.values():
                await transport.create_queue(endpoint.address)
                async with transport.pool.acquire() as connection:
                    await table.setup(connection)
        pool = await connect_pool(dsn, min_size=1, max_size=2 * args.slots + 4)
        try:
            return {"benchmark": "sagas", "mode": "sends_atomic_with_receive",
                    "batch_size": args.batch_size, "windows": args.windows,
                    "seconds": args.seconds, "slots": args.slots, "keys": args.keys,
                    "target": 0.9, **await compare(pool, sides, args)}
        finally:
            await pool.close()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sagas",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=10, help="windows (each side per window)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a window")
    parser.add_argument("--slots", type=int, default=4, help="receive slots per side")
    parser.add_argument("--keys", type=int, default=1000, help="saga instances per side")
    parser.add_argument("--batch-size", type=int, default=1,
                        help="messages per transaction (> 1: batched atomic receive)")
    parser.add_argument("--backlog", type=int, default=10_000, help="messages per side and window")
    parser.add_argument("--dsn", default="", help="PostgreSQL server (default: embedded)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run_async(main(parse()))), flush=True)
