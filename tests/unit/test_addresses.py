from __future__ import annotations

import pytest

from endpoint_runtime.errors import ConfigurationError, InvalidQueueNameError
from endpoint_runtime.transport.addresses import (
    MAX_QUEUE_NAME_BYTES,
    QueueAddress,
    quote_identifier,
)


def test_quote_identifier_doubles_inner_quotes() -> None:
    assert quote_identifier('a"b') == '"a""b"'
    assert quote_identifier("x'; drop table y; --") == "\"x'; drop table y; --\""


def test_parse_plain_and_schema_qualified_addresses() -> None:
    assert QueueAddress.parse("sales") == QueueAddress("sales", "public")
    assert QueueAddress.parse("sales", "ops") == QueueAddress("sales", "ops")
    assert QueueAddress.parse("ops.sales") == QueueAddress("sales", "ops")
    assert QueueAddress.parse('"my.schema"."a""b.c"') == QueueAddress('a"b.c', "my.schema")


def test_address_round_trips_through_its_text_form() -> None:
    for address in (QueueAddress("sales"), QueueAddress("a.b", "c"), QueueAddress('q"x', "s")):
        assert QueueAddress.parse(str(address)) == address


@pytest.mark.parametrize("text", ["", "a.b.c", '"open', '"a"b'])
def test_unusable_addresses_are_rejected(text: str) -> None:
    with pytest.raises(InvalidQueueNameError):
        QueueAddress.parse(text)


def test_name_too_long_for_suffixes_fails_clearly() -> None:
    QueueAddress("q" * MAX_QUEUE_NAME_BYTES).check_room_for_suffixes()
    with pytest.raises(InvalidQueueNameError, match="_expires_idx") as info:
        QueueAddress("q" * (MAX_QUEUE_NAME_BYTES + 1)).check_room_for_suffixes()
    assert isinstance(info.value, ConfigurationError)
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidQueueNameError):  # multi-byte characters count as bytes
        QueueAddress("ü" * (MAX_QUEUE_NAME_BYTES // 2 + 1)).check_room_for_suffixes()
    with pytest.raises(InvalidQueueNameError, match="63-byte"):
        QueueAddress("q" * 64)


def test_notify_channel_fits_an_identifier() -> None:
    assert QueueAddress("sales").notify_channel == "er.public.sales"
    long = QueueAddress("q" * MAX_QUEUE_NAME_BYTES, "s" * 40)
    assert len(long.notify_channel.encode()) <= 63
