"""The submit script's options: the command line over the [submit] table of --config (pure)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.submission.options import SubmitOptions, parse, resources

EVERY_KEY = """
[transport]
peek_delay = 0.5

[submit]
endpoints = ["handlers_examples.sales:endpoint", "handlers_examples.billing:endpoint"]
nodes = 3
nodes_timeout = 120
duration = 600
until_empty = true
max_concurrency = 12
receiver_resources = {queue_workers = 1}
peeker_resources = {head = 1}
status_interval = 2.5
install = true
replace = true
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cluster.toml"
    path.write_text(text)
    return str(path)


def test_every_option_can_come_from_the_file(tmp_path: Path) -> None:
    config = write(tmp_path, EVERY_KEY)
    assert parse(["--config", config]) == SubmitOptions(
        endpoints=["handlers_examples.sales:endpoint", "handlers_examples.billing:endpoint"],
        nodes=3, nodes_timeout=120.0, duration=600.0, until_empty=True, max_concurrency=12,
        receiver_resources={"queue_workers": 1.0}, peeker_resources={"head": 1.0},
        status_interval=2.5, install=True, replace=True, config=config)


def test_the_command_line_wins_over_the_file(tmp_path: Path) -> None:
    config = write(tmp_path, EVERY_KEY)
    options = parse(["other:endpoint", "--config", config, "--nodes", "2", "--no-until-empty",
                     "--receiver-resources", '{"node_b": 2}', "--no-install"])
    assert options.endpoints == ["other:endpoint"]
    assert (options.nodes, options.until_empty, options.install) == (2, False, False)
    assert options.receiver_resources == {"node_b": 2.0}
    assert options.duration == 600.0  # not given on the command line: the file's


def test_without_a_file_the_defaults() -> None:
    options = parse(["a:b"])
    assert options == SubmitOptions(endpoints=["a:b"])
    assert (options.nodes, options.status_interval, options.duration) == (1, 5.0, None)


@pytest.mark.parametrize(("table", "named"), [
    ("nodez = 3", "unknown key in [submit]: nodez"),
    ('nodes = "3"', "[submit] nodes: expected `int`, got `str`"),
    ("nodes = 0", "[submit] nodes: expected `int` >= 1"),
    ('until_empty = "yes"', "[submit] until_empty: expected `bool`, got `str`"),
    ('receiver_resources = {queue_workers = "one"}',
     "[submit] receiver_resources[...]: expected `float`, got `str`"),
    ('endpoints = "a:b"', "[submit] endpoints: expected `array`, got `str`"),
])
def test_a_bad_key_or_value_is_named(tmp_path: Path, table: str, named: str) -> None:
    config = write(tmp_path, f'[submit]\nendpoints = ["a:b"]\n{table}\n'.replace(
        'endpoints = ["a:b"]\nendpoints', "endpoints"))
    with pytest.raises(ConfigurationError) as caught:
        parse(["--config", config])
    assert named in str(caught.value)
    assert config in str(caught.value)


def test_no_endpoint_anywhere_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no endpoint to deploy"):
        parse(["--config", write(tmp_path, "[submit]\nnodes = 3\n")])


def test_an_unreadable_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the --config file"):
        parse(["a:b", "--config", str(tmp_path / "missing.toml")])
    with pytest.raises(ConfigurationError, match="cannot read the --config file"):
        parse(["a:b", "--config", write(tmp_path, "[submit\n")])


def test_a_bad_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        parse(["a:b", "--nodes", "0"])
    assert caught.value.code == 2
    assert "--nodes" in capsys.readouterr().err


def test_resources_as_json_or_as_name_equals_number() -> None:
    assert resources('{"queue_workers": 1}') == {"queue_workers": 1.0}
    assert resources("queue_workers=1") == {"queue_workers": 1.0}
    assert resources("queue_workers=1,gpu_box=0.5") == {"queue_workers": 1.0, "gpu_box": 0.5}


@pytest.mark.parametrize("text", [
    "{queue_workers: 1}",  # the JSON after `ray submit`'s shell took its quotes
    '{"queue_workers": 0}', '{"queue_workers": "1"}', "queue_workers", "queue_workers=-1",
    "queue_workers=x",
])
def test_malformed_resources_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        resources(text)
