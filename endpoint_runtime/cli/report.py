"""``endpoint-runtime report``: the PySpark report over ``audit_log`` and ``error_log``.

Throughput, latency percentiles, failure rates and exceptions per endpoint and message type,
the conversation flow graph and the slowest conversations, as per-day Parquet and an HTML
page with PNG plots. Needs the ``report`` extra (PySpark), Java 17+ and the PostgreSQL JDBC
driver (``bin/dev`` installs them); see docs/analytics.md.

Without ``--since``/``--until`` a run is incremental: it reads the rows new since the
output's horizon into its raw extract and recomputes the days they touch; ``--follow`` keeps
the per-minute tables current with Structured Streaming and redraws the page every minute.
With them it is an ad-hoc report of that window.

Example::

    endpoint-runtime report --out /srv/report               # nightly, from cron
    endpoint-runtime report --follow 60 --out /srv/report   # live
    endpoint-runtime report --since 24h --out /tmp/report   # ad-hoc
    endpoint-runtime report --master spark://head:7077 --conf spark.executor.memory=8g
"""

from __future__ import annotations

import argparse
import asyncio

from endpoint_runtime.cli.common import EXIT_OK
from endpoint_runtime.connections.embedded import resolve_dsn
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import TransportSettings


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    report = commands.add_parser(
        "report", parents=[common], help="the Spark report: throughput, latency, failures, flow",
        description="Run the PySpark report over audit_log and error_log: per-day Parquet "
        "aggregates and an HTML page with plots (throughput, latency percentiles, failure "
        "rates, exceptions, the conversation flow graph, the slowest conversations).",
    )
    # Imported when used: endpoint_runtime.analytics.options imports cli.common in turn.
    from endpoint_runtime.analytics.options import add_arguments

    add_arguments(report)
    report.set_defaults(handler=report_command)


async def report_command(args: argparse.Namespace, settings: TransportSettings) -> int:
    # Imported here: PySpark is optional, and the other commands should not pay for it.
    from endpoint_runtime.analytics import run_report
    from endpoint_runtime.analytics.options import options_from

    dsn = await asyncio.to_thread(resolve_dsn, settings.dsn)
    try:
        options = options_from(args, dsn, settings.schema)
    except argparse.ArgumentTypeError as exc:
        raise ConfigurationError(str(exc)) from None
    # Called on the loop's thread on purpose: nothing else runs on it meanwhile, and Ctrl-C
    # then reaches the Spark job (a worker thread would keep asyncio.run from returning).
    result = run_report(options)
    print(f"report: {result.html}")
    print(f"parquet: {result.parquet}")
    print(f"summary: {result.out / 'summary.json'}")
    return EXIT_OK
