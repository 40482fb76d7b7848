"""Without Spark or a database: the DSN as JDBC, the time arguments, and the one-line errors
that name what to install when Java or the JDBC driver is missing."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from endpoint_runtime.analytics import prerequisites
from endpoint_runtime.analytics.jdbc import SOCKET_FACTORY, jdbc_target
from endpoint_runtime.analytics.options import parse_time
from endpoint_runtime.analytics.prerequisites import MissingPrerequisiteError
from endpoint_runtime.cli import main


@pytest.fixture(autouse=True)
def no_libpq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGHOST", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGSSLMODE"):
        monkeypatch.delenv(name, raising=False)


def test_embedded_socket_dsn() -> None:
    target = jdbc_target("postgresql://postgres:@/er_test_1?host=/work/x/pgdata")
    assert target.url == "jdbc:postgresql://localhost/er_test_1"
    assert target.unix_socket
    assert target.properties["socketFactory"] == SOCKET_FACTORY
    assert target.properties["socketFactoryArg"] == "/work/x/pgdata/.s.PGSQL.5432"
    assert target.properties["user"] == "postgres"
    assert "password" not in target.properties


def test_tcp_url_dsn_keeps_the_password_out_of_url_and_repr() -> None:
    target = jdbc_target("postgresql://app:s%40cret@db.example:6543/orders?sslmode=require")
    assert target.url == "jdbc:postgresql://db.example:6543/orders"
    assert not target.unix_socket
    assert target.properties["password"] == "s@cret"
    assert target.properties["sslmode"] == "require"
    assert "s@cret" not in repr(target)


def test_keyword_dsn_and_libpq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    target = jdbc_target("host=10.0.0.5 port=5433 dbname='my db' user=report password='a b'")
    assert target.url == "jdbc:postgresql://10.0.0.5:5433/my%20db"
    assert target.properties["password"] == "a b"
    monkeypatch.setenv("PGHOST", "pg.internal")
    monkeypatch.setenv("PGDATABASE", "ops")
    monkeypatch.setenv("PGUSER", "reader")
    target = jdbc_target("")
    assert target.url == "jdbc:postgresql://pg.internal:5432/ops"
    assert target.properties["user"] == "reader"


def test_multiple_hosts_and_ipv6() -> None:
    assert jdbc_target("postgresql://u@a:5432,b:5433/d").url == \
        "jdbc:postgresql://a:5432,b:5433/d"
    assert jdbc_target("postgresql://u@[::1]:5432/d").url == "jdbc:postgresql://[::1]:5432/d"


def test_time_arguments() -> None:
    now = datetime(2026, 1, 6, 12, 0, tzinfo=UTC)
    assert parse_time("6h", now) == now - timedelta(hours=6)
    assert parse_time("7d", now) == now - timedelta(days=7)
    assert parse_time("2026-01-05") == datetime(2026, 1, 5, tzinfo=UTC)
    assert parse_time("2026-01-05T08:30") == datetime(2026, 1, 5, 8, 30, tzinfo=UTC)
    assert parse_time("2026-01-05T08:30+01:00") == datetime(2026, 1, 5, 7, 30, tzinfo=UTC)
    with pytest.raises(argparse.ArgumentTypeError, match="not a time"):
        parse_time("yesterday")


def test_missing_java_names_the_package(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(MissingPrerequisiteError, match="openjdk-17-jre-headless"):
        prerequisites.find_java()


def test_old_java_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(MissingPrerequisiteError, match="is Java 11"):
        prerequisites.find_java()


def test_report_without_the_jdbc_driver_fails_with_one_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ENDPOINT_RUNTIME_JDBC_JAR", str(tmp_path / "missing.jar"))
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", "postgresql://u@localhost:1/d")
    status = main(["report", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.count("\n") == 1
    assert "libpostgresql-jdbc-java" in err
    assert not (tmp_path / "out").exists()


def test_report_rejects_an_empty_window(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", "postgresql://u@localhost:1/d")
    status = main(["report", "--since", "2026-01-06", "--until", "2026-01-05"])
    assert status == 2
    assert "--since must be before --until" in capsys.readouterr().err


def test_flow_graph_columns_follow_the_sends() -> None:
    from endpoint_runtime.analytics.plots import layers

    pairs = [("web", "sales"), ("sales", "billing"), ("sales", "inventory"),
             ("billing", "shipping"), ("shipping", "sales"), ("shipping", "shipping")]
    assert layers(pairs) == {"web": 0, "sales": 1, "billing": 2, "inventory": 2,
                             "shipping": 3}
    # A cycle with no endpoint that nothing sends to still gets columns.
    assert layers([("a", "b"), ("b", "a")]) == {"a": 0, "b": 1}


def test_plot_buckets_keep_series_short() -> None:
    from endpoint_runtime.analytics.timeline import MAX_POINTS, bucket_seconds

    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert bucket_seconds(start, start + timedelta(hours=2)) == 60
    assert bucket_seconds(start, start + timedelta(days=7)) == 3600
    for days in (1, 30, 365, 3650):
        seconds = bucket_seconds(start, start + timedelta(days=days))
        assert days * 86400 / seconds <= MAX_POINTS or seconds == 7 * 86400


def test_spark_settings_and_follow_arguments() -> None:
    from endpoint_runtime.analytics.options import add_arguments, options_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--conf", "spark.sql.shuffle.partitions=64", "--conf",
                              "spark.driver.extraJavaOptions=-Da=b", "--follow"])
    options = options_from(args, "postgresql://u@h/d", "public")
    assert options.conf == (("spark.sql.shuffle.partitions", "64"),
                            ("spark.driver.extraJavaOptions", "-Da=b"))
    assert (options.follow, options.ad_hoc) == (60.0, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--conf", "no-equals-sign"])
    with pytest.raises(argparse.ArgumentTypeError, match="no --since"):
        options_from(parser.parse_args(["--follow", "5", "--since", "1h"]), "", "public")
    assert options_from(parser.parse_args(["--until", "1h"]), "", "public").ad_hoc
    assert options.micro_batch == 5.0
    live = options_from(parser.parse_args(["--follow", "--micro-batch", "0.5"]), "", "public")
    assert (live.follow, live.micro_batch) == (60.0, 0.5)
    with pytest.raises(argparse.ArgumentTypeError, match="--micro-batch takes a positive"):
        options_from(parser.parse_args(["--follow", "--micro-batch", "0"]), "", "public")


def test_extract_retention_drops_old_days_from_the_manifest(tmp_path: Path) -> None:
    from endpoint_runtime.analytics import extract

    manifest = extract.Manifest(horizon=7, files={
        "audit": ["audit/day=2026-03-01/a.parquet", "audit/day=2026-03-05/b.parquet",
                  "audit/day=__HIVE_DEFAULT_PARTITION__/c.parquet"],
        "errors": ["errors/day=2026-02-28/d.parquet"]}, runs=3)
    kept, dropped = extract.expired(manifest, "2026-03-02")
    assert dropped == ["audit/day=2026-03-01/a.parquet", "errors/day=2026-02-28/d.parquet"]
    assert kept.files == {"audit": ["audit/day=2026-03-05/b.parquet",
                                    "audit/day=__HIVE_DEFAULT_PARTITION__/c.parquet"],
                          "errors": []}
    extract.save(tmp_path, kept)
    assert extract.load(tmp_path) == kept
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temporary left


def test_the_horizon_is_the_oldest_running_transaction_of_this_database() -> None:
    from endpoint_runtime.analytics.sources import XID_WRAP, horizon

    # Running: 100 (another database), 103 and 2**32 + 7 (this one, listed by 32-bit id).
    snapshot = f"100:{2 ** 32 + 9}:100,103,{2 ** 32 + 7}"
    assert horizon(snapshot, {103, 7}) == 103
    assert horizon(snapshot, {7}) == 2 ** 32 + 7
    assert horizon(snapshot, set()) == 2 ** 32 + 9  # none of ours: the next id
    assert horizon("5:5:", {5}) == 5
    assert XID_WRAP == 2 ** 32
