"""SQL text of the transport, in ``.sql`` files with one ``-- name --`` block per statement."""

from __future__ import annotations

import functools
import re
from importlib import resources

_BLOCK_HEADER = re.compile(r"^-- ([a-z_]+) --$", re.MULTILINE)


def parse_blocks(text: str) -> dict[str, str]:
    """Split SQL text into named statements; text before the first block is a preamble."""
    blocks: dict[str, str] = {}
    matches = list(_BLOCK_HEADER.finditer(text))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        name = match.group(1)
        if name in blocks:
            raise ValueError(f"SQL block {name!r} is defined twice")
        blocks[name] = text[match.end() : end].strip()
    return blocks


@functools.cache
def load(file_name: str) -> dict[str, str]:
    """Named statements of one ``.sql`` file of this package (read once per process)."""
    text = resources.files(__package__).joinpath(file_name).read_text(encoding="utf-8")
    return parse_blocks(text)
