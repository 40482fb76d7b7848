"""Batched endpoints whose handler does what the message asks (importable by path).

One handler, two endpoints: ``optimistic`` (the default ``batch_isolation``) and ``savepoints``
(a savepoint per message). A user step records per message number the after-commit hooks (which
messages' work committed) and the rollbacks charged with the failure of the commit itself.
"""

from __future__ import annotations

import collections

import asyncpg
import msgspec

from endpoint_runtime import Endpoint, HandlerContext, IncomingContext, Next

TABLES = """
CREATE TABLE entries (n integer NOT NULL);
CREATE TABLE taken (key integer PRIMARY KEY);
INSERT INTO taken VALUES (1);
CREATE TABLE entry_parents (id integer PRIMARY KEY);
CREATE TABLE entry_children (
    parent integer REFERENCES entry_parents (id) DEFERRABLE INITIALLY DEFERRED);
ALTER TABLE entries_out ADD CONSTRAINT refuses_marked_sends
    CHECK (position('refuse-this-send' in headers) = 0);
"""
OUT = "entries_out"


class Entry(msgspec.Struct):
    n: int
    action: str = "write"
    """write | fail_after_write | fail_before_write | swallow | deferred_violation |
    own_savepoint | missing_queue | send_only | refused_send (a send the queue table's
    CHECK constraint refuses when it is written; neither of the last two uses the database)"""


class Booked(msgspec.Struct):
    n: int


class EntryFailedError(Exception):
    pass


RUNS: collections.Counter[int] = collections.Counter()
"""Handler runs per message number (a replayed message runs again)."""
COMMITTED: collections.Counter[int] = collections.Counter()
"""after_commit hooks per message number."""
CHARGED_AT_COMMIT: collections.Counter[int] = collections.Counter()
"""after_rollback hooks with a charged failure (of the commit) per message number."""


def reset() -> None:
    for counter in (RUNS, COMMITTED, CHARGED_AT_COMMIT):
        counter.clear()


async def book(message: Entry, context: HandlerContext) -> None:
    RUNS[message.n] += 1
    connection = context.connection
    action = message.action
    if action == "fail_before_write":
        raise EntryFailedError(f"entry {message.n} fails before writing")
    if action in ("send_only", "refused_send"):
        marked = {"Test.Refuse": "refuse-this-send"} if action == "refused_send" else None
        await context.send(Booked(message.n), destination=OUT, headers=marked)
        return
    if action == "swallow":
        try:  # noqa: SIM105 - the mistake the batch must survive: no savepoint
            await connection.execute("INSERT INTO taken (key) VALUES (1)")
        except asyncpg.UniqueViolationError:
            pass
        await context.send(Booked(message.n), destination=OUT)
        return
    await connection.execute("INSERT INTO entries (n) VALUES ($1)", message.n)
    if action == "deferred_violation":  # checked at the end of the transaction
        await connection.execute("INSERT INTO entry_children (parent) VALUES ($1)", message.n)
    elif action == "own_savepoint":
        try:
            async with connection.transaction():
                await connection.execute("INSERT INTO entries (n) VALUES ($1)", -message.n)
                raise EntryFailedError("undone by the handler's own savepoint")
        except EntryFailedError:
            pass
    await context.send(Booked(message.n),
                       destination="nowhere" if action == "missing_queue" else OUT)
    if action == "fail_after_write":
        raise EntryFailedError(f"entry {message.n} fails after writing")


async def record_hooks(context: IncomingContext, next: Next) -> None:
    n = msgspec.json.decode(context.transport_message.body, type=Entry).n

    def committed() -> None:
        COMMITTED[n] += 1

    def rolled_back(charged: BaseException | None) -> None:
        if charged is not None:
            CHARGED_AT_COMMIT[n] += 1

    context.unit.after_commit(committed)
    context.unit.after_rollback(rolled_back)
    await next(context)


def make(name: str, **options: object) -> Endpoint:
    endpoint = Endpoint(name, batch_size=10, immediate_retries=1, delayed_retries=0,
                        max_concurrency=1, **options)  # type: ignore[arg-type]
    endpoint.register(book)
    endpoint.add_step("record_hooks", record_hooks)
    return endpoint


optimistic = make("entries_optimistic")
savepoints = make("entries_savepoints", batch_isolation="savepoint")
