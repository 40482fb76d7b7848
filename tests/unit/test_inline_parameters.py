"""Statements with their values written in, for connections behind a transaction-mode pooler
(``transport.literals.inline_parameters``): pure text, no database."""

from __future__ import annotations

import pytest

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import statements
from endpoint_runtime.transport.addresses import QueueAddress
from endpoint_runtime.transport.literals import inline_parameters, text_literal


def test_parameters_are_replaced_by_their_literals_in_order() -> None:
    assert inline_parameters("SELECT $2, $1, $10", [str(n) for n in range(1, 11)]) == \
        "SELECT 2, 1, 10"


def test_a_parameter_inside_a_quoted_name_or_a_string_is_left_as_it_is() -> None:
    """A queue named ``a$1`` (quoted identifier) or a ``'$1'`` string is not a parameter:
    a hostile name cannot take a value's place."""
    statement = "INSERT INTO \"a$1\"\"b$2\" (x) VALUES ($1, '$2', E'\\'$1', $2)"
    assert inline_parameters(statement, ["'one'", "'two'"]) == (
        "INSERT INTO \"a$1\"\"b$2\" (x) VALUES ('one', '$2', E'\\'$1', 'two')")


def test_a_parameter_that_is_part_of_a_word_is_not_one() -> None:
    assert inline_parameters("SELECT x$1, $1", ["7"]) == "SELECT x$1, 7"


def test_comments_are_dropped_so_that_a_value_cannot_end_one() -> None:
    """A value with a newline written into a ``--`` comment would end it and run as SQL."""
    value = text_literal("x\nDROP TABLE t")
    inlined = inline_parameters("SELECT $1 -- about $1\nFROM t /* $1 */", [value])
    assert inlined == f"SELECT {value}  \nFROM t  "
    assert inlined.count("DROP") == 1  # inside the literal only


def test_every_queue_statement_inlines_for_a_hostile_queue_name() -> None:
    """The runtime's own send statement, for a queue whose name holds quotes and ``$1``: the
    name stays whole and every parameter is replaced."""
    address = QueueAddress.parse('we"ird$1 -- q', "public")
    send = statements.for_queue(address)["send"]
    inlined = inline_parameters(send, ["'id'", "NULL", "'h'", "'\\x00'::bytea"])
    assert address.qualified in inlined
    assert "$" not in inlined.replace(address.qualified, "")


@pytest.mark.parametrize("statement", ["SELECT $2", "SELECT $0"])
def test_a_parameter_without_a_value_is_an_error(statement: str) -> None:
    with pytest.raises(ValueError, match="has no value"):
        inline_parameters(statement, ["1"])


@pytest.mark.parametrize("statement", ["SELECT 'open", 'SELECT "open', "SELECT 1 /* open"])
def test_an_unterminated_quote_or_comment_is_an_error(statement: str) -> None:
    with pytest.raises(ValueError, match="unterminated"):
        inline_parameters(statement, [])


def test_pooler_settings() -> None:
    settings = TransportSettings(dsn="postgresql://u:secret@db/app",
                                 pooler_dsn="postgresql://u:secret@pgbouncer:6432/app")
    assert settings.transaction_pooling
    assert settings.pool_dsn("direct") == "postgresql://u:secret@pgbouncer:6432/app"
    assert "secret" not in repr(settings)
    assert not TransportSettings().transaction_pooling
    assert TransportSettings().pool_dsn("direct") == "direct"
    with pytest.raises(ConfigurationError, match="pooler_dsn cannot be empty"):
        TransportSettings(pooler_dsn=" ")
