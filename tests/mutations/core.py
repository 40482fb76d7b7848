"""The pure parts of a mutation run: defects as exact replacements, and reading pytest's result.

A defect is one or more :class:`Edit` (old text -> new text in a named file). An edit applies
only when its old text occurs exactly once in the file: a refactor that moves or rewrites that
text must fail the run loudly (:class:`DefectNotApplicable`), never turn the defect into a
no-op that every test then "misses" (or that an unrelated failure "catches").

Example::

    edit = Edit("endpoint_runtime/transport/sql/delayed.sql",
                "WHERE due <= statement_timestamp()\\n",
                "WHERE due <= statement_timestamp() + interval '1 second'\\n")
    planted = plant_in_memory(defect, read=lambda path: (root / path).read_text())
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


class DefectNotApplicable(Exception):
    """A defect's old text is not in its file exactly once (or the defect is malformed)."""


@dataclass(frozen=True)
class Edit:
    """Replace ``old`` by ``new`` in ``path`` (relative to the checkout's root, ``/``-separated).

    ``old`` must occur exactly once in the file; ``new`` must differ from it."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Defect:
    """A planted defect: its ``name`` (for ``--defect``), what it breaks (``summary``), its
    ``edits`` (applied in order; several may touch one file) and ``catchers``, the pytest node
    ids (files or tests, relative to the checkout's root) that should fail with it, cheapest
    first: ``--tests targeted`` runs those alone."""

    name: str
    summary: str
    edits: tuple[Edit, ...]
    catchers: tuple[str, ...]
    notes: str = field(default="", compare=False)

    @property
    def files(self) -> tuple[str, ...]:
        """The files the defect changes, each once, in the order of its edits."""
        return tuple(dict.fromkeys(edit.path for edit in self.edits))


def occurrences(text: str, old: str) -> int:
    """How many times ``old`` occurs in ``text``, overlapping ones counted too ("aa" is twice
    in "aaa"): a replacement of the first of two overlapping matches would be ambiguous."""
    if not old:
        raise DefectNotApplicable("an edit's old text is empty")
    count, start = 0, text.find(old)
    while start != -1:
        count += 1
        start = text.find(old, start + 1)
    return count


def replace_once(text: str, edit: Edit, *, defect: str = "") -> str:
    """``text`` with ``edit.old`` replaced by ``edit.new``.

    Raises:
        DefectNotApplicable: ``edit.old`` does not occur exactly once in ``text``, or the edit
            changes nothing. The message names the defect, the file and the count.
    """
    label = f"defect {defect!r}: " if defect else ""
    if edit.old == edit.new:
        raise DefectNotApplicable(f"{label}the edit of {edit.path} changes nothing")
    count = occurrences(text, edit.old)
    if count != 1:
        found = "not found" if count == 0 else f"found {count} times"
        raise DefectNotApplicable(
            f"{label}the old text is {found} in {edit.path} (it must occur exactly once; "
            f"has the code changed? update tests/mutations/defects.py):\n{_indent(edit.old)}")
    return text.replace(edit.old, edit.new, 1)


def plant_in_memory(defect: Defect, read: Callable[[str], str]) -> dict[str, str]:
    """The new contents of each file ``defect`` changes (``read(path)``: a file's current
    text), every edit checked before anything is written: a defect applies whole or not at
    all.

    Raises:
        DefectNotApplicable: an edit's old text is not in its file exactly once, a file cannot
            be read, or the defect has no edit.
    """
    if not defect.edits:
        raise DefectNotApplicable(f"defect {defect.name!r} has no edit")
    contents: dict[str, str] = {}
    for edit in defect.edits:
        if edit.path not in contents:
            try:
                contents[edit.path] = read(edit.path)
            except OSError as exc:
                raise DefectNotApplicable(
                    f"defect {defect.name!r}: cannot read {edit.path}: {exc}") from exc
        # Later edits see the earlier ones: each old text must be unique in the file as it is.
        contents[edit.path] = replace_once(contents[edit.path], edit, defect=defect.name)
    return contents


def select(defects: Iterable[Defect], names: Iterable[str]) -> list[Defect]:
    """The defects named (all when ``names`` is empty), in the catalogue's order.

    Raises:
        DefectNotApplicable: a name is not in the catalogue (the message lists the names).
    """
    catalogue = {defect.name: defect for defect in defects}
    wanted = list(dict.fromkeys(names))
    unknown = [name for name in wanted if name not in catalogue]
    if unknown:
        raise DefectNotApplicable(
            f"unknown defect {', '.join(map(repr, unknown))}; known: {', '.join(catalogue)}")
    return [d for d in catalogue.values() if not wanted or d.name in wanted]


def union_of_catchers(defects: Iterable[Defect]) -> list[str]:
    """Every catcher of ``defects``, each once, in the order first named."""
    return list(dict.fromkeys(catcher for defect in defects for catcher in defect.catchers))


# -- pytest's result -------------------------------------------------------------------------

_SUMMARY_HEADER = "short test summary info"
_SUMMARY_LINE = re.compile(r"^(FAILED|ERROR) (\S+?(?:\[.*?\])?)(?: - .*)?$")
"""``FAILED <node id>`` or ``ERROR <node id>``, then `` - <message>`` or nothing; a
parameter id in brackets may hold spaces and " - " itself."""


@dataclass(frozen=True)
class Failures:
    """Test ids in pytest's short summary: ``FAILED`` (the test failed) and ``ERROR`` (its
    set-up or tear-down failed, or its file did not collect)."""

    failed: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


def parse_failures(output: str) -> Failures:
    """The ``FAILED``/``ERROR`` lines of pytest's short test summary (``-rfE``, pytest's
    default), each id once, in order. Only lines after the summary's header count: a test's
    own output may hold lines that start with ``FAILED`` too."""
    failed: dict[str, None] = {}
    errors: dict[str, None] = {}
    lines = output.splitlines()
    headers = [i for i, line in enumerate(lines) if _SUMMARY_HEADER in line]
    for line in lines[headers[-1] + 1:] if headers else []:
        match = _SUMMARY_LINE.match(line.rstrip())
        if match is None:
            continue
        kind, node_id = match.groups()
        (failed if kind == "FAILED" else errors)[node_id.strip()] = None
    return Failures(tuple(failed), tuple(errors))


class Outcome(enum.StrEnum):
    """What a run with a planted defect says about it."""

    CAUGHT = "caught"  # pytest exit status 1: tests failed
    MISSED = "missed"  # 0: every selected test passed with the defect in place
    ERROR = "error"  # anything else: it says nothing about the defect


PYTEST_EXIT_STATUSES: Mapping[int, str] = {
    0: "all tests passed",
    1: "tests failed",
    2: "interrupted (a collection error, Ctrl-C)",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
}


def classify(exit_status: int) -> Outcome:
    """A defect is caught only when pytest says tests failed (exit status 1). A collection
    error, a usage error, an interrupt or a killed run (negative: the signal, as after the
    run's own timeout) is an :attr:`Outcome.ERROR`: the tests never judged the defect."""
    if exit_status == 1:
        return Outcome.CAUGHT
    if exit_status == 0:
        return Outcome.MISSED
    return Outcome.ERROR


def describe_exit(exit_status: int) -> str:
    """A few words on a pytest exit status, for progress lines."""
    if exit_status < 0:
        return f"killed by signal {-exit_status}"
    return PYTEST_EXIT_STATUSES.get(exit_status, "unknown exit status")


def _indent(text: str) -> str:
    return "\n".join(f"    | {line}" for line in text.splitlines() or [""])
