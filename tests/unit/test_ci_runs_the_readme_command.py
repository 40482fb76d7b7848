"""CI's `.ci/run` runs the README's test command, the very command line a reader copies: the
README's two commands (its "The two commands" section) are read as a shell reads them, and
each command line of `.ci/run` likewise."""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.support.readme import README, readme_commands, readme_section

CI_RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"
TWO_COMMANDS = "## The two commands"


def two_commands(readme: str) -> list[list[str]]:
    return readme_commands(readme_section(TWO_COMMANDS, readme))


def ci_command_lines(script: str) -> list[list[str]]:
    """Each line of ``script`` that is a command of its own, split as a shell would."""
    lines = []
    for line in script.splitlines():
        try:
            argv = shlex.split(line, comments=True)
        except ValueError:  # a line inside a quoted string running over lines
            continue
        if argv:
            lines.append(argv)
    return lines


def runs_the_test_command(readme: str, script: str) -> bool:
    examples, test = two_commands(readme)
    assert examples[-1] == "examples", examples
    assert test[-1] == "test", test
    return test in ci_command_lines(script)


def test_ci_runs_the_readmes_test_command() -> None:
    readme = README.read_text(encoding="utf-8")
    assert len(two_commands(readme)) == 2
    assert runs_the_test_command(readme, CI_RUN.read_text(encoding="utf-8"))


def test_the_check_fails_when_ci_runs_another_command() -> None:
    readme = README.read_text(encoding="utf-8")
    script = CI_RUN.read_text(encoding="utf-8")
    (test_line,) = (" ".join(argv) for argv in ci_command_lines(script)
                    if argv == two_commands(readme)[1])
    planted = script.replace(test_line, ".venv/bin/python -m pytest")
    assert not runs_the_test_command(readme, planted)
    assert not runs_the_test_command(readme.replace("bin/dev test", "make test"), script)
