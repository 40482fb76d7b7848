"""The aggregate tables in ``<out>/parquet/<table>/day=YYYY-MM-DD/``, each day written whole.

A run computes the days it affects from the extract's rows and publishes each of them by
rename: the new day is written under ``_staging``, then the old folder is moved aside and the
new one moved in (the old one deleted after). A day the run affects that no longer has rows
(a conversation whose start moved to an earlier day) is removed. A reader sees a day either
before or after the run, never half of it. Each day is one file (the frame is partitioned by
day before the write).

A table with no day at all holds one empty Parquet file with its columns, so that readers
get an empty table rather than ``UNABLE_TO_INFER_SCHEMA``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Collection
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

STAGING = "_staging"
EMPTY = "empty.parquet"
SCHEMA = "_schema.json"
"""The table's columns (Spark's JSON form); Spark skips files whose name starts with ``_``."""


def publish(frame: DataFrame, table: Path, days: Collection[str] | None) -> list[str]:
    """Replace ``days`` of ``table`` (``None``: every day, the others removed) with the rows
    of ``frame`` (which holds only those days); returns the days written."""
    if days is not None and not days and table.exists():
        return []  # nothing to replace
    run = uuid.uuid4().hex
    staged = table.parent / STAGING / run / table.name
    frame.repartition("day").write.mode("overwrite").partitionBy("day").parquet(str(staged))
    written = sorted(path.name.removeprefix("day=") for path in staged.glob("day=*"))
    table.mkdir(parents=True, exist_ok=True)
    replaced = set(written) | (set(days) if days is not None else
                               {path.name.removeprefix("day=") for path in table.glob("day=*")})
    trash = table.parent / STAGING / run / "old"
    trash.mkdir(parents=True, exist_ok=True)
    for day in sorted(replaced):
        current = table / f"day={day}"
        if current.exists():
            current.rename(trash / current.name)
        if day in written:
            (staged / f"day={day}").rename(current)
    _mark_empty(frame, table, staged)
    _keep_schema(frame.schema, table)
    shutil.rmtree(table.parent / STAGING / run, ignore_errors=True)
    return written


def interrupted(parquet: Path) -> bool:
    """Whether a run stopped in the middle of a publish into ``parquet``: its staging is
    still there, and a day of a table may be missing (moved aside, the new one not yet in)."""
    staging = parquet / STAGING
    return staging.is_dir() and any(staging.iterdir())


def clear_interrupted(parquet: Path) -> None:
    """Delete what stopped publishes left (under the output's lock, once the run that redid
    their days has published)."""
    shutil.rmtree(parquet / STAGING, ignore_errors=True)


def _keep_schema(schema: StructType, table: Path) -> None:
    """The table's columns beside it (replaced atomically): a reader that is not given them
    needs no Spark job to infer them from the files' footers."""
    kept = table / SCHEMA
    if kept.exists() and kept.read_text(encoding="utf-8") == schema.json():
        return
    temporary = table / f".{SCHEMA}.{uuid.uuid4().hex}"
    temporary.write_text(schema.json(), encoding="utf-8")
    os.replace(temporary, kept)


def _mark_empty(frame: DataFrame, table: Path, staged: Path) -> None:
    empty = table / EMPTY
    if any(table.glob("day=*")):
        empty.unlink(missing_ok=True)
        return
    if empty.exists():
        return
    holder = staged.parent / "empty"
    frame.limit(0).coalesce(1).write.mode("overwrite").parquet(str(holder))
    part = next(holder.glob("*.parquet"))
    part.rename(empty)


def read(spark: SparkSession, table: Path, schema: StructType | None = None
         ) -> DataFrame | None:
    """The table as written (``day`` a string), or ``None`` when it was never written.
    ``schema``: the columns it was written with (else those kept beside it, else inferred
    from its files: a Spark job of its own)."""
    if not table.exists():
        return None
    if schema is None and (table / SCHEMA).exists():
        schema = StructType.fromJson(json.loads((table / SCHEMA).read_text(encoding="utf-8")))
    reader = spark.read if schema is None else spark.read.schema(schema)
    frame = reader.parquet(str(table))
    return frame.withColumn("day", frame["day"].cast("string"))
