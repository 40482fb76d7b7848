"""``python -m endpoint_runtime.analytics``: the report as a Spark application, e.g.::

    spark-submit --master spark://host:7077 \\
        --jars /usr/share/java/postgresql.jar \\
        "$(python -c 'import endpoint_runtime.analytics.__main__ as m; print(m.__file__)')" \\
        --dsn postgresql://report@db/app --out /shared/report

The DSN is ``--dsn``, else resolved like every other command (``ENDPOINT_RUNTIME_DSN``,
libpq ``PG*`` variables, else the embedded server).
"""

from __future__ import annotations

import argparse
import sys

from endpoint_runtime.analytics.options import add_arguments, options_from

PROG = "python -m endpoint_runtime.analytics"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="The endpoint-runtime report as a Spark application.")
    parser.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: as the CLI)")
    parser.add_argument("--schema", default="public", help="schema of audit_log and error_log")
    add_arguments(parser)
    args = parser.parse_args(argv)
    from endpoint_runtime.analytics import run_report
    from endpoint_runtime.connections.embedded import resolve_dsn
    from endpoint_runtime.errors import EndpointRuntimeError

    try:
        options = options_from(args, resolve_dsn(args.dsn), args.schema)
        result = run_report(options)
    except (EndpointRuntimeError, argparse.ArgumentTypeError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {result.html}")
    print(f"parquet: {result.parquet}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
