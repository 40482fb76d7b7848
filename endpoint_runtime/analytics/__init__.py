"""The data pipeline on Spark: ``endpoint-runtime report``.

A PySpark job over the operational data (``audit_log``, ``error_log``) that writes per-day
Parquet aggregates and an HTML report with PNG plots: throughput, latency percentiles,
failure rates and exceptions per endpoint and message type, the conversation flow graph and
the slowest conversations. Runs in local mode by default and unchanged on a cluster
(``--master spark://...`` or ``spark-submit -m endpoint_runtime.analytics``).

Example::

    from endpoint_runtime.analytics import ReportOptions, run_report
    result = run_report(ReportOptions(dsn=resolve_dsn(None), out=Path("report")))
    print(result.html)

PySpark is an optional dependency (``pip install 'endpoint-runtime[report]'``): importing this
package does not import it; :func:`run_report` does.

Modules: ``options`` (what to report), ``prerequisites`` (Java, driver), ``jdbc`` (DSN to
JDBC), ``session`` (Spark), ``sources`` (partitioned reads, the xid horizon), ``extract``
(the raw Parquet copy and its manifest), ``outputs`` (day partitions published by rename),
``measures`` (KLL sketches), ``minutes``, ``failures``, ``conversations``, ``summary``,
``timeline`` (the aggregates), ``plots``, ``units``, ``page``, ``rendering`` (the output),
``registration`` (the horizon for retention), ``job`` (the stages), ``progress``,
``stream_source`` and ``live`` (``--follow``: Structured Streaming into the per-minute tables).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from endpoint_runtime.analytics.options import ReportOptions, parse_time
from endpoint_runtime.analytics.prerequisites import MissingPrerequisiteError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from endpoint_runtime.analytics.result import ReportResult

__all__ = ["MissingPrerequisiteError", "ReportOptions", "parse_time", "run_report"]


def run_report(options: ReportOptions, spark: SparkSession | None = None) -> ReportResult:
    """Run the report (see :func:`endpoint_runtime.analytics.job.run`); with
    ``options.follow``, the live mode until interrupted (:func:`~endpoint_runtime.
    analytics.live.follow`)."""
    from endpoint_runtime.analytics.job import run

    if options.follow is not None:
        from endpoint_runtime.analytics.live import follow

        return follow(options, options.follow, spark)
    return run(options, spark)
