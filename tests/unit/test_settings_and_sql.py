from __future__ import annotations

from pathlib import Path

import pytest

from endpoint_runtime.connections.embedded import redact_dsn, with_database
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import TransportSettings, load_settings
from endpoint_runtime.transport import sql


def test_settings_come_from_file_then_env_then_code(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.toml"
    path.write_text('[transport]\nschema = "ops"\npeek_delay = 2.0\npool_max_size = 3\n')
    env = {"ENDPOINT_RUNTIME_PEEK_DELAY": "0.5", "ENDPOINT_RUNTIME_NOTIFY_ON_SEND": "false"}

    settings = load_settings(TransportSettings, path=path, table="transport", environ=env,
                             pool_max_size=4)

    assert settings.schema == "ops"
    assert settings.peek_delay == 0.5
    assert settings.notify_on_send is False
    assert settings.pool_max_size == 4


def test_bad_settings_fail_with_clear_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"at least 0\.1"):
        load_settings(TransportSettings, environ={}, peek_delay=0.05)
    with pytest.raises(ConfigurationError, match="pool_max_size"):
        load_settings(TransportSettings, environ={"ENDPOINT_RUNTIME_POOL_MAX_SIZE": "many"})
    with pytest.raises(ValueError, match=r"at least 0\.1"):
        TransportSettings(peek_delay=0.01)
    with pytest.warns(UserWarning, match="recommended"):
        TransportSettings(peek_delay=11)


def test_passwords_never_show() -> None:
    assert redact_dsn("postgresql://app:s3cret@db:5432/x") == "postgresql://app:***@db:5432/x"
    assert "s3cret" not in redact_dsn("host=db password=s3cret dbname=x")
    assert "s3cret" not in redact_dsn("postgresql://db/x?user=app&password=s3cret")
    assert "s3cret" not in repr(TransportSettings(dsn="postgresql://app:s3cret@db/x"))


def test_with_database_swaps_only_the_database() -> None:
    assert with_database("postgresql://u:p@h:1/a?host=/s", "b") == "postgresql://u:p@h:1/b?host=/s"
    assert with_database("host=h dbname=a", "b") == "host=h dbname=b"
    assert with_database("", "b") == "postgresql:///b"


def test_sql_blocks_parse_by_name() -> None:
    blocks = sql.parse_blocks("-- preamble\n-- one --\nSELECT 1;\n-- two --\n-- note\nSELECT 2;\n")
    assert blocks == {"one": "SELECT 1;", "two": "-- note\nSELECT 2;"}
    with pytest.raises(ValueError, match="twice"):
        sql.parse_blocks("-- a --\nx\n-- a --\ny")
    assert {"send", "receive", "peek", "purge_expired"} <= set(sql.load("queue.sql"))


def test_endpoint_settings_read_nested_settings_from_file_and_environment(
    tmp_path: Path,
) -> None:
    from endpoint_runtime.settings import EndpointSettings

    path = tmp_path / "endpoint.toml"
    path.write_text('[endpoint]\nmax_concurrency = 3\n[endpoint.transport]\nschema = "ops"\n'
                    'peek_delay = 2.0\n')
    env = {"ENDPOINT_RUNTIME_PEEK_DELAY": "0.5",
           "ENDPOINT_RUNTIME_DELAYED_DELIVERY_BATCH_SIZE": "7",
           "ENDPOINT_RUNTIME_BATCH_SIZE": "5"}

    settings = load_settings(EndpointSettings, path=path, table="endpoint", environ=env)

    assert settings.max_concurrency == 3
    assert settings.transport.schema == "ops"  # from the file, kept beside the env value
    assert settings.transport.peek_delay == 0.5
    assert settings.delayed_delivery.batch_size == 7
    assert settings.batch_size == 5
    assert settings.outbox is None
    code = load_settings(EndpointSettings, environ=env, transport=TransportSettings(schema="x"))
    assert code.transport.schema == "x"


def test_outbox_acks_per_commit_must_be_between_1_and_1000() -> None:
    from endpoint_runtime.settings import OutboxSettings

    assert OutboxSettings().acks_per_commit == 8
    assert OutboxSettings(acks_per_commit=1).acks_per_commit == 1
    for bad in (0, -3, 1001):
        with pytest.raises(ConfigurationError, match="acks_per_commit"):
            OutboxSettings(acks_per_commit=bad)
