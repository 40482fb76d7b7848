"""OTLP/HTTP span export with an encoder of the runtime's own.

The SDK's OTLP exporter builds a protobuf object per span, attribute and value before it
serializes them: about 35 us of a receiver's CPU per span, as much as the SDK's making of the
span. :func:`encode_spans` writes the same ``ExportTraceServiceRequest`` bytes directly
(protobuf's wire format: tags, varints, length-delimited fields), and keeps the encoded bytes
of the attributes that repeat from span to span (an endpoint's queue, ``messaging.system``,
an operation's name): the bytes of a key and value met before are looked up, not made again.
:class:`SpanExporter` is the SDK's OTLP/HTTP exporter (its configuration, retries,
compression and client unchanged) with this encoding; ``OTEL_*`` variables choose it as
before (:mod:`.setup`). tests/unit/test_tracing_otlp.py decodes what it writes with
OpenTelemetry's protobuf classes and compares it with the SDK's encoding.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanContext

_HAS_IS_REMOTE = 0x100
_IS_REMOTE = 0x200
"""OTLP's span flags: whether the parent's (a link's) remoteness is known, and is remote."""
_CACHED_ATTRIBUTES = 4096
"""Encoded attributes kept; past this many the cache starts again (a long run of unique
values, e.g. message ids, must not grow it without end)."""


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64: two's complement, ten bytes
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (``tag``: its number and wire type 2, one byte)."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An ``AnyValue``'s fields."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(0x0A, value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + struct.pack("<d", value)
    if isinstance(value, bytes):
        return _field(0x3A, value)
    if isinstance(value, Sequence):  # ArrayValue: its values, field 1
        return _field(0x2A, b"".join(_field(0x0A, _any_value(item)) for item in value))
    if isinstance(value, Mapping):  # KeyValueList: its values, field 1
        return _field(0x32, b"".join(_field(0x0A, _key_value(str(k), v))
                                     for k, v in value.items()))
    if value is None:
        return b""
    raise TypeError(f"attribute value {value!r} of type {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    return _field(0x0A, key.encode()) + _field(0x12, _any_value(value))


class _Attributes:
    """Encoded ``KeyValue`` fields (tag ``tag`` each), the repeating ones from a cache."""

    __slots__ = ("_cache",)

    def __init__(self) -> None:
        self._cache: dict[tuple[str, type, Any], bytes] = {}

    def encode(self, attributes: Mapping[str, Any] | None, tag: int) -> bytes:
        if not attributes:
            return b""
        cache = self._cache
        parts = []
        # The SDK's BoundedAttributes keeps a plain dict: iterating it skips the Mapping
        # protocol's look-up per key (a third of the encoding's time).
        items = getattr(attributes, "_dict", attributes)
        for key, value in items.items():
            kind = type(value)
            if kind is list or kind is dict:  # not hashable: made each time
                parts.append(_field(tag, _key_value(key, value)))
                continue
            found = cache.get((key, kind, value))
            if found is None:
                if len(cache) >= _CACHED_ATTRIBUTES:
                    cache.clear()
                found = cache[(key, kind, value)] = _field(tag, _key_value(key, value))
            parts.append(found)
        return b"".join(parts)


def _flags(context: SpanContext | None) -> bytes:
    """Field 16 (fixed32) of a span, 6 of a link: whether ``context`` is remote."""
    flags = _HAS_IS_REMOTE | (_IS_REMOTE if context is not None and context.is_remote else 0)
    return struct.pack("<I", flags)


class SpanEncoder:
    """Encodes batches of finished spans as one ``ExportTraceServiceRequest``; keeps its
    cache of attributes between batches (one per exporter)."""

    def __init__(self) -> None:
        self._attributes = _Attributes()
        self._resources: dict[int, tuple[Any, bytes]] = {}
        self._scopes: dict[int, tuple[Any, bytes]] = {}

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        grouped: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
        for span in spans:
            _, scopes = grouped.setdefault(id(span.resource), (span.resource, {}))
            _, encoded = scopes.setdefault(id(span.instrumentation_scope),
                                           (span.instrumentation_scope, []))
            encoded.append(_field(0x12, self._span(span)))
        request = []
        for resource, scopes in grouped.values():
            parts = [self._resource(resource)]
            for scope, encoded in scopes.values():
                scope_spans = self._scope(scope) + b"".join(encoded)
                if scope is not None and scope.schema_url:
                    scope_spans += _field(0x1A, scope.schema_url.encode())
                parts.append(_field(0x12, scope_spans))
            if resource.schema_url:
                parts.append(_field(0x1A, resource.schema_url.encode()))
            request.append(_field(0x0A, b"".join(parts)))
        return b"".join(request)

    def _resource(self, resource: Any) -> bytes:
        """Field 1 of ``ResourceSpans``: the resource (a process has one: kept encoded)."""
        known = self._resources.get(id(resource))
        if known is None or known[0] is not resource:
            encoded = _field(0x0A, self._attributes.encode(resource.attributes, 0x0A))
            known = self._resources[id(resource)] = (resource, encoded)
        return known[1]

    def _scope(self, scope: Any) -> bytes:
        """Field 1 of ``ScopeSpans``: the instrumentation scope."""
        if scope is None:
            return b""
        known = self._scopes.get(id(scope))
        if known is None or known[0] is not scope:
            body = _field(0x0A, scope.name.encode())
            if scope.version:
                body += _field(0x12, scope.version.encode())
            body += self._attributes.encode(scope.attributes, 0x1A)
            known = self._scopes[id(scope)] = (scope, _field(0x0A, body))
        return known[1]

    def _span(self, span: ReadableSpan) -> bytes:
        context = span.get_span_context()
        assert context is not None
        attributes = self._attributes
        parts = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"),
                 b"\x12\x08", context.span_id.to_bytes(8, "big")]
        if context.trace_state:
            parts.append(_field(0x1A, context.trace_state.to_header().encode()))
        parent = span.parent
        if parent is not None:
            parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        parts.append(_field(0x2A, span.name.encode()))
        parts += (b"\x30", _varint(span.kind.value + 1),  # OTLP counts from UNSPECIFIED
                  b"\x39", struct.pack("<Q", span.start_time or 0),
                  b"\x41", struct.pack("<Q", span.end_time or 0),
                  attributes.encode(span.attributes, 0x4A))
        if span.dropped_attributes:
            parts += (b"\x50", _varint(span.dropped_attributes))
        for event in span.events:
            body = b"\x09" + struct.pack("<Q", event.timestamp) + _field(0x12, event.name.encode())
            body += attributes.encode(event.attributes, 0x1A)
            if event.dropped_attributes:
                body += b"\x20" + _varint(event.dropped_attributes)
            parts.append(_field(0x5A, body))
        if span.dropped_events:
            parts += (b"\x60", _varint(span.dropped_events))
        for link in span.links:
            body = (b"\x0a\x10" + link.context.trace_id.to_bytes(16, "big")
                    + b"\x12\x08" + link.context.span_id.to_bytes(8, "big")
                    + attributes.encode(link.attributes, 0x22))
            if link.dropped_attributes:
                body += b"\x28" + _varint(link.dropped_attributes)
            parts.append(_field(0x6A, body + b"\x35" + _flags(link.context)))
        if span.dropped_links:
            parts += (b"\x70", _varint(span.dropped_links))
        status = span.status
        body = _field(0x12, status.description.encode()) if status.description else b""
        if status.status_code.value:
            body += b"\x18" + _varint(status.status_code.value)
        parts += (_field(0x7A, body), b"\x85\x01", _flags(parent))
        return b"".join(parts)


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """``spans`` as the body of an OTLP/HTTP export (a fresh cache: see :class:`SpanEncoder`)."""
    return SpanEncoder().encode(spans)


class SpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP (protobuf) span exporter, encoding with :class:`SpanEncoder`.

    Only the encoding is replaced; the posting (compression, retries, timeouts) is the
    SDK's client. Left out of the SDK's ``export``: its refusal of a request above
    ``max_request_size`` (a batch of the runtime's spans stays far below the default) and
    its internal export metrics (``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``). Should a
    later SDK no longer expose what this relies on (its HTTP client as ``_client``), the
    SDK's own ``export`` runs instead.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._encoder = SpanEncoder()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        client = getattr(self, "_client", None)
        if client is None or getattr(self, "_shutdown", False):
            return super().export(spans)
        return (SpanExportResult.SUCCESS if client.export(self._encoder.encode(spans)).success
                else SpanExportResult.FAILURE)
