"""Compaction of the raw extract: a day partition that has gathered many small files (a file
per run, or per micro-batch of ``--follow``, and per read partition) is merged into one.

It is part of an incremental run, under the output's lock, and commits with the run's
manifest: the merged file is written first (staged, then renamed into its day folder, under
a name no manifest lists yet), the manifest that lists it instead of the small files is
saved by the run, and only then are the small files deleted. A run that stops before its
manifest leaves the merged file unlisted (the next run deletes it, the small files are still
listed); one that stops after it leaves the small files unlisted (deleted the same way): no
row is lost or read twice either way. Files the live mode streamed and no run has redone the
day of yet (*pending*) are left as they are.

Example::

    manifest, merged = compacted(spark, root, manifest, schemas, at=16, run_id=run_id)
    extract.save(root, manifest)
    for name in merged:
        (root / name).unlink(missing_ok=True)
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from endpoint_runtime.analytics.extract import STAGING, TABLES, Manifest


def crowded(manifest: Manifest, table: str, at: int) -> dict[str, list[str]]:
    """The day folders of ``table`` with at least ``at`` files no stream holds pending, and
    those files."""
    pending = set(manifest.pending.get(table, []))
    folders: dict[str, list[str]] = defaultdict(list)
    for name in manifest.files.get(table, []):
        if name not in pending:
            folders[str(Path(name).parent)].append(name)
    return {folder: names for folder, names in folders.items() if len(names) >= at}


def compacted(spark: SparkSession, root: Path, manifest: Manifest,
              schemas: dict[str, StructType], at: int, run_id: str
              ) -> tuple[Manifest, list[str]]:
    """Merge the crowded day folders (one Spark job each): the manifest that lists the merged
    files instead of the small ones (not saved here), and the small files (delete them once
    it is saved)."""
    files = {table: list(names) for table, names in manifest.files.items()}
    merged: list[str] = []
    for table in TABLES:
        for number, (folder, names) in enumerate(sorted(crowded(manifest, table, at).items())):
            staged = root / STAGING / run_id / "compaction" / table / str(number)
            (spark.read.schema(schemas[table]).parquet(*(str(root / n) for n in names))
             .coalesce(1).write.mode("overwrite").parquet(str(staged)))
            (part,) = staged.glob("*.parquet")
            target = root / folder / f"{run_id}-compacted.parquet"
            os.replace(part, target)
            gone = set(names)
            files[table] = [*(n for n in files[table] if n not in gone),
                            str(target.relative_to(root))]
            merged.extend(names)
    shutil.rmtree(root / STAGING / run_id, ignore_errors=True)
    return replace(manifest, files=files), merged
