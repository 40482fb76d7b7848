"""The command line without a database: parsing, --type / --json / --header, db stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from endpoint_runtime.cli import build_parser
from endpoint_runtime.cli.database import db_stop
from endpoint_runtime.cli.errors import (
    errors_delete,
    errors_list,
    errors_retry,
    errors_show,
)
from endpoint_runtime.cli.queues import queues_create, queues_list, queues_peek, queues_purge
from endpoint_runtime.cli.run import run_command
from endpoint_runtime.cli.send import (
    decode_message,
    import_message_type,
    parse_headers,
    send_command,
)
from endpoint_runtime.errors import ConfigurationError
from tests.support.cli import CHARGE_CARD, ChargeCard, Outcome, quiet_logging, run_cli

ID = "0b6f3c52-8d6c-4e43-9d4e-2f0e5b0d9a11"


@pytest.mark.parametrize(
    ("argv", "handler", "expected"),
    [
        (["run", "pkg.mod:endpoint"], run_command,
         {"endpoints": ["pkg.mod:endpoint"], "ingest": False, "max_concurrency": None,
          "stop_timeout": None, "status_interval": 5.0, "log_level": "info"}),
        (["run", "pkg.mod:endpoint", "--max-concurrency", "8", "--status-interval", "0.5"],
         run_command, {"max_concurrency": 8, "status_interval": 0.5}),
        (["run", "a:endpoint", "b:endpoint", "--ingest", "--stop-timeout", "2.5"],
         run_command, {"endpoints": ["a:endpoint", "b:endpoint"], "ingest": True,
                       "stop_timeout": 2.5}),
        (["send", "sales", "--type", "m:T", "--json", "{}"], send_command,
         {"queue": "sales", "type": "m:T", "json": "{}", "header": [], "count": 1}),
        (["send", "sales", "--type", "m:T", "--json", "-", "--header", "a=1", "--header", "b=2",
          "--count", "3"], send_command, {"header": ["a=1", "b=2"], "count": 3}),
        (["queues", "list"], queues_list, {"schema": None}),
        (["queues", "list", "--schema", "ops"], queues_list, {"schema": "ops"}),
        (["queues", "create", "a", "ops.b"], queues_create, {"names": ["a", "ops.b"]}),
        (["queues", "purge", "a"], queues_purge, {"name": "a", "expired_only": False}),
        (["queues", "purge", "a", "--expired-only"], queues_purge, {"expired_only": True}),
        (["queues", "peek", "a"], queues_peek, {"name": "a"}),
        (["errors", "list"], errors_list, {"queue": "error", "limit": 100}),
        (["errors", "list", "--queue", "ops.failed", "--limit", "5"], errors_list,
         {"queue": "ops.failed", "limit": 5}),
        (["errors", "show", ID], errors_show, {"id": ID, "queue": "error"}),
        (["errors", "retry", ID], errors_retry, {"id": ID, "all": False}),
        (["errors", "retry", "--all", "--queue", "failed"], errors_retry,
         {"id": None, "all": True, "queue": "failed"}),
        (["errors", "delete", ID], errors_delete, {"id": ID}),
        (["db", "stop"], db_stop, {}),
    ],
)
def test_every_command_parses_to_its_handler(
    argv: list[str], handler: object, expected: dict[str, object]
) -> None:
    args = build_parser().parse_args(argv)

    assert args.handler is handler
    assert args.config is None
    assert {name: getattr(args, name) for name in expected} == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "x.toml", "errors", "list"],
        ["errors", "--config", "x.toml", "list"],
        ["errors", "list", "--config", "x.toml"],
        ["queues", "peek", "q", "--config", "x.toml"],
        ["db", "stop", "--config", "x.toml"],
    ],
)
def test_config_is_accepted_before_and_after_the_command(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).config == "x.toml"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["errors", "retry"], "one of the arguments ID --all is required"),
        (["errors", "retry", ID, "--all"], "argument --all: not allowed with argument ID"),
        (["errors", "list", "--limit", "0"], "must be at least 1 (got 0)"),
        (["send", "q", "--type", "m:T", "--json", "{}", "--count", "x"], "not an integer: 'x'"),
        (["run", "m:e", "--status-interval", "0"], "must be positive (got 0.0)"),
        (["queues"], "the following arguments are required: COMMAND"),
    ],
)
def test_usage_errors_exit_2_with_argparse_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)

    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_import_message_type_accepts_both_spellings() -> None:
    assert import_message_type(CHARGE_CARD) is ChargeCard
    assert import_message_type("tests.support.cli.ChargeCard") is ChargeCard


def test_decode_message_and_parse_headers() -> None:
    assert decode_message(ChargeCard, '{"card": "1", "amount": 2}') == ChargeCard(card="1",
                                                                                 amount=2)
    with pytest.raises(ConfigurationError, match=r"does not fit tests\.support\.cli\.ChargeCard"):
        decode_message(ChargeCard, '{"card": 1, "amount": 2}')
    with pytest.raises(ConfigurationError, match="is not valid JSON"):
        decode_message(ChargeCard, "{")
    assert parse_headers([" a =1", "b==2", "c="]) == {"a": "1", "b": "=2", "c": ""}
    with pytest.raises(ConfigurationError, match="must look like NAME=VALUE"):
        parse_headers(["=1"])


def test_a_malformed_id_fails_before_any_connection(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet_logging(monkeypatch)
    # A server that cannot be reached: the id is refused before anything connects.
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", "postgresql://nobody@127.0.0.1:1/nothing")
    expected = ("endpoint-runtime: error: 'nope' is not a native id "
                "(a UUID, as `errors list` shows it)\n")

    for command in ("show", "retry", "delete"):
        assert run_cli(capsys, "errors", command, "nope") == Outcome(2, "", expected)


def test_an_unreachable_server_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    quiet_logging(monkeypatch)
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", "postgresql://nobody@127.0.0.1:1/nothing")

    outcome = run_cli(capsys, "errors", "list")

    assert (outcome.code, outcome.out) == (2, "")
    assert outcome.err.startswith("endpoint-runtime: error: cannot connect to PostgreSQL at ")
    assert outcome.err.count("\n") == 1


def test_db_stop_with_no_embedded_server_running(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    quiet_logging(monkeypatch)
    # A data directory of its own: the session's embedded server is never touched.
    monkeypatch.setenv("ENDPOINT_RUNTIME_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("ENDPOINT_RUNTIME_DSN", raising=False)
    pgdata = tmp_path.resolve() / "pgdata"

    assert run_cli(capsys, "db", "stop") == Outcome(
        0, f"no embedded PostgreSQL is running in {pgdata}\n", ""
    )

    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", "postgresql://db.example/app")
    assert run_cli(capsys, "db", "stop") == Outcome(
        0, f"no embedded PostgreSQL is running in {pgdata}\n"
        "note: a DSN is configured; that server is not managed by this command\n", "",
    )
