"""The extraction of the README's first handler (tests/e2e/test_readme_first_handler.py
follows it): a README reshaped so that the extraction no longer sees its module or commands
fails here, not by running nothing."""

from __future__ import annotations

from tests.support.readme import first_handler_section, readme_commands, readme_module


def test_the_readme_parts_are_found() -> None:
    """The extraction itself: a README reshaped so this test no longer sees its commands
    fails here, not by running nothing."""
    section = first_handler_section()
    path, code = readme_module(section)
    commands = readme_commands(section)

    assert path.suffix == ".py"
    assert "Endpoint(" in code
    assert all(argv[0] == "endpoint-runtime" for argv in commands), commands
    assert any(argv[1] == "run" for argv in commands)
    assert any(argv[1] == "send" for argv in commands)
