"""Strategies for hostile input: what a queue row's headers and body, a message type name, a
queue or schema name can hold when anyone may write to the table.

A queue row's ``headers`` column is ``text``: it holds no NUL and no invalid UTF-8 as such,
but its JSON may escape both (``\\u0000``, a lone ``\\ud800``), which is how they reach the
runtime. Bodies are ``bytea``: anything.
"""

from __future__ import annotations

import json
import uuid

import msgspec
from hypothesis import strategies as st

from endpoint_runtime.wire.messages import ErrorHeaders, Headers, RetryHeaders
from tests.fuzz.endpoints import FUZZED_TYPE, Fuzzed

# Text PostgreSQL can store in a text column: no NUL, no lone surrogates.
storable_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)))

# Everything a header value might be, escapes included once JSON-encoded.
odd_strings = st.sampled_from([
    "", "0", "-1", "1e309", "NaN", "9" * 5_000, "\x00", "a\x00b", "\x1b[2J", "\u202e",
    "2024-01-01 00:00:00:000000 Z", "9999-12-31 23:59:59:999999 Z", "0001-01-01 00:00:00:0 Z",
    "not a time", str(uuid.UUID(int=0)), "'; DROP TABLE error; --", '"', "\\", "x" * 100_000,
])
header_values = st.one_of(st.text(max_size=30), odd_strings)

# Headers the runtime reads, and a few it writes itself (a sender may forge them too).
KNOWN_HEADERS = [
    Headers.MESSAGE_ID, Headers.CORRELATION_ID, Headers.CONVERSATION_ID,
    Headers.ENCLOSED_MESSAGE_TYPES, Headers.CONTENT_TYPE, Headers.MESSAGE_INTENT,
    Headers.REPLY_TO_ADDRESS, Headers.TIME_SENT, Headers.DELIVER_AT,
    Headers.TIME_TO_BE_RECEIVED, Headers.ORIGINATING_ENDPOINT, Headers.TRACEPARENT,
    Headers.ORIGINAL_NATIVE_ID, RetryHeaders.RETRIES, RetryHeaders.TIMESTAMP,
    ErrorHeaders.FAILED_QUEUE, ErrorHeaders.EXCEPTION_TYPE,
]

type_names = st.one_of(
    st.just(FUZZED_TYPE),
    st.text(max_size=40),
    odd_strings,
    st.builds(lambda junk: f"{FUZZED_TYPE};{junk}", st.text(max_size=20)),
    st.builds(lambda junk: f"{junk};{FUZZED_TYPE}", st.text(max_size=20)),
    st.builds(lambda junk: f"{FUZZED_TYPE}, Some.Assembly, Version={junk}", st.text(max_size=8)),
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)


@st.composite
def header_objects(draw: st.DrawFn) -> dict[str, str]:
    """A JSON object of strings: the runtime's own headers with hostile values, or none."""
    headers: dict[str, str] = {Headers.ENCLOSED_MESSAGE_TYPES: draw(type_names)}
    if draw(st.booleans()):
        headers[Headers.MESSAGE_ID] = str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1))))
    for name in draw(st.lists(st.sampled_from(KNOWN_HEADERS), max_size=6, unique=True)):
        headers[name] = draw(header_values)
    headers.update(draw(st.dictionaries(st.text(max_size=12), header_values, max_size=3)))
    return headers


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# The headers column as text: JSON objects of strings (the case that parses), any JSON at all
# (non-objects, values that are not strings), deep and huge documents, text that is no JSON.
header_texts = st.one_of(
    header_objects().map(json.dumps),
    header_objects().map(lambda headers: json.dumps(headers, ensure_ascii=False)),
    json_values.map(json.dumps),
    st.sampled_from([deep(10_000), '{"a":' * 5_000 + '"x"' + "}" * 5_000, "{}", "[]",
                     "null", '{"a":"\\ud800"}', '{"a":"\\udc80"}', '{"a":1}',
                     '{"' + "k" * 1_000_000 + '":"v"}', " " * 1_000]),
    storable_text,
)


def fuzzed_body(n: int, text: str) -> bytes:
    return msgspec.json.encode(Fuzzed(n=n, text=text))


def bodies(n: int) -> st.SearchStrategy[bytes | None]:
    """Bodies for the row numbered ``n``: the type's JSON (its field ``n`` names the row),
    JSON of the wrong shape, and bytes that are no JSON at all."""
    return st.one_of(
        st.builds(fuzzed_body, st.just(n), storable_text),
        st.builds(fuzzed_body, st.just(-n - 1), st.text(max_size=10)),  # its handler fails
        json_values.map(lambda value: json.dumps(value).encode()),
        st.builds(lambda extra: json.dumps({"n": n, **extra}).encode(),
                  st.dictionaries(st.text(max_size=5), json_values, max_size=3)),
        st.binary(max_size=64),
        st.none(),
        st.sampled_from([b"\xff\xfe", b"\x00" * 10, b'{"n": 1e999}', b'{"n": "1"}',
                         deep(5_000).encode(), b'{"n": ' + b"9" * 5_000 + b"}"]),
    )


class Row(msgspec.Struct, frozen=True):
    """A row to insert straight into a queue table."""

    native_id: uuid.UUID
    headers: str
    body: bytes | None
    expired: bool


@st.composite
def rows(draw: st.DrawFn, count: int) -> list[Row]:
    """``count`` hostile rows with distinct native ids; the ``n`` of row i's body (when it has
    one) is i, or -i-1 for a body whose handler fails; about one in ten has expired."""
    ids = draw(st.lists(st.uuids(), min_size=count, max_size=count, unique=True))
    return [Row(native_id, draw(header_texts), draw(bodies(i)), draw(st.integers(0, 9)) == 0)
            for i, native_id in enumerate(ids)]
