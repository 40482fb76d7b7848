"""The mutation runs' pytest plugin (``-p tests.mutations.plugin``): the command line's order,
and each failed test said at once.

**Order.** A mutation run names its tests cheapest first (the suite's folders, or a defect's
catchers) so that ``-x`` ends it at the first, cheapest catch. The suite's own conftest may
sort the tests otherwise (longest first, for parallel workers): here the tests run in the
order of the arguments that selected them, and in the order they were collected within one
argument.

**Failures.** With ``-x`` pytest stops after the first failure, but only once the failed
test's tear-down is done, and a tear-down can wait forever. The case first seen, a pool's
``close()`` waiting for the connection a timed-out test left on a lock, is bounded at its
source now (``PostgresTransport.close`` and the suite's ``pool`` fixture use ``close_pool``);
the watch stays for any other tear-down that waits on the database. pytest's own output
says nothing of the failure before the end (``-q``;
pytest-timeout's stack dump is captured), so the runner learns of it here and, if the run
then does not end, interrupts it (:func:`tests.mutations.runner.run_pytest`).
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Sequence
from pathlib import Path

import pytest

FAILED_MARK = "mutations-watch: failed "


def argument_prefixes(args: Sequence[str], invocation: Path, root: Path) -> list[str]:
    """Each argument as the start of the node ids it selects (relative to ``root``, ``/``)."""
    prefixes = []
    for arg in args:
        path, separator, rest = arg.partition("::")
        absolute = (invocation / path).resolve()
        try:
            relative = absolute.relative_to(root.resolve()).as_posix()
        except ValueError:
            relative = path
        prefixes.append(f"{relative}{separator}{rest}")
    return prefixes


def argument_index(nodeid: str, prefixes: Sequence[str]) -> int:
    """Which argument selected ``nodeid`` (the first that does; ``len(prefixes)``: none)."""
    for index, prefix in enumerate(prefixes):
        if (nodeid == prefix or nodeid.startswith((f"{prefix}::", f"{prefix}["))
                or ("::" not in prefix and nodeid.startswith(f"{prefix.rstrip('/')}/"))):
            return index
    return len(prefixes)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item],
) -> Generator[None, None, None]:
    collected = {id(item): position for position, item in enumerate(items)}
    yield  # the conftests' own sorting
    prefixes = argument_prefixes(config.args, config.invocation_params.dir, config.rootpath)
    items.sort(key=lambda item: (argument_index(item.nodeid, prefixes), collected[id(item)]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        # sys.__stderr__: pytest's capture replaced sys.stderr; the runner reads the real one.
        stream = sys.__stderr__
        if stream is not None:
            print(f"{FAILED_MARK}{report.nodeid} ({report.when})", file=stream, flush=True)
