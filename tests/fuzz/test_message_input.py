"""Headers, message type names and bodies as the pipeline parses them (no database): any
input parses, or fails with the runtime's own error for it, never with anything else."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from endpoint_runtime.errors import (
    MessageDecodeError,
    PoisonMessageError,
    UnknownMessageTypeError,
)
from endpoint_runtime.wire.messages import decode_headers, encode_headers
from endpoint_runtime.wire.serialization import MessageTypes
from tests.fuzz.conftest import outcome
from tests.fuzz.endpoints import FUZZED_TYPE, Fuzzed
from tests.fuzz.strategies import bodies, header_texts, type_names


@given(raw=header_texts)
def test_headers_parse_into_strings_or_fail_as_poison(raw: str) -> None:
    headers = outcome(lambda: decode_headers(raw))
    if isinstance(headers, PoisonMessageError):
        assert str(headers).startswith("probable message metadata corruption")
        return
    assert isinstance(headers, dict)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    # Error-queue copies, retries and audit copies write parsed headers back: they round-trip.
    assert decode_headers(encode_headers(headers)) == headers


@given(header=type_names)
def test_enclosed_types_resolve_to_a_registered_type_or_fail_clearly(header: str) -> None:
    types = MessageTypes()
    types.add(Fuzzed)
    resolved = outcome(lambda: types.resolve(header))
    named = [part.split(",")[0].strip() for part in header.split(";")]
    if isinstance(resolved, UnknownMessageTypeError):
        assert resolved.type_names == header
        assert FUZZED_TYPE not in named
        return
    assert resolved is Fuzzed
    assert FUZZED_TYPE in named


@given(body=st.integers(0, 100).flatmap(bodies))
def test_bodies_decode_or_fail_keeping_the_raw_bytes(body: bytes | None) -> None:
    types = MessageTypes()
    types.add(Fuzzed)
    raw = body or b""
    decoded = outcome(lambda: types.decode(Fuzzed, raw))
    if isinstance(decoded, MessageDecodeError):
        assert decoded.body == raw
        assert isinstance(decoded.__cause__, msgspec.DecodeError)
        return
    assert isinstance(decoded, Fuzzed)
