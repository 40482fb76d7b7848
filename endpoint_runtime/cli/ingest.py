"""``endpoint-runtime ingest``: run the ingestion endpoint (audit queue -> ``audit_log``, error
queue -> ``error_log``) on Ray until SIGINT/SIGTERM, like ``run`` does any endpoint.

Beside endpoints, in the same process and on the same Ray, it is ``run ... --ingest``.

Example::

    endpoint-runtime ingest --max-concurrency 4
    endpoint-runtime ingest --endpoint my_app.ops:ingestion   # an IngestionEndpoint of yours
"""

from __future__ import annotations

import argparse

from endpoint_runtime.cli import run
from endpoint_runtime.settings import TransportSettings


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    ingest = commands.add_parser(
        "ingest", parents=[common], help="record audit copies and failed messages",
        description="Deploy the ingestion endpoint on Ray: it consumes the audit queue into "
        "audit_log and records the error queue into error_log (leaving its messages there for "
        "`errors retry`). Stops gracefully on SIGINT/SIGTERM. `run ENDPOINT... --ingest` runs "
        "it beside endpoints, in one process.",
    )
    ingest.add_argument("--endpoint", default=run.INGESTION_ENDPOINT, metavar="MODULE:ATTR",
                        help=f"an IngestionEndpoint (default {run.INGESTION_ENDPOINT}: queues "
                        "audit and error)")
    run.add_deployment_options(ingest)
    ingest.set_defaults(handler=ingest_command, log_level="info")


async def ingest_command(args: argparse.Namespace, settings: TransportSettings) -> int:
    """``run`` with the ingestion endpoint (or ``--endpoint``) as its only endpoint."""
    args.endpoints, args.ingest = [args.endpoint], False
    return await run.run_command(args, settings)
