"""The raw extract: a Parquet copy of ``audit_log`` and ``error_log``, partitioned by day,
that each run appends the rows new since its horizon to, and that the aggregations read.

``<out>/extract/manifest.json`` is the commit point: it names the horizon (every row of a
transaction below it is in the extract) and the files that hold the extract. A run writes its
new files first (under ``_staging``, then renamed into ``audit/day=.../`` and
``errors/day=.../``), publishes its aggregates, and only then replaces the manifest (written
to a temporary file and renamed over the old one). Readers read only the files the manifest
names, so a run that stops anywhere before the manifest is replaced leaves files no reader
sees; the next run deletes them (:func:`remove_unlisted`) and reads the same rows again from
the old horizon: a rerun is idempotent.

Example::

    manifest = load(root)
    remove_unlisted(root, manifest)
    files = append(frame, root, "audit", run_id)
    save(root, manifest.advanced(horizon, {"audit": files}))
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StringType, StructField, StructType

MANIFEST = "manifest.json"
STAGING = "_staging"
VERSION = 1
TABLES = ("audit", "errors")
RETENTION_UNKNOWN = "0000-00-00"
"""``expired_before`` of a manifest written before the field existed: whether retention ran
is not known, so it counts as having run (before every day)."""


@dataclass(frozen=True)
class Manifest:
    """What the extract holds: its horizon, its files per table (relative to the root), and
    how many rows of each table had a NULL in each timestamp column (skipped, counted)."""

    horizon: int | None = None
    files: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TABLES})
    null_counts: dict[str, int] = field(default_factory=dict)
    runs: int = 0
    pending: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TABLES})
    """Files the live mode added (listed in ``files`` too) whose days the next run
    recomputes: their minutes are current, their other tables not yet."""
    expired_before: str | None = None
    """The latest retention cutoff applied (``--keep-days``, ``yyyy-MM-dd``;
    ``RETENTION_UNKNOWN`` for a manifest written before the field), ``None`` if no run
    applied one: until then every conversation of the extract's rows (but those of pending
    files) is in the ``conversations`` table under its start day, which the incremental runs
    read instead of the extract's rows (:mod:`~endpoint_runtime.analytics.conversations`)."""

    def advanced(self, horizon: int, new_files: dict[str, list[str]],
                 new_nulls: dict[str, int]) -> Manifest:
        files = {t: [*self.files.get(t, []), *new_files.get(t, [])] for t in TABLES}
        nulls = dict(self.null_counts)
        for key, count in new_nulls.items():
            nulls[key] = nulls.get(key, 0) + count
        return replace(self, horizon=horizon, files=files, null_counts=nulls,
                       runs=self.runs + 1, pending={t: [] for t in TABLES})

    def streamed(self, horizon: int, new_files: dict[str, list[str]],
                 new_nulls: dict[str, int]) -> Manifest:
        """Advanced by a micro-batch of the live mode: its files stay pending."""
        pending = {t: [*self.pending.get(t, []), *new_files.get(t, [])] for t in TABLES}
        return replace(self.advanced(horizon, new_files, new_nulls), pending=pending)

    def pending_days(self) -> set[str]:
        return days_of([name for names in self.pending.values() for name in names])


def day_of(name: str) -> str | None:
    """The day of an extract file (``audit/day=2026-03-02/x.parquet``), ``None`` for rows
    without one."""
    folder = Path(name).parent.name.removeprefix("day=")
    return None if folder.startswith("__HIVE_DEFAULT") else folder


def days_of(names: list[str]) -> set[str]:
    """The days of extract files (rows without their table's time have none)."""
    return {day for name in names if (day := day_of(name)) is not None}


def expired(manifest: Manifest, before: str) -> tuple[Manifest, list[str]]:
    """The manifest without the files of days before ``before`` (``yyyy-MM-dd``), and those
    files (delete them once the new manifest is saved)."""
    kept: dict[str, list[str]] = {}
    dropped: list[str] = []

    for table, names in manifest.files.items():
        kept[table] = []
        for name in names:
            day = day_of(name)
            (dropped if day is not None and day < before else kept[table]).append(name)
    gone = set(dropped)
    pending = {t: [n for n in names if n not in gone] for t, names in manifest.pending.items()}
    cutoff = max(before, manifest.expired_before or before)
    return replace(manifest, files=kept, pending=pending, expired_before=cutoff), dropped


def load(root: Path) -> Manifest:
    path = root / MANIFEST
    if not path.exists():
        return Manifest()
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("version") != VERSION:
        raise ValueError(f"{path}: extract version {data.get('version')!r}, expected {VERSION}")
    return Manifest(horizon=data["horizon"], files={t: list(data["files"].get(t, []))
                                                    for t in TABLES},
                    null_counts=dict(data.get("null_counts", {})), runs=int(data["runs"]),
                    pending={t: list(data.get("pending", {}).get(t, [])) for t in TABLES},
                    expired_before=data.get("expired_before", RETENTION_UNKNOWN))


def save(root: Path, manifest: Manifest) -> None:
    """Replace the manifest atomically (write a temporary file, fsync, rename)."""
    root.mkdir(parents=True, exist_ok=True)
    data = {"version": VERSION, "horizon": manifest.horizon, "runs": manifest.runs,
            "files": manifest.files, "null_counts": manifest.null_counts,
            "pending": manifest.pending, "expired_before": manifest.expired_before}
    temporary = root / f".{MANIFEST}.{uuid.uuid4().hex}"
    with temporary.open("w", encoding="utf-8") as file:
        json.dump(data, file, indent=1)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, root / MANIFEST)


def remove_unlisted(root: Path, manifest: Manifest) -> list[Path]:
    """Delete what a run that stopped before its manifest left: staged and unlisted files."""
    removed: list[Path] = []
    shutil.rmtree(root / STAGING, ignore_errors=True)
    for table in TABLES:
        listed = {root / name for name in manifest.files.get(table, [])}
        for path in sorted((root / table).glob("day=*/*")):
            if path not in listed:
                path.unlink()
                removed.append(path)
    return removed


def append(frame: DataFrame, root: Path, table: str, run_id: str) -> list[str]:
    """Write ``frame`` (with its ``day`` column) as new files of ``table`` (one per read
    partition and day: no shuffle) and return their paths relative to ``root`` (not yet
    listed in the manifest)."""
    staged = root / STAGING / run_id / table
    frame.write.mode("overwrite").partitionBy("day").parquet(str(staged))
    names: list[str] = []
    for number, part in enumerate(sorted(staged.glob("day=*/*.parquet"))):
        target = root / table / part.parent.name / f"{run_id}-{number:05d}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, target)
        names.append(str(target.relative_to(root)))
    shutil.rmtree(root / STAGING / run_id, ignore_errors=True)
    return names


def with_day(schema: StructType) -> StructType:
    return StructType([*schema.fields, StructField("day", StringType())])


def read(spark: SparkSession, root: Path, table: str, schema: StructType,
         files: list[str]) -> DataFrame:
    """The rows of the listed files (``day`` from their folder), or an empty frame."""
    full = with_day(schema)
    if not files:
        return spark.createDataFrame([], full)
    return (spark.read.schema(full).option("basePath", str(root / table))
            .parquet(*(str(root / name) for name in files)))
