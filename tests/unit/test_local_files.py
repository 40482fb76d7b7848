"""The chmod-free local file system's jar (endpoint_runtime/analytics/local_files.py): built
by the real ``javac`` into an empty cache, reused, and absent without a ``javac``; the Spark
settings it gives keep the user's own choices. Its use by Spark: tests/analytics/test_report.py."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from endpoint_runtime.analytics import local_files, prerequisites

build = local_files.jar.__wrapped__  # type: ignore[attr-defined]  # the same, uncached


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "endpoint_runtime"


def java_with_javac() -> str:
    java = prerequisites.find_java()[0]
    if not Path(os.path.realpath(java)).with_name("javac").exists():
        pytest.skip("this Java has no javac (the report then keeps Hadoop's file system)")
    return java


def test_the_jar_is_built_into_an_empty_cache_and_reused(cache: Path) -> None:
    java = java_with_javac()
    built = build(java)
    assert built is not None
    assert built.parent == cache
    with zipfile.ZipFile(built) as archive:
        assert "endpoint_runtime/analytics/PosixLocalFileSystem.class" in archive.namelist()
        assert "endpoint_runtime/analytics/PosixLocalFileSystem$Raw.class" in archive.namelist()
    modified = built.stat().st_mtime_ns
    assert build(java) == built
    assert built.stat().st_mtime_ns == modified  # not rebuilt
    assert [path.name for path in cache.iterdir()] == [built.name]  # nothing half-written


def test_without_javac_there_is_no_jar(cache: Path, tmp_path: Path) -> None:
    # A java with no javac beside it stands for a Java runtime without its compiler.
    lonely = tmp_path / "lonely" / "java"
    lonely.parent.mkdir()
    lonely.write_text("#!/bin/sh\n", encoding="utf-8")
    assert build(str(lonely)) is None
    assert not cache.exists()


def test_settings_keep_the_users_class_path_and_file_system(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jar = tmp_path / "fs.jar"
    monkeypatch.setattr(local_files, "jar", lambda java: jar)
    assert local_files.settings("java", {}) == {
        local_files.FILE_SYSTEM_KEY: local_files.CLASS, local_files.CLASS_PATH_KEY: str(jar)}
    mine = local_files.settings("java", {local_files.CLASS_PATH_KEY: "/opt/mine.jar"})
    assert mine[local_files.CLASS_PATH_KEY] == f"/opt/mine.jar{os.pathsep}{jar}"
    assert local_files.settings("java", {local_files.FILE_SYSTEM_KEY: "my.FileSystem"}) == {}
    monkeypatch.setattr(local_files, "jar", lambda java: None)
    assert local_files.settings("java", {}) == {}
