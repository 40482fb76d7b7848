"""The job the launcher test submits (``ray submit ray_cluster.yaml ...``), run on the head.

It puts a backlog of ``N`` messages (default 600) in the ``cluster_work`` queue, drains it
with ``python -m endpoint_runtime.submit`` on the cluster's three nodes, and checks that each
message's row was committed exactly once and that receivers ran on every node. Exit status 0
when all holds, 1 otherwise (``ray submit`` then exits 1 too).
"""

from __future__ import annotations

import asyncio
import collections
import sys

from endpoint_runtime import submit
from endpoint_runtime.embedded import resolve_dsn
from endpoint_runtime.outgoing import create_outgoing
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import PostgresTransport
from tests.cluster.endpoints import Job

QUEUE = "cluster_work"
NODES = 3


async def prepare(settings: TransportSettings, count: int) -> None:
    async with PostgresTransport.connect(settings) as transport:
        await transport.pool.execute("DROP TABLE IF EXISTS handled")
        await transport.pool.execute("CREATE TABLE handled (n int, node text, pid int)")
        await transport.create_queue(QUEUE)
        await transport.purge(QUEUE)  # a rerun on the same head starts clean
        await transport.send_many(QUEUE, [create_outgoing(Job(n=n)) for n in range(count)])


async def check(settings: TransportSettings, count: int) -> list[str]:
    async with PostgresTransport.connect(settings) as transport:
        rows = await transport.pool.fetch("SELECT n, node FROM handled")
        depth = await transport.depth(QUEUE)
    numbers = collections.Counter(row["n"] for row in rows)
    per_node = collections.Counter(row["node"] for row in rows)
    print(f"handled rows: {len(rows)} for {count} messages; queue depth {depth}; "
          f"per node: {dict(per_node)}", flush=True)
    problems = []
    if sorted(numbers) != list(range(count)):
        problems.append(f"missing: {sorted(set(range(count)) - set(numbers))[:20]}")
    duplicated = [n for n, times in numbers.items() if times > 1]
    if duplicated:
        problems.append(f"handled more than once: {duplicated[:20]}")
    if depth:
        problems.append(f"{depth} messages left in the queue")
    if len(per_node) != NODES:
        problems.append(f"receivers ran on {len(per_node)} nodes, not {NODES}")
    return problems


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    settings = TransportSettings(dsn=resolve_dsn(None))
    asyncio.run(prepare(settings, count))
    status = submit.main(["tests.cluster.endpoints:work", "--nodes", str(NODES),
                          "--until-empty", "--status-interval", "2",
                          "--nodes-timeout", "180"])
    if status != 0:
        print(f"launcher job: submit exited {status}", flush=True)
        return 1
    problems = asyncio.run(check(settings, count))
    for problem in problems:
        print(f"launcher job: FAILED: {problem}", flush=True)
    if not problems:
        print(f"launcher job: OK: {count} messages, each handled once, on {NODES} nodes",
              flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
