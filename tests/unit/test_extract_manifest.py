"""The extract's manifest without Spark: retention's cutoff is kept (and only moves forward),
saved and loaded; a manifest written before the field existed counts as expired."""

from __future__ import annotations

import json
from pathlib import Path

from endpoint_runtime.analytics import extract

AUDIT = ["audit/day=2026-03-01/a.parquet", "audit/day=2026-03-03/b.parquet"]


def manifest() -> extract.Manifest:
    return extract.Manifest(horizon=7, files={"audit": list(AUDIT), "errors": []}, runs=2)


def test_retention_keeps_its_cutoff_and_the_later_of_two(tmp_path: Path) -> None:
    kept, dropped = extract.expired(manifest(), "2026-03-02")
    assert dropped == [AUDIT[0]]
    assert kept.files["audit"] == [AUDIT[1]]
    assert kept.expired_before == "2026-03-02"
    again, _ = extract.expired(kept, "2026-02-20")  # a shorter --keep-days later on
    assert again.expired_before == "2026-03-02"
    extract.save(tmp_path, again)
    assert extract.load(tmp_path).expired_before == "2026-03-02"


def test_a_cutoff_is_kept_also_when_nothing_was_old_enough() -> None:
    """Retention deletes the tables' days by the same cutoff: a conversation's start day can
    go while its rows (processed the next day) stay in the extract."""
    kept, dropped = extract.expired(manifest(), "2026-02-01")
    assert dropped == []
    assert kept.expired_before == "2026-02-01"


def test_a_manifest_from_before_the_field_counts_as_expired(tmp_path: Path) -> None:
    """Saved now without retention: never expired. Saved by the version before the field:
    unknown, so counted as expired (a retention run then may have cut a conversation's
    start day from the table), and the next cutoff replaces the unknown one."""
    extract.save(tmp_path, manifest())
    assert extract.load(tmp_path).expired_before is None
    data = json.loads((tmp_path / extract.MANIFEST).read_text(encoding="utf-8"))
    del data["expired_before"]
    (tmp_path / extract.MANIFEST).write_text(json.dumps(data), encoding="utf-8")
    loaded = extract.load(tmp_path)
    assert (loaded.expired_before, loaded.horizon, loaded.files["audit"]) == (
        extract.RETENTION_UNKNOWN, 7, AUDIT)
    assert extract.expired(loaded, "2026-02-01")[0].expired_before == "2026-02-01"
