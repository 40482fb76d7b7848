"""Compaction of the raw extract, on real PostgreSQL and real Spark (a day is crowded at two
files, so that four runs show it): a day partition's small files are merged into one by the
run that finds them crowded; a run stopped after writing the
merged file but before its manifest, and one stopped after its manifest but before deleting
the small files, lose no row and count none twice; the tables recomputed from the compacted
extract equal one full run over the same rows."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from endpoint_runtime.analytics import ReportOptions, extract, job, run_report
from endpoint_runtime.analytics.compaction import crowded
from tests.analytics.audit_set import error_row, insert
from tests.analytics.test_incremental import DAY1, TABLES, orders, report, table

MORNING = DAY1 + timedelta(hours=8)


class Stopped(Exception):
    pass


def stop(*args: object) -> None:
    raise Stopped("stopped")


def on_disk(root: Path, table_name: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / table_name).glob("day=*/*.parquet"))


async def batch(dsn: str, number: int) -> None:
    """Three orders and one failure, all on the morning of DAY1."""
    moment = MORNING + timedelta(minutes=10 * number)
    await insert(dsn, orders(f"b{number}", moment, 3),
                 [error_row(number, "Orders.PlaceOrder", "web", "sales", moment, "E", "x")])


async def test_compaction_merges_a_crowded_day_and_a_stop_anywhere_loses_nothing(
        spark: SparkSession, database_dsn: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    out, root = tmp_path / "out", tmp_path / "out" / "extract"
    options = ReportOptions(dsn=database_dsn, out=out, render=False, compact_at=2)
    await batch(database_dsn, 1)
    run_report(options, spark)
    manifest = extract.load(root)
    assert not crowded(manifest, "audit", 2)
    # The second run finds two files in the day (the first run's and its own): it merges
    # them, then stops before its manifest. The merged file is on disk, unlisted; the small
    # one is still listed.
    await batch(database_dsn, 2)
    monkeypatch.setattr(extract, "save", stop)
    with pytest.raises(Stopped):
        run_report(options, spark)
    monkeypatch.undo()
    listed = extract.load(root).files
    assert len(listed["audit"]) == 1
    assert len(on_disk(root, "audit")) == 3  # the listed one, the new one, the merged one
    # Rerun: the same rows again, merged, manifest saved; then it stops before deleting the
    # small files.
    monkeypatch.setattr(job, "_expire", stop)
    with pytest.raises(Stopped):
        run_report(options, spark)
    monkeypatch.undo()
    manifest = extract.load(root)
    merged: dict[str, str] = {}
    for name in extract.TABLES:
        (merged[name],) = manifest.files[name]
        assert merged[name].endswith("-compacted.parquet")
        assert len(on_disk(root, name)) == 3  # the merged one and the two small ones
    assert spark.read.parquet(str(root / merged["errors"])).count() == 2  # one per batch
    # The next run deletes the small files and recomputes the day from the merged file
    # and its own (which it merges again: two files): equal to one full run over the same
    # rows.
    await batch(database_dsn, 3)
    after = run_report(options, spark)
    assert (after.audit_rows, after.error_rows) == (3, 1)
    manifest = extract.load(root)
    for name in extract.TABLES:
        (again,) = manifest.files[name]
        assert again.endswith("-compacted.parquet")
        assert again != merged[name]
        assert on_disk(root, name) == [again]
    rows = spark.read.parquet(*(str(root / name) for name in manifest.files["audit"]))
    assert rows.count() == 9 == rows.select("message_id").distinct().count()
    report(spark, database_dsn, tmp_path / "whole")
    for name in TABLES:
        assert table(spark, out, name) == table(spark, tmp_path / "whole", name), name
