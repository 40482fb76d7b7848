"""The ``endpoint-runtime`` command against a real PostgreSQL: queues, send, errors, settings.

The commands run in-process (``main(argv)`` returns the exit status; it calls
``asyncio.run``, so these tests are synchronous and set up the database with ``asyncio.run``
too); one test runs the installed console script to check its entry point.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import msgspec
import pytest

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.chain.recoverability.error_queue import error_copy, show_failed
from endpoint_runtime.chain.recoverability.policy import ErrorHeaders, Failure
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.wire.messages import Headers, TransportMessage
from tests.support.cli import CHARGE_CARD, ChargeCard, Outcome, quiet_logging, run_cli

T = TypeVar("T")
Cli = Callable[..., Outcome]

STACK_TRACE = ('Traceback (most recent call last):\n  File "billing.py", line 3\n'
               "ValueError: declined")


class Database:
    """Synchronous access to the test's database, to set up and check what the command did."""

    def __init__(self, dsn: str) -> None:
        self.settings = TransportSettings(dsn=dsn)

    def run(self, use: Callable[[PostgresTransport], Awaitable[T]]) -> T:
        async def go() -> T:
            async with PostgresTransport.connect(self.settings) as transport:
                return await use(transport)

        return asyncio.run(go())

    def create(self, *names: str) -> None:
        async def create(transport: PostgresTransport) -> None:
            for name in names:
                await transport.create_queue(name)

        self.run(create)

    def drop(self, name: str) -> None:
        self.run(lambda transport: transport.drop_queue(name))

    def depth(self, name: str) -> int:
        return self.run(lambda transport: transport.depth(name))

    def receive(self, name: str) -> TransportMessage:
        received = self.run(lambda transport: transport.receive(name))
        assert isinstance(received, TransportMessage)
        return received

    def execute(self, statement: str, *arguments: object) -> None:
        self.run(lambda transport: transport.pool.execute(statement, *arguments))

    def fail(
        self,
        queue: str,
        *,
        message: str = "card declined",
        body: bytes | None = None,
        error_queue: str = "error",
    ) -> uuid.UUID:
        """Send a message to ``queue``, take it, put its error copy in ``error_queue``."""
        failure = Failure(attempts=6, exception_type="builtins.ValueError",
                          inner_exception_type="", message=message, source="charge",
                          stack_trace=STACK_TRACE, unrecoverable=False)

        async def fail(transport: PostgresTransport) -> uuid.UUID:
            outgoing = create_outgoing(ChargeCard(card="4242", amount=5),
                                       headers={"x-custom": "kept"})
            if body is not None:
                outgoing = msgspec.structs.replace(outgoing, body=body)
            await transport.send(queue, outgoing)
            received = await transport.receive(queue)
            assert isinstance(received, TransportMessage)
            await transport.send(error_queue, error_copy(received, failure, queue, "billing"))
            return received.native_id

        return self.run(fail)

    def poison(self, error_queue: str = "error") -> uuid.UUID:
        """A row of the error queue whose headers do not parse."""
        native_id = uuid.uuid4()
        self.execute(f'INSERT INTO "public"."{error_queue}" (id, headers, body) '
                     "VALUES ($1, '{broken', 'x')", native_id)
        return native_id


@pytest.fixture
def cli(
    database_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    """``cli("queues", "list")``: run the command on the test's database."""
    for name in list(os.environ):
        if name.startswith("ENDPOINT_RUNTIME_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ENDPOINT_RUNTIME_DSN", database_dsn)
    quiet_logging(monkeypatch)
    return lambda *argv: run_cli(capsys, *argv)


@pytest.fixture
def db(database_dsn: str) -> Database:
    return Database(database_dsn)


def depths(listing: Outcome) -> dict[str, int]:
    assert listing.code == 0, listing.err
    header, *rows = listing.out.splitlines()
    assert header.split() == ["queue", "depth"]
    return {name: int(depth) for name, depth in (row.split() for row in rows)}


def error_table(listing: Outcome) -> list[dict[str, str]]:
    """The rows of ``errors list``, cut at the header's column starts (checks alignment)."""
    assert listing.code == 0, listing.err
    header, *rows = listing.out.splitlines()
    columns = ["native id", "failed queue", "exception type", "time of failure", "message"]
    starts = [header.index(column) for column in columns]
    assert starts == sorted(starts)
    ends = [*starts[1:], None]
    return [
        {column: row[start:end].strip() for column, start, end in zip(columns, starts, ends,
                                                                      strict=True)}
        for row in rows
        if not row.startswith("(")  # the "(N shown of M ...)" note
    ]


# -- queues -----------------------------------------------------------------------------------


def test_queues_create_list_peek_and_purge(cli: Cli, db: Database) -> None:
    assert cli("queues", "list") == Outcome(0, "no queues in any schema\n", "")

    assert cli("queues", "create", "sales", "billing") == Outcome(
        0, "queue public.sales is ready\nqueue public.billing is ready\n", ""
    )
    assert cli("queues", "create", "sales").code == 0  # idempotent
    assert depths(cli("queues", "list")) == {"public.billing": 0, "public.sales": 0}

    sent = cli("send", "sales", "--type", CHARGE_CARD, "--json", '{"card": "1", "amount": 2}',
               "--count", "3")
    assert sent.code == 0, sent.err
    assert len(set(sent.out.split())) == 3

    assert depths(cli("queues", "list")) == {"public.billing": 0, "public.sales": 3}
    assert depths(cli("queues", "list", "--schema", "public")) == {
        "public.billing": 0, "public.sales": 3,
    }
    assert cli("queues", "list", "--schema", "elsewhere").out == "no queues in schema elsewhere\n"
    assert cli("queues", "peek", "sales") == Outcome(
        0, "queue public.sales: estimate 3 (unlocked, max-min seq), depth 3 (rows)\n", ""
    )
    assert cli("queues", "purge", "sales") == Outcome(
        0, "purged 3 message(s) from public.sales\n", ""
    )
    assert db.depth("sales") == 0


def test_purge_expired_only_keeps_the_live_messages(cli: Cli, db: Database) -> None:
    db.create("sales")
    sent = cli("send", "sales", "--type", CHARGE_CARD, "--json", '{"card": "1", "amount": 2}',
               "--count", "2")
    expired_id, live_id = sent.out.split()
    db.execute("UPDATE \"public\".\"sales\" SET expires = (now() AT TIME ZONE 'UTC') "
               "- interval '1 hour' WHERE id = $1", uuid.UUID(expired_id))

    assert cli("queues", "purge", "sales", "--expired-only") == Outcome(
        0, "purged 1 expired message(s) from public.sales\n", ""
    )
    assert db.depth("sales") == 1
    assert db.receive("sales").message_id == live_id


@pytest.mark.parametrize("argv", [["queues", "peek", "nowhere"], ["queues", "purge", "nowhere"],
                                  ["queues", "purge", "nowhere", "--expired-only"]])
def test_queue_commands_on_a_missing_queue_fail_with_one_line(cli: Cli, argv: list[str]) -> None:
    assert cli(*argv) == Outcome(
        2, "", missing_queue("public.nowhere")
    )


# -- send -------------------------------------------------------------------------------------


def test_send_decodes_the_json_into_the_type_and_adds_the_headers(
    cli: Cli, db: Database
) -> None:
    db.create("billing")

    sent = cli("send", "billing", "--type", CHARGE_CARD,
               "--json", '{"card": "4242", "amount": 5}',
               "--header", "x-tenant=acme", "--header", "x-query=a=b")

    assert sent.code == 0, sent.err
    [message_id] = sent.out.split()
    received = db.receive("billing")
    assert received.message_id == message_id
    assert msgspec.json.decode(received.body, type=ChargeCard) == ChargeCard(card="4242",
                                                                             amount=5)
    assert received.headers["x-tenant"] == "acme"
    assert received.headers["x-query"] == "a=b"
    assert received.headers[Headers.ENCLOSED_MESSAGE_TYPES] == "tests.support.cli.ChargeCard"
    assert db.depth("billing") == 0


def test_send_reads_the_json_from_stdin(
    cli: Cli, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.create("billing")
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"card": "1", "amount": 7, "note": "in"}'))

    # The dotted form of --type works too.
    sent = cli("send", "billing", "--type", "tests.support.cli.ChargeCard", "--json", "-")

    assert sent.code == 0, sent.err
    received = db.receive("billing")
    assert msgspec.json.decode(received.body, type=ChargeCard) == ChargeCard(
        card="1", amount=7, note="in"
    )


@pytest.mark.parametrize(
    ("message_type", "text", "expected"),
    [
        (CHARGE_CARD, '{"card": "1", "amount": ', "--json is not valid JSON: "),
        (CHARGE_CARD, '{"card": "1", "amount": "five"}',
         "--json does not fit tests.support.cli.ChargeCard: Expected `int`, got `str` - at "
         "`$.amount`"),
        (CHARGE_CARD, '{"card": "1"}',
         "--json does not fit tests.support.cli.ChargeCard: Object missing required field "
         "`amount`"),
        ("tests.support.no_such_module:ChargeCard", "{}",
         "--type 'tests.support.no_such_module:ChargeCard': cannot import "
         "'tests.support.no_such_module'"),
        ("tests.support.cli:Missing", "{}",
         "--type 'tests.support.cli:Missing': tests.support.cli has no 'Missing'"),
        ("tests.support.cli:NotAMessage", "{}",
         "--type 'tests.support.cli:NotAMessage' is not a msgspec.Struct subclass"),
        ("ChargeCard", "{}", "--type 'ChargeCard' must look like 'package.module:StructName'"),
    ],
)
def test_send_refuses_bad_input_with_one_line_and_sends_nothing(
    cli: Cli, db: Database, message_type: str, text: str, expected: str
) -> None:
    db.create("billing")

    outcome = cli("send", "billing", "--type", message_type, "--json", text)

    assert outcome.code == 2
    assert outcome.out == ""
    assert outcome.err.startswith(f"endpoint-runtime: error: {expected}")
    assert outcome.err.count("\n") == 1
    assert db.depth("billing") == 0


def test_send_refuses_a_bad_header_and_a_missing_queue(cli: Cli, db: Database) -> None:
    db.create("billing")
    charge = ["--type", CHARGE_CARD, "--json", '{"card": "1", "amount": 2}']

    assert cli("send", "billing", *charge, "--header", "no-value") == Outcome(
        2, "", "endpoint-runtime: error: --header 'no-value' must look like NAME=VALUE\n"
    )
    assert cli("send", "nowhere", *charge) == Outcome(
        2, "", missing_queue("public.nowhere")
    )
    assert db.depth("billing") == 0


def test_send_without_a_queue_goes_by_the_routes_of_an_endpoint_or_the_environment(
    cli: Cli, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.create("payments", "shipping")
    card = ["--type", "tests.support.routed_messages:ChargeCard", "--json", '{"n": 1}']

    by_endpoint = cli("send", *card, "--routes-of", "tests.support.routed_messages:web")
    monkeypatch.setenv("ENDPOINT_RUNTIME_ROUTES", "tests.support.routed_messages=shipping")
    by_environment = cli("send", *card)
    explicit = cli("send", "payments", *card)  # an explicit queue still wins

    assert (by_endpoint.code, by_environment.code, explicit.code) == (0, 0, 0), (
        by_endpoint.err, by_environment.err, explicit.err)
    assert db.receive("payments").message_id == by_endpoint.out.strip()
    assert db.receive("payments").message_id == explicit.out.strip()
    assert db.receive("shipping").message_id == by_environment.out.strip()


def test_send_without_a_queue_or_a_route_names_the_route_to_add_and_sends_nothing(
    cli: Cli, db: Database
) -> None:
    db.create("payments")
    outcome = cli("send", "--type", "tests.support.routed_messages:ShipParcel",
                  "--json", '{"n": 1}', "--routes-of", "tests.support.routed_messages:web")
    assert outcome.code == 2
    assert outcome.out == ""
    assert outcome.err.startswith(
        "endpoint-runtime: error: no route for tests.support.routed_messages.ShipParcel: add "
        'endpoint.route(ShipParcel, to="<queue>")')
    assert db.depth("payments") == 0


# -- errors -----------------------------------------------------------------------------------


def test_errors_list_shows_one_readable_line_per_failed_message(cli: Cli, db: Database) -> None:
    db.create("billing", "shipping", "error")
    first = db.fail("billing", message="card declined\nby the issuer, code 51")
    second = db.fail("billing", message="x" * 200)
    third = db.fail("shipping", message="no carrier")
    poison = db.poison()

    rows = error_table(cli("errors", "list"))

    assert [row["native id"] for row in rows] == [str(first), str(second), str(third),
                                                  str(poison)]
    assert [row["failed queue"] for row in rows] == ["billing", "billing", "shipping", "-"]
    assert [row["exception type"] for row in rows] == ["builtins.ValueError"] * 3 + [
        "(poison message)"
    ]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row["time of failure"])
               for row in rows[:3])
    assert rows[3]["time of failure"] == "-"
    assert rows[0]["message"] == "card declined"  # the first line only
    assert rows[1]["message"] == "x" * 77 + "..."
    assert rows[2]["message"] == "no carrier"
    assert rows[3]["message"].startswith("headers do not parse: probable message metadata")


def test_errors_list_limit_says_how_many_are_left_out(cli: Cli, db: Database) -> None:
    db.create("billing", "error")
    ids = [db.fail("billing") for _ in range(3)]

    listing = cli("errors", "list", "--limit", "2")

    assert [row["native id"] for row in error_table(listing)] == [str(i) for i in ids[:2]]
    assert listing.out.splitlines()[-1] == (
        "(2 shown of 3 in public.error; --limit N shows more)"
    )


def test_errors_list_of_an_empty_a_missing_and_another_error_queue(
    cli: Cli, db: Database
) -> None:
    assert cli("errors", "list") == Outcome(
        2, "", missing_queue("public.error")
    )
    db.create("error", "billing", "failures")
    assert cli("errors", "list") == Outcome(0, "no failed messages in public.error\n", "")

    native_id = db.fail("billing", error_queue="failures")

    assert cli("errors", "list").out == "no failed messages in public.error\n"
    [row] = error_table(cli("errors", "list", "--queue", "failures"))
    assert row["native id"] == str(native_id)


def test_errors_show_prints_sorted_headers_and_the_body_as_text(cli: Cli, db: Database) -> None:
    db.create("billing", "error")
    native_id = db.fail("billing")

    stored = db.run(lambda transport: show_failed(transport, native_id))
    assert stored is not None
    assert isinstance(stored.message, TransportMessage)

    shown = cli("errors", "show", str(native_id))

    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[:3] == [f"native id: {native_id}", "queue: public.error",
                         f"headers ({len(stored.message.headers)}):"]
    header_lines = [line for line in lines[3:] if line.startswith("  ")
                    and not line.startswith("    ")]
    assert [line.strip().split(":", 1)[0] for line in header_lines] == sorted(
        stored.message.headers
    )
    assert "  NServiceBus.FailedQ: billing" in header_lines
    assert "  NServiceBus.ExceptionInfo.Message: card declined" in header_lines
    assert "  x-custom: kept" in header_lines
    # Multi-line values (the stack trace) go on indented continuation lines.
    assert "  NServiceBus.ExceptionInfo.StackTrace: Traceback (most recent call last):" in lines
    assert "    ValueError: declined" in lines
    assert lines[-2:] == ["body (36 bytes, UTF-8):", '{"card":"4242","amount":5,"note":""}']


def test_errors_show_prints_a_binary_body_in_hex_and_a_poison_row_raw(
    cli: Cli, db: Database
) -> None:
    db.create("billing", "error")
    binary = db.fail("billing", body=b"\xff\x00" + bytes(range(16)))
    poison = db.poison()

    shown = cli("errors", "show", str(binary))
    assert shown.code == 0, shown.err
    assert shown.out.splitlines()[-3:] == [
        "body (18 bytes, not UTF-8; hex):",
        "00000000  ff 00 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d",
        "00000010  0e 0f",
    ]

    shown = cli("errors", "show", str(poison))
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[2].startswith("poison message: probable message metadata corruption: ")
    assert lines[3:] == ["raw headers (they do not parse):", "  {broken",
                         "body (1 byte, UTF-8):", "x"]


def test_errors_list_and_show_escape_control_characters(cli: Cli, db: Database) -> None:
    db.create("billing", "error")
    native_id = db.fail("billing", message="\x1b[2Jcleared\r\nsecond line",
                        body=b'{"note": "\x1b]0;title\x07"}')

    [row] = error_table(cli("errors", "list"))
    shown = cli("errors", "show", str(native_id))

    assert row["message"] == "\\x1b[2Jcleared"
    assert "\x1b" not in shown.out
    assert "\x07" not in shown.out
    assert "  NServiceBus.ExceptionInfo.Message: \\x1b[2Jcleared" in shown.out.splitlines()
    assert "    second line" in shown.out.splitlines()
    assert shown.out.splitlines()[-1] == '{"note": "\\x1b]0;title\\x07"}'


def test_errors_show_of_an_unknown_or_malformed_id_fails_with_one_line(
    cli: Cli, db: Database
) -> None:
    db.create("error")
    unknown = uuid.uuid4()

    assert cli("errors", "show", str(unknown)) == Outcome(
        2, "", f"endpoint-runtime: error: no message {unknown} in public.error\n"
    )
    assert cli("errors", "show", "not-an-id") == Outcome(
        2, "", "endpoint-runtime: error: 'not-an-id' is not a native id "
        "(a UUID, as `errors list` shows it)\n"
    )


def test_errors_retry_moves_the_message_back_to_its_queue(cli: Cli, db: Database) -> None:
    db.create("billing", "error")
    native_id = db.fail("billing")

    assert cli("errors", "retry", str(native_id)) == Outcome(
        0, f"moved message {native_id} from public.error back to billing\n", ""
    )

    assert db.depth("error") == 0
    replayed = db.receive("billing")
    assert replayed.native_id == native_id
    assert replayed.headers["x-custom"] == "kept"
    assert not set(ErrorHeaders.ALL) & set(replayed.headers)


def test_errors_retry_to_a_missing_failed_queue_keeps_the_message(
    cli: Cli, db: Database
) -> None:
    db.create("billing", "error")
    native_id = db.fail("billing")
    db.drop("billing")

    assert cli("errors", "retry", str(native_id)) == Outcome(
        2, "", f"endpoint-runtime: error: cannot retry message {native_id}: its FailedQ "
        "public.billing does not exist (create it, or delete the message); it stays in "
        "public.error\n",
    )

    assert db.depth("error") == 1
    [row] = error_table(cli("errors", "list"))
    assert (row["native id"], row["failed queue"]) == (str(native_id), "billing")


def test_errors_retry_of_a_poison_or_unknown_message_fails_and_keeps_it(
    cli: Cli, db: Database
) -> None:
    db.create("error")
    poison = db.poison()
    unknown = uuid.uuid4()

    assert cli("errors", "retry", str(poison)) == Outcome(
        2, "", f"endpoint-runtime: error: message {poison} has headers that do not parse; it "
        "cannot be retried\n",
    )
    assert cli("errors", "retry", str(unknown)) == Outcome(
        2, "", f"endpoint-runtime: error: no message {unknown} in public.error\n"
    )
    assert db.depth("error") == 1


def test_errors_retry_all_moves_what_it_can_and_says_what_stays(cli: Cli, db: Database) -> None:
    db.create("billing", "shipping", "gone", "error")
    for _ in range(2):
        db.fail("billing")
    db.fail("shipping")
    stuck = db.fail("gone")
    db.drop("gone")
    db.poison()

    retried = cli("errors", "retry", "--all")

    assert retried.code == 1
    assert retried.out == ("moved 2 message(s) from public.error back to billing\n"
                           "moved 1 message(s) from public.error back to shipping\n")
    assert retried.err.startswith("endpoint-runtime: 2 message(s) could not be retried and "
                                  "stay in public.error")
    assert retried.err.count("\n") == 1
    assert (db.depth("billing"), db.depth("shipping"), db.depth("error")) == (2, 1, 2)

    db.create("gone")
    assert cli("errors", "retry", str(stuck)).code == 0
    assert db.depth("gone") == 1


def test_errors_retry_all_skips_a_message_whose_id_waits_in_its_queue(
    cli: Cli, db: Database
) -> None:
    db.create("billing", "error")
    native_id = db.fail("billing")
    db.fail("billing")
    db.execute("INSERT INTO public.billing (id, headers, body) VALUES ($1, '{}', 'x')",
               native_id)  # a resend of it waits in billing

    retried = cli("errors", "retry", "--all")

    assert retried.code == 1
    assert retried.out == "moved 1 message(s) from public.error back to billing\n"
    assert "1 message(s) could not be retried" in retried.err
    assert (db.depth("billing"), db.depth("error")) == (2, 1)


def test_errors_retry_all_of_a_clean_queue(cli: Cli, db: Database) -> None:
    db.create("billing", "error")
    assert cli("errors", "retry", "--all") == Outcome(
        0, "no failed messages in public.error\n", ""
    )
    db.fail("billing")
    assert cli("errors", "retry", "--all") == Outcome(
        0, "moved 1 message(s) from public.error back to billing\n", ""
    )
    assert (db.depth("billing"), db.depth("error")) == (1, 0)


def test_errors_delete_removes_one_message(cli: Cli, db: Database) -> None:
    db.create("billing", "error")
    doomed = db.fail("billing")
    kept = db.fail("billing")

    assert cli("errors", "delete", str(doomed)) == Outcome(
        0, f"deleted message {doomed} from public.error\n", ""
    )
    assert cli("errors", "delete", str(doomed)) == Outcome(
        2, "", f"endpoint-runtime: error: no message {doomed} in public.error\n"
    )
    assert [row["native id"] for row in error_table(cli("errors", "list"))] == [str(kept)]


# -- settings and the console script -----------------------------------------------------------


def test_config_file_chooses_the_server_before_or_after_the_command(
    cli: Cli, db: Database, database_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db.create("only_in_this_database")
    config = tmp_path / "endpoint.toml"
    config.write_text(f"[transport]\ndsn = {database_dsn!r}\n")
    monkeypatch.delenv("ENDPOINT_RUNTIME_DSN")

    # Read-only commands: were the file ignored, they would only read the default server.
    expected = {"public.only_in_this_database": 0}
    assert depths(cli("--config", str(config), "queues", "list")) == expected
    assert depths(cli("queues", "--config", str(config), "list")) == expected
    assert depths(cli("queues", "list", "--config", str(config))) == expected
    assert cli("errors", "list", "--config", str(config)).err == (
        missing_queue("public.error")
    )

    missing = tmp_path / "missing.toml"
    outcome = cli("queues", "list", "--config", str(missing))
    assert outcome.code == 2
    assert outcome.err.startswith(f"endpoint-runtime: error: cannot read settings file {missing}")


def test_the_console_script_runs_the_same_main(db: Database, database_dsn: str) -> None:
    script = Path(sys.executable).with_name("endpoint-runtime")
    assert script.exists(), "the project is not installed (pip install -e '.[dev]')"
    db.create("sales")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENDPOINT_RUNTIME_")}
    env["ENDPOINT_RUNTIME_DSN"] = database_dsn

    listed = subprocess.run([script, "queues", "list"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    refused = subprocess.run([script, "errors", "show", "nope"], env=env, capture_output=True,
                             text=True, timeout=120, check=False)

    assert (listed.returncode, listed.stderr) == (0, "")
    assert listed.stdout.splitlines()[1].split() == ["public.sales", "0"]
    assert refused.returncode == 2
    assert refused.stderr == ("endpoint-runtime: error: 'nope' is not a native id "
                              "(a UUID, as `errors list` shows it)\n")


def missing_queue(queue: str) -> str:
    """What a command prints for a queue that does not exist: the command that creates it."""
    return (f"endpoint-runtime: error: queue {queue} does not exist "
            f"(create it: endpoint-runtime queues create {queue})\n")
