"""What the ledger observed of one mode's run, read from the run's database at its end
(the input of :func:`benchmarks.chaos.checks.account`)."""

from __future__ import annotations

import collections
import uuid
from collections.abc import Mapping
from typing import Any

import asyncpg

from benchmarks.chaos.checks import CutAt, Observed, Receive
from benchmarks.chaos.drivers import FaultRecord
from benchmarks.chaos.endpoints import ERROR_QUEUE, SINK
from benchmarks.chaos.ledger import RUN_APPLICATIONS, sql
from benchmarks.chaos.pooler import client_port_of
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.wire.messages import ErrorHeaders, Headers, decode_headers


async def read_observed(connection: asyncpg.Connection, mode: str, queue: QueueAddress,
                        delayed: QueueAddress,
                        faults: list[FaultRecord]) -> tuple[Observed, list[float]]:
    """``mode``'s observations, and the sorted epoch times of its committed effects."""
    sent = {r["message_id"]: r["kind"] for r in await connection.fetch(sql("sent"), mode)}
    effects: collections.Counter[uuid.UUID] = collections.Counter()
    times = []
    for row in await connection.fetch(sql("effects"), mode):
        effects[row["message_id"]] += 1
        times.append(row["at"])
    error_queue = dict(_error_copy(r["id"], r["headers"]) for r in await connection.fetch(
        sql("error_rows", queue=QueueAddress.parse(ERROR_QUEUE).qualified)))
    echoes: collections.Counter[uuid.UUID] = collections.Counter({
        uuid.UUID(r["origin"]): r["n"] for r in await connection.fetch(
            sql("echoes", queue=QueueAddress.parse(SINK).qualified))})
    queued: set[uuid.UUID] = set()
    counts = []
    for address in (queue, delayed):
        ids = [r["id"] for r in await connection.fetch(
            sql("queued_ids", queue=address.qualified))]
        queued.update(ids)
        counts.append(len(ids))
    receives = [receive_of(r) for r in await connection.fetch(sql("received"), queue.table,
                                                              RUN_APPLICATIONS)]
    cuts = [CutAt(at=f.cut.at or f.at, ports=frozenset(f.cut.ports),
                  backends=frozenset(f.cut.backends), kind=f.kind)
            for f in faults if f.injected]
    observed = Observed(
        mode=mode, sent=sent, effects=effects, error_queue=error_queue,
        expired={r["message_id"] for r in await connection.fetch(sql("expired"), queue.table)},
        discards={r["message_id"] for r in await connection.fetch(sql("discards"), mode)},
        queued=queued, echoes=echoes, receives=receives, cuts=cuts,
        left_in_queue=counts[0], left_in_delayed=counts[1])
    return observed, times


def receive_of(row: Mapping[str, Any]) -> Receive:
    """A row of the ``received`` statement as a :class:`Receive`. Behind the run's pooler the
    server's client is the pooler: the runtime's own end of its connection is the port the
    pooler appended to ``application_name``."""
    return Receive(row["message_id"], row["backend"],
                   client_port_of(row["application"]) or row["client_port"], row["at"],
                   row["application"])


def _error_copy(row_id: uuid.UUID, raw_headers: str) -> tuple[uuid.UUID, str]:
    """The native id a row of the error queue had (a copy under a fresh id names it) and the
    exception type it was charged with ("" for a raw row whose headers never parsed)."""
    try:
        headers = decode_headers(raw_headers)
    except Exception:  # headers that never parsed: the raw row kept its id
        return row_id, ""
    original = headers.get(Headers.ORIGINAL_NATIVE_ID)
    return (uuid.UUID(original) if original else row_id,
            headers.get(ErrorHeaders.EXCEPTION_TYPE, ""))
