"""The launcher test's checks (tests/cluster/launcher.sh test), after the page's steps ran.

    python -m tests.cluster.launcher_job report SUBMIT_LOG --killed NODE_ID
        on the machine running `ray up`: reads the submit script's output (its last line,
        ``submit_result {json}``), checks that receivers ran on every node and that the killed
        node processed messages before it died (it was lost mid-drain), and prints
        ``processed N`` for the next step.
    python -m tests.cluster.launcher_job rows --sent N --processed P [--config FILE]
        on the head (``ray exec``): the business table must hold exactly one row per message
        sent, and the submit script's total must be that count; the queue must be empty.

Exit status 0 when all holds, 1 otherwise, each failure printed as ``launcher job: FAILED:``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import msgspec

from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.connections.embedded import resolve_dsn
from endpoint_runtime.settings import TransportSettings, load_settings
from tests.cluster.launcher_endpoints import QUEUE, TABLE

NODES = 3


def submit_result(text: str) -> dict[str, Any] | None:
    """The JSON of the last ``submit_result`` line of the submit script's output."""
    lines = [line for line in text.splitlines() if line.startswith("submit_result ")]
    return json.loads(lines[-1].removeprefix("submit_result ")) if lines else None


def report_problems(result: dict[str, Any] | None, killed: str) -> list[str]:
    if result is None:
        return ["the submit script printed no submit_result line"]
    nodes = result.get("nodes", [])
    problems = []
    with_receivers = {node["address"] for node in nodes if node["receivers"] > 0}
    if len(with_receivers) < NODES:
        problems.append(f"receivers ran on {sorted(with_receivers)}, not on {NODES} nodes")
    lost = [node for node in nodes if node["node_id"] == killed]
    if not lost:
        problems.append(f"the killed node {killed[:12]} is not in the report")
    elif lost[0]["alive"]:
        problems.append(f"the killed node {killed[:12]} is reported alive")
    elif lost[0]["processed"] == 0:
        problems.append(f"the killed node {killed[:12]} processed nothing: not lost mid-drain")
    return problems


async def count_rows(settings: TransportSettings) -> tuple[int, int, int]:
    async with PostgresTransport.connect(settings) as transport:
        rows, distinct = await transport.pool.fetchrow(
            f"SELECT count(*), count(DISTINCT message_id) FROM {TABLE}")
        return rows, distinct, await transport.depth(QUEUE)


def rows_problems(rows: int, distinct: int, depth: int, sent: int,
                  processed: int) -> list[str]:
    problems = []
    if distinct != sent:
        problems.append(f"{distinct} messages have a row, {sent} were sent")
    if rows != distinct:
        problems.append(f"{rows - distinct} messages were handled more than once")
    if processed != rows:
        problems.append(f"the submit script reported {processed} processed, "
                        f"the business table holds {rows} rows")
    if depth:
        problems.append(f"{depth} messages left in the queue")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.launcher_job")
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report")
    report.add_argument("submit_log")
    report.add_argument("--killed", required=True, metavar="NODE_ID")
    rows = commands.add_parser("rows")
    rows.add_argument("--sent", type=int, required=True)
    rows.add_argument("--processed", type=int, required=True)
    rows.add_argument("--config", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    if args.command == "report":
        with open(args.submit_log) as log:
            result = submit_result(log.read())
        problems = report_problems(result, args.killed)
        if result is not None:
            for node in result.get("nodes", []):
                print(f"node {node['node_id'][:12]} {node['address']} "
                      f"{'alive' if node['alive'] else 'dead'} receivers={node['receivers']} "
                      f"processed={node['processed']}", flush=True)
            print(f"processed {result.get('processed')}", flush=True)
    else:
        settings = load_settings(TransportSettings, path=args.config, table="transport")
        settings = msgspec.structs.replace(settings, dsn=resolve_dsn(settings.dsn))
        counts = asyncio.run(count_rows(settings))
        print(f"business rows {counts[0]} (distinct messages {counts[1]}) for {args.sent} "
              f"sent; submit_result.processed {args.processed}; queue depth {counts[2]}",
              flush=True)
        problems = rows_problems(*counts, sent=args.sent, processed=args.processed)
    for problem in problems:
        print(f"launcher job: FAILED: {problem}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
