"""Queue addresses and identifier quoting.

A queue is a table; its address is ``schema.table`` (``"schema"."table"`` when a part holds a
dot). Every identifier that reaches SQL goes through :func:`quote_identifier`, so a queue or
reply-to address can never inject SQL, whatever characters it holds.
"""

from __future__ import annotations

import hashlib

import msgspec

from endpoint_runtime.errors import InvalidQueueNameError

MAX_IDENTIFIER_BYTES = 63
# Names this runtime derives from a queue table's name; the longest must still fit in 63 bytes.
TABLE_NAME_SUFFIXES = ("_seq_seq", "_pkey", "_seq_idx", "_expires_idx", "_notify")
MAX_QUEUE_NAME_BYTES = MAX_IDENTIFIER_BYTES - max(len(s) for s in TABLE_NAME_SUFFIXES)
# An endpoint's delayed-message table and its index: "<endpoint>.delayed_due_idx".
ENDPOINT_NAME_SUFFIXES = (".delayed_due_idx", ".delayed_notify")
MAX_ENDPOINT_NAME_BYTES = MAX_IDENTIFIER_BYTES - max(len(s) for s in ENDPOINT_NAME_SUFFIXES)


def quote_identifier(name: str) -> str:
    """Quote one SQL identifier: wrap in double quotes, double any inner double quote."""
    if "\x00" in name:
        raise InvalidQueueNameError("identifiers cannot contain NUL characters")
    return '"' + name.replace('"', '""') + '"'


class QueueAddress(msgspec.Struct, frozen=True):
    """Where a queue lives: ``schema`` and ``table``."""

    table: str
    schema: str = "public"

    def __post_init__(self) -> None:
        for part, value in (("table", self.table), ("schema", self.schema)):
            if not value:
                raise InvalidQueueNameError(f"queue {part} name is empty")
            if "\x00" in value:
                raise InvalidQueueNameError(f"queue {part} name contains a NUL character")
            if len(value.encode()) > MAX_IDENTIFIER_BYTES:
                raise InvalidQueueNameError(
                    f"{part} name {value!r} is longer than PostgreSQL's "
                    f"{MAX_IDENTIFIER_BYTES}-byte identifiers"
                )

    def check_room_for_suffixes(
        self, suffixes: tuple[str, ...] = TABLE_NAME_SUFFIXES, what: str = "queue"
    ) -> None:
        """Fail clearly when names derived from this table would not fit in 63 bytes."""
        limit = MAX_IDENTIFIER_BYTES - max(len(s) for s in suffixes)
        size = len(self.table.encode())
        if size > limit:
            raise InvalidQueueNameError(
                f"{what} name {self.table!r} is {size} bytes; at most {limit} fit beside the "
                f"suffixes {', '.join(suffixes)} in PostgreSQL's {MAX_IDENTIFIER_BYTES}-byte "
                "identifiers"
            )

    @classmethod
    def parse(cls, address: str, default_schema: str = "public") -> QueueAddress:
        """Parse ``table``, ``schema.table`` or ``"sch.ema"."ta.ble"``."""
        parts = _split_address(address)
        if len(parts) == 1:
            return cls(parts[0], default_schema)
        if len(parts) == 2:
            return cls(parts[1], parts[0])
        raise InvalidQueueNameError(f"queue address {address!r} has more than two parts")

    @property
    def qualified(self) -> str:
        """Quoted ``"schema"."table"``, ready for SQL text."""
        return f"{quote_identifier(self.schema)}.{quote_identifier(self.table)}"

    def derived_name(self, suffix: str) -> str:
        """Name of an object that belongs to this queue (index, sequence, trigger)."""
        return self.table + suffix

    @property
    def notify_channel(self) -> str:
        """LISTEN/NOTIFY channel of this queue (a hash when the name would be too long)."""
        name = f"er.{self.schema}.{self.table}"
        if len(name.encode()) <= MAX_IDENTIFIER_BYTES:
            return name
        return "er." + hashlib.sha1(name.encode()).hexdigest()

    def __str__(self) -> str:
        if "." in self.schema or "." in self.table or '"' in self.schema + self.table:
            return self.qualified
        return f"{self.schema}.{self.table}"


def _split_address(address: str) -> list[str]:
    """Split on dots outside double quotes; ``""`` inside quotes is one quote."""
    if not address:
        raise InvalidQueueNameError("queue address is empty")
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    was_quoted = False
    i = 0
    while i < len(address):
        char = address[i]
        if quoted:
            if char == '"':
                if address[i + 1 : i + 2] == '"':
                    current.append('"')
                    i += 1
                else:
                    quoted = False
            else:
                current.append(char)
        elif char == '"' and not current:
            quoted = was_quoted = True
        elif char == ".":
            parts.append("".join(current))
            current, was_quoted = [], False
        else:
            if was_quoted:
                raise InvalidQueueNameError(f"unexpected text after quotes in {address!r}")
            current.append(char)
        i += 1
    if quoted:
        raise InvalidQueueNameError(f"unbalanced quotes in queue address {address!r}")
    parts.append("".join(current))
    return parts
