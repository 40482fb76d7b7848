"""Failure groups: failed messages of one cause, whatever ids their exception messages name.

ServicePulse groups failed messages by exception type and stack trace; grouping by the raw
message text makes "card declined for 4711" and "card declined for 4712" two groups. Here a
group is the exception type, the first line of its message with what varies between messages
of one cause masked (:func:`normalise`: ids, numbers, quoted values), and the innermost frames
of its stack trace (:func:`top_frames`: file and function, no line numbers, so a deploy that
moves a line keeps the group). Two exception types never share a group.

The key is computed once, from the error-queue copy's headers, wherever failures are read:
ingestion writes it into ``error_log`` (``failure_group``, ``failure_title``) for the console
and the report, and ``endpoint-runtime errors groups`` computes it from the error queue, with
this same function. The raw texts stay with each message.

Example::

    group = failure_group("billing.CardDeclined", "card declined for 4711", trace)
    group.title  # "card declined for <n>"
"""

from __future__ import annotations

import hashlib
import re

import msgspec

FRAMES = 3
"""Innermost stack frames in a group's key."""
TITLE_CHARS = 200
"""Characters of the normalised first line kept (the rest of a long line rarely names the
cause)."""

_MASKS = (
    # A quoted value: whatever it quotes (a name, a path, an id) varies between messages.
    (re.compile(r"'[^'\n]*'"), "'<…>'"),
    (re.compile(r'"[^"\n]*"'), '"<…>"'),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                r"[0-9a-fA-F]{12}\b"), "<id>"),
    # Hex strings of 8 or more with at least one digit (hashes, object ids, addresses).
    (re.compile(r"\b(?:0x)?(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b"), "<id>"),
    # Numbers standing alone or after punctuation (4711, -3, 19.95, ord-17), with any unit
    # (30s, 512MB), not at the end of a word (utf8, http2, ipv6).
    (re.compile(r"(?<![A-Za-z_<\d])-?\d+(?:[.,:]\d+)*[A-Za-z]*"), "<n>"),
)
_PYTHON_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line \d+, in (?P<function>\S+)')
_DOTNET_FRAME = re.compile(r"^\s*at (?P<function>[^(\s]+)")


class FailureGroup(msgspec.Struct, frozen=True):
    """A group's ``key`` (32 hex digits) and ``title`` (its normalised message)."""

    key: str
    title: str


def normalise(message: str | None) -> str:
    """The first line of ``message`` with ids, numbers and quoted values masked."""
    line = (message or "").strip().split("\n", 1)[0].strip()
    for pattern, mask in _MASKS:
        line = pattern.sub(mask, line)
    return line[:TITLE_CHARS]


def top_frames(stack_trace: str | None, count: int = FRAMES) -> list[str]:
    """The innermost ``count`` frames of a Python (or .NET) stack trace, as
    ``file:function`` (``function`` alone for .NET), innermost last."""
    frames = []
    for line in (stack_trace or "").splitlines():
        if python := _PYTHON_FRAME.match(line):
            path = python["file"].replace("\\", "/")
            frames.append(f"{path.rsplit('/', 1)[-1]}:{python['function']}")
        elif dotnet := _DOTNET_FRAME.match(line):
            frames.append(dotnet["function"])
    return frames[-count:] if count else []


def failure_group(exception_type: str | None, message: str | None,
                  stack_trace: str | None) -> FailureGroup:
    """The group of one failure (see the module docstring)."""
    title = normalise(message)
    frames = "|".join(top_frames(stack_trace))
    identity = f"{exception_type or ''}\n{title}\n{frames}"
    key = hashlib.md5(identity.encode(), usedforsecurity=False).hexdigest()
    return FailureGroup(key=key, title=title)
