"""``python -m tests.mutations``: plant each defect in a copy of the checkout, run the tests.

Usage::

    .venv/bin/python -m tests.mutations                        # every defect, the whole suite
    .venv/bin/python -m tests.mutations --tests targeted       # each against its catchers
    .venv/bin/python -m tests.mutations --defect skip-locked-dropped --tests targeted
    .venv/bin/python -m tests.mutations --control --tests targeted   # nothing planted
    .venv/bin/python -m tests.mutations --list

Progress goes to stderr; the result, as JSON, to stdout. Exit status: 0 when every defect was
caught (``--control``: when the control passed), 1 when one was missed or its run was an error
(``--control``: the control failed), 2 when the run was refused before any test ran (an
unknown defect, an old text not in its file exactly once, a copy that would not be the code
under test) or ``--tests targeted``'s control run was itself an error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.mutations import runner
from tests.mutations.core import (
    Defect,
    DefectNotApplicable,
    Outcome,
    classify,
    describe_exit,
    parse_failures,
    plant_in_memory,
    select,
    union_of_catchers,
)
from tests.mutations.defects import DEFECTS

DEFAULT_TIMEOUT = 4 * 3600.0
"""Seconds one pytest run may take (the suite's own per-test timeout is 300 s)."""

DEFAULT_HANG = 120.0
"""Seconds a run with ``-x`` may go on after a test failed: its tear-down and the session's
(Ray's shutdown included) take seconds; longer, a tear-down waits forever."""

OUTPUT_TAIL_LINES = 40


class Progress:
    """Progress lines on stderr, each with the seconds since the start."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"mutations [{elapsed:7.1f} s] {text}", file=sys.stderr, flush=True)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutations",
        description="Plant known defects, one at a time, in a copy of the checkout and check "
                    "that the tests fail.")
    parser.add_argument("--defect", action="append", default=[], metavar="NAME",
                        help="plant only this defect (repeatable; default: every one)")
    parser.add_argument("--tests", choices=("suite", "targeted"), default="suite",
                        help="suite: the whole suite with -x, cheapest folders first "
                             "(default); targeted: each defect's catchers only, after a "
                             "control run of them with nothing planted")
    parser.add_argument("--control", action="store_true",
                        help="only run the tests with no defect planted (they must pass)")
    parser.add_argument("--list", action="store_true",
                        help="list the defects, their files and catchers, and exit")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="end a pytest run that takes longer (an error, not a catch)")
    parser.add_argument("--hang", type=float, default=DEFAULT_HANG, metavar="SECONDS",
                        help="interrupt a run (-x) still going this long after a test "
                             "failed: its tear-down hangs (default: %(default)s)")
    parser.add_argument("--python", type=Path, default=None,
                        help="the interpreter the project is installed in "
                             "(default: the checkout's .venv/bin/python)")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="also write each run's whole pytest output there")
    parser.add_argument("--keep", action="store_true",
                        help="keep each copy (its server stopped) and print where it is")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="echo pytest's output to stderr as it runs")
    return parser.parse_args(argv)


def list_defects(defects: Sequence[Defect]) -> str:
    lines = []
    for defect in defects:
        lines.append(f"{defect.name}: {defect.summary}")
        lines.append(f"    files: {', '.join(defect.files)}")
        lines.extend(f"    catcher: {catcher}" for catcher in defect.catchers)
    return "\n".join(lines)


class Session:
    """The runs of one invocation: the source checkout, the interpreter and the options."""

    def __init__(self, args: argparse.Namespace, source: Path, progress: Progress) -> None:
        self.args = args
        self.source = source
        self.python: Path = args.python or runner.default_python(source)
        self.progress = progress

    def run(self, defect: Defect | None, targets: Sequence[str] | None, *, stop_first: bool,
            deselect: Sequence[str] = ()) -> dict[str, Any]:
        """One run in a fresh copy: ``defect`` planted (``None``: the control), pytest on
        ``targets`` (``None``: the suite's folders, cheapest first). The copy is removed
        whatever happens.

        Raises:
            runner.SetupError: the copy would not be the code under test.
            DefectNotApplicable: the defect does not plant in the copy.
        """
        label = f"defect {defect.name!r}" if defect else "control (nothing planted)"
        workspace = runner.make_workspace(self.source)
        env = runner.child_environment(workspace, defect.name if defect else None)
        try:
            if defect is not None:
                runner.plant(workspace.src, defect)
            imports = runner.verify_imports(self.python, workspace, env)
            chosen = list(targets) if targets is not None else runner.suite_targets(
                workspace.src)
            planted = f"planted in {', '.join(defect.files)}; " if defect else ""
            self.progress(f"{label}: {planted}copy {workspace.src}; endpoint_runtime imports "
                          f"from {imports.package}")
            self.progress(f"{label}: pytest {'-x ' if stop_first else ''}on {len(chosen)} "
                          f"target(s): {' '.join(chosen)}"
                          + (f" (deselected: {' '.join(deselect)})" if deselect else ""))
            command = runner.pytest_command(self.python, chosen, stop_first=stop_first,
                                            deselect=deselect, basetemp=workspace.basetemp,
                                            xdist=imports.xdist)
            result = runner.run_pytest(
                command, cwd=workspace.src, env=env, timeout=self.args.timeout,
                echo=self.args.verbose, hang_seconds=self.args.hang if stop_first else None)
        finally:
            self._clean_up(label, workspace, env)
        self._write_log(defect.name if defect else "control", result.output)
        report = self._report(label, defect, chosen, deselect, result)
        report["package"] = imports.package  # the proof that the copy was under test
        return report

    def _clean_up(self, label: str, workspace: runner.Workspace, env: dict[str, str]) -> None:
        problem = runner.stop_database(self.python, workspace, env)
        if problem:
            self.progress(f"{label}: {problem}")
        ended = runner.end_leftovers(workspace)
        if ended:
            self.progress(f"{label}: ended leftover processes {ended}")
        if self.args.keep:
            self.progress(f"{label}: kept {workspace.root}")
        else:
            runner.remove_workspace(workspace)

    def _write_log(self, name: str, output: str) -> None:
        if self.args.log_dir is not None:
            self.args.log_dir.mkdir(parents=True, exist_ok=True)
            (self.args.log_dir / f"{name}.log").write_text(output, encoding="utf-8")

    def _report(self, label: str, defect: Defect | None, targets: Sequence[str],
                deselect: Sequence[str], result: runner.PytestRun) -> dict[str, Any]:
        failures = parse_failures(result.output)
        outcome = classify(result.exit_status)
        failing = [*failures.failed, *failures.errors]
        verdict = (outcome.value.upper() if defect is not None
                   else {Outcome.MISSED: "PASSED", Outcome.CAUGHT: "FAILED"}.get(
                       outcome, "ERROR"))
        notes = [describe_exit(result.exit_status)]
        if result.timed_out:
            notes.append(f"ended after --timeout {self.args.timeout:g} s")
        if result.interrupted_after_failure:
            notes.append(f"interrupted: still running {self.args.hang:g} s after a failure")
        self.progress(f"{label}: {verdict} (exit {result.exit_status}: {'; '.join(notes)}) "
                      f"in {result.seconds:.1f} s"
                      + (f"; first failing: {failing[0]}" if failing else ""))
        if outcome is Outcome.ERROR or (defect is None and outcome is Outcome.CAUGHT):
            tail = result.output.splitlines()[-OUTPUT_TAIL_LINES:]
            print("\n".join(f"    | {line}" for line in tail), file=sys.stderr, flush=True)
        report: dict[str, Any] = {
            "name": defect.name if defect else "control",
            "file": ", ".join(defect.files) if defect else None,
            "tests": self.args.tests,
            "targets": list(targets),
            "deselected": list(deselect),
            "exit_status": result.exit_status,
            "outcome": outcome.value,
            "caught": outcome is Outcome.CAUGHT,
            "seconds": round(result.seconds, 1),
            "timed_out": result.timed_out,
            "interrupted_after_failure": result.interrupted_after_failure,
            "first_failing": failing[0] if failing else None,
            "failed": list(failures.failed),
            "errors": list(failures.errors),
        }
        if defect is None:
            report.pop("caught")
            report["passed"] = result.exit_status == 0
        return report


def check_plantable(defects: Sequence[Defect], source: Path) -> None:
    """Every defect plants in the checkout as it is now, before any run starts.

    Raises:
        DefectNotApplicable: one does not (the message says which, where and why).
    """
    for defect in defects:
        plant_in_memory(defect, lambda path: (source / path).read_bytes().decode("utf-8"))


def main(argv: Sequence[str] | None = None, *, catalogue: Sequence[Defect] = DEFECTS,
         source: Path = runner.REPO_ROOT) -> int:
    """Run the command (see the module docstring); the exit status."""
    args = parse_arguments(argv)
    progress = Progress()
    try:
        defects = select(catalogue, args.defect)
        if args.list:
            print(list_defects(defects))
            return 0
        check_plantable(defects, source)
    except DefectNotApplicable as exc:
        print(f"mutations: refused: {exc}", file=sys.stderr, flush=True)
        return 2
    session = Session(args, source, progress)
    targeted = args.tests == "targeted"
    union = union_of_catchers(defects) if targeted else None
    result: dict[str, Any] = {"tests": args.tests, "control": None, "defects": []}
    try:
        if args.control or targeted:
            # All catchers at once and without -x: every catcher that fails with nothing
            # planted is known, and deselected from the defects' runs (it catches nothing).
            control = session.run(None, union, stop_first=not targeted)
            result["control"] = control
            if args.control:
                print(json.dumps(result, indent=2))
                return 0 if control["passed"] else (1 if control["outcome"] != "error" else 2)
            if control["outcome"] == Outcome.ERROR.value:
                progress("the control run was an error: no defect is run")
                print(json.dumps(result, indent=2))
                return 2
        # pytest ignores a deselected id that is not among a run's tests.
        deselect = (result["control"]["failed"] + result["control"]["errors"]
                    if result["control"] else [])
        for defect in defects:
            chosen = list(defect.catchers) if targeted else None
            result["defects"].append(
                session.run(defect, chosen, stop_first=True, deselect=deselect))
    except (runner.SetupError, DefectNotApplicable) as exc:
        print(f"mutations: refused: {exc}", file=sys.stderr, flush=True)
        print(json.dumps(result, indent=2))
        return 2
    reports = result["defects"]
    result["total"] = {
        "defects": len(reports),
        "caught": sum(r["outcome"] == Outcome.CAUGHT.value for r in reports),
        "missed": sum(r["outcome"] == Outcome.MISSED.value for r in reports),
        "errors": sum(r["outcome"] == Outcome.ERROR.value for r in reports),
        "seconds": round(time.monotonic() - progress.started, 1),
    }
    for report in reports:
        progress(f"{report['name']}: {report['outcome'].upper()}"
                 + (f" by {report['first_failing']}" if report["first_failing"] else ""))
    print(json.dumps(result, indent=2))
    return 0 if reports and all(r["caught"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
