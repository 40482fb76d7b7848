"""What a report covers and where it goes: :class:`ReportOptions`, and the command-line
arguments shared by ``endpoint-runtime report`` and ``python -m endpoint_runtime.analytics``."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from endpoint_runtime.arguments import positive_int

AT_FILES = 16
"""A day partition of the extract is merged into one file once it holds this many."""

DEFAULT_OUT = Path("endpoint-runtime-report")
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)$")
_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """One run of the report.

    Example::

        ReportOptions(dsn=resolve_dsn(None), since=parse_time("24h"), out=Path("report"))
    """

    dsn: str
    schema: str = "public"
    since: datetime | None = None
    """Audit rows whose processing ended at or after this time (failures: time of failure)."""
    until: datetime | None = None
    """... and before this time."""
    master: str | None = None
    """Spark master URL; ``None``: ``local[*]``, or what ``spark-submit`` was given."""
    out: Path = DEFAULT_OUT
    partitions: int | None = None
    """JDBC read partitions per table; ``None``: from the row count and the cores."""
    conf: tuple[tuple[str, str], ...] = ()
    """Spark settings (``--conf key=value``), over the defaults."""
    render: bool = True
    """Compute the page's figures, draw the plots and write the page (the tests of the
    tables skip it)."""
    follow: float | None = None
    """``--follow``: seconds between incremental runs (the page and the whole-day tables)
    while the live mode streams the per-minute tables."""
    micro_batch: float = 5.0
    """``--micro-batch``: seconds between the live mode's micro-batches."""
    keep_days: int | None = None
    """``--keep-days``: the extract and the tables keep this many days (``None``: all)."""
    compact_at: int = AT_FILES
    """An incremental run merges a day partition of the extract once it holds this many
    files (:mod:`~endpoint_runtime.analytics.compaction`)."""

    @property
    def ad_hoc(self) -> bool:
        """A window given: read it from the database, keep and move no horizon."""
        return self.since is not None or self.until is not None

    def __repr__(self) -> str:
        from endpoint_runtime.connections.embedded import redact_dsn

        return (f"ReportOptions(dsn={redact_dsn(self.dsn)!r}, schema={self.schema!r}, "
                f"since={self.since}, until={self.until}, master={self.master!r}, "
                f"out={str(self.out)!r}, partitions={self.partitions}, conf={self.conf!r})")


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """``2026-11-23``, ``2026-11-23T08:00``, ``2026-11-23 08:00:00+01:00`` (no zone: UTC), or
    a time ago: ``90s``, ``15m``, ``6h``, ``7d``, ``2w``."""
    text = text.strip()
    match = _RELATIVE.match(text)
    if match:
        ago = timedelta(seconds=float(match[1]) * _UNITS[match[2]])
        return (now or datetime.now(UTC)) - ago
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        try:
            moment = datetime.combine(date.fromisoformat(text), datetime.min.time())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not a time: {text!r} (use 2026-11-23, 2026-11-23T08:00 or 6h, 7d ago)"
            ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def spark_setting(text: str) -> tuple[str, str]:
    """``key=value`` of ``--conf``."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"not key=value: {text!r}")
    return key.strip(), value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--since``, ``--until``, ``--master``, ``--conf``, ``--out``, ``--partitions``."""
    parser.add_argument("--since", type=parse_time, default=None, metavar="T",
                        help="ad-hoc report: only data from T on (2026-11-23, "
                        "2026-11-23T08:00, or 6h, 7d ago); keeps and moves no horizon")
    parser.add_argument("--until", type=parse_time, default=None, metavar="T",
                        help="ad-hoc report: only data before T (same forms as --since)")
    parser.add_argument("--follow", type=float, nargs="?", const=60.0, default=None,
                        metavar="SECONDS", help="keep the output current: an incremental "
                        "round every SECONDS (default 60) in one Spark session, until Ctrl-C")
    parser.add_argument("--micro-batch", type=float, default=5.0, metavar="SECONDS",
                        help="with --follow: a micro-batch into the per-minute tables every "
                        "SECONDS (default 5)")
    parser.add_argument("--keep-days", type=positive_int, default=None, metavar="N",
                        help="retention of the extract and the tables: days older than N "
                        "days before today (UTC) are deleted (default: kept)")
    parser.add_argument("--conf", type=spark_setting, action="append", default=[],
                        metavar="KEY=VALUE", help="a Spark setting, e.g. "
                        "spark.sql.shuffle.partitions=64 or spark.ui.enabled=true (repeat)")
    parser.add_argument("--master", default=None, metavar="URL",
                        help="Spark master: local[*] (default), local[N], spark://host:7077")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help=f"output directory (default ./{DEFAULT_OUT})")
    parser.add_argument("--partitions", type=positive_int, default=None, metavar="N",
                        help="JDBC read partitions per table (default: from rows and cores)")


def options_from(args: argparse.Namespace, dsn: str, schema: str) -> ReportOptions:
    if args.since and args.until and args.since >= args.until:
        raise argparse.ArgumentTypeError("--since must be before --until")
    if args.follow is not None and (args.since or args.until):
        raise argparse.ArgumentTypeError("--follow keeps a horizon: no --since/--until")
    if args.follow is not None and args.follow <= 0:
        raise argparse.ArgumentTypeError("--follow takes a positive number of seconds")
    if args.micro_batch <= 0:
        raise argparse.ArgumentTypeError("--micro-batch takes a positive number of seconds")
    return ReportOptions(dsn=dsn, schema=schema, since=args.since, until=args.until,
                         master=args.master, out=args.out, partitions=args.partitions,
                         conf=tuple(args.conf), follow=args.follow,
                         micro_batch=args.micro_batch,
                         keep_days=args.keep_days)
