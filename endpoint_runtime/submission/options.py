"""The submit script's options: the command line over the ``[submit]`` table of ``--config``.

Every long option has a key in the table, its name with underscores::

    [submit]
    endpoints = ["handlers_examples.sales:endpoint", "handlers_examples.billing:endpoint"]
    nodes = 3
    until_empty = true
    max_concurrency = 12
    receiver_resources = {queue_workers = 1}

Options given on the command line win over the file. An unknown key or a value of the wrong
type is a :class:`~endpoint_runtime.errors.ConfigurationError` naming the key (exit status 2).
The file is the way around ``ray submit``'s quoting: it joins the script's arguments with
spaces and runs them through a shell on the head, so JSON on the command line needs a second
level of quotes there.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any

import msgspec

from endpoint_runtime.cli.common import positive_float, positive_int
from endpoint_runtime.errors import ConfigurationError

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
Resources = dict[str, PositiveFloat]

TABLE = "submit"


class SubmitOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one run of the submit script does (the ``[submit]`` table's keys)."""

    endpoints: list[str] = []
    nodes: PositiveInt = 1
    nodes_timeout: PositiveFloat = 300.0
    duration: PositiveFloat | None = None
    until_empty: bool = False
    max_concurrency: PositiveInt | None = None
    receiver_resources: Resources | None = None
    peeker_resources: Resources | None = None
    status_interval: PositiveFloat = 5.0
    install: bool = False
    replace: bool = False
    config: str | None = None
    """The file these came from (not a key of the table)."""


def build_parser() -> argparse.ArgumentParser:
    """The command line; options not given are absent from the parsed namespace (so that
    the file's values stay)."""
    parser = argparse.ArgumentParser(
        prog="python -m endpoint_runtime.submit",
        description="Deploy endpoints on the Ray cluster (RAY_ADDRESS) against the configured "
        "PostgreSQL, run them, and print what each node did. Every option can also be set in "
        "the [submit] table of --config (its name with underscores); the command line wins.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("endpoints", nargs="*", metavar="MODULE:ATTR",
                        help="the Endpoints to deploy, e.g. handlers_examples.sales:endpoint "
                        "(or endpoints = [...] in [submit])")
    parser.add_argument("--config", metavar="FILE",
                        help="TOML settings file: its [submit] table (these options) and its "
                        "[transport] table are read")
    parser.add_argument("--nodes", type=positive_int, metavar="N",
                        help="wait until the cluster has N live nodes (default 1)")
    parser.add_argument("--nodes-timeout", type=positive_float, metavar="S",
                        help="give up waiting for the nodes after S seconds (default 300)")
    parser.add_argument("--duration", type=positive_float, metavar="S",
                        help="stop after S seconds (default: until SIGINT/SIGTERM)")
    parser.add_argument("--until-empty", action=argparse.BooleanOptionalAction,
                        help="stop once every endpoint's queue and delayed store are empty "
                        "and nothing is in flight")
    parser.add_argument("--max-concurrency", type=positive_int, metavar="N",
                        help="most messages in flight per deployment (receivers: N / "
                        "slots_per_receiver, 4 by default, rounded up)")
    parser.add_argument("--receiver-resources", type=resources, metavar="RESOURCES",
                        help='pin receivers to nodes with these Ray resources: JSON, e.g. '
                        '\'{"queue_workers": 1}\', or queue_workers=1 (default: spread over '
                        'every node)')
    parser.add_argument("--peeker-resources", type=resources, metavar="RESOURCES",
                        help="run the peekers on a node with these Ray resources (as above)")
    parser.add_argument("--status-interval", type=positive_float, metavar="S",
                        help="seconds between status lines (default 5)")
    parser.add_argument("--install", action=argparse.BooleanOptionalAction,
                        help="first create every endpoint's queues, tables and business "
                        "schema, as `endpoint-runtime db install` does")
    parser.add_argument("--replace", action=argparse.BooleanOptionalAction,
                        help="stop the deployments of the same endpoints that run now (their "
                        "drivers exit 0, replaced) once these run: a redeployment")
    return parser


_NAME_EQUALS = re.compile(r"^\s*([A-Za-z_][\w.:-]*)\s*=\s*([0-9.eE+-]+)\s*$")


def resources(text: str) -> dict[str, float]:
    """``--receiver-resources``: a JSON object of positive numbers, or ``name=N[,name=N]``
    (which needs no quotes through ``ray submit``)."""
    if text.lstrip().startswith("{"):
        try:
            value = msgspec.json.decode(text, type=Resources)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise argparse.ArgumentTypeError(
                f"not a JSON object of positive numbers: {exc} (through `ray submit`, quote "
                "it twice, write queue_workers=1, or use --config)") from exc
        return value
    found: dict[str, float] = {}
    for part in text.split(","):
        match = _NAME_EQUALS.match(part)
        if match is None:
            raise argparse.ArgumentTypeError(
                f"not a JSON object nor name=N pairs: {text!r} (e.g. queue_workers=1; a JSON "
                "object that lost its quotes in `ray submit` looks like {queue_workers: 1})")
        try:
            found[match[1]] = float(match[2])
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {match[2]!r}") from None
        if found[match[1]] <= 0:
            raise argparse.ArgumentTypeError(f"{match[1]} must be positive")
    return found


def parse(argv: list[str] | None = None) -> SubmitOptions:
    """The options of ``argv``: the command line over the ``[submit]`` table of ``--config``
    over the defaults. Exits with status 2 on a bad command line (argparse); raises
    :class:`ConfigurationError` on a bad file or no endpoint at all."""
    given = vars(build_parser().parse_args(argv))
    config = given.pop("config", None)
    if not given.get("endpoints"):
        given.pop("endpoints", None)  # nargs="*" gives [] when none are named
    options = from_file(config) if config is not None else SubmitOptions()
    options = msgspec.structs.replace(options, **given)
    if not options.endpoints:
        raise ConfigurationError("no endpoint to deploy: name them (MODULE:ATTR) or set "
                                 f"endpoints = [...] in the [{TABLE}] table of --config")
    return options


def from_file(path: str) -> SubmitOptions:
    """The ``[submit]`` table of the TOML file ``path`` (the defaults for what it omits)."""
    try:
        document = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read the --config file {path}: {exc}") from exc
    table = document.get(TABLE, {})
    if not isinstance(table, dict):
        raise ConfigurationError(f"{path}: {TABLE} must be a table ([{TABLE}])")
    keys = [name for name in SubmitOptions.__struct_fields__ if name != "config"]
    unknown = sorted(set(table) - set(keys))
    if unknown:
        raise ConfigurationError(
            f"{path}: unknown key{'s' if len(unknown) > 1 else ''} in [{TABLE}]: "
            f"{', '.join(unknown)} (known: {', '.join(keys)})")
    try:
        return msgspec.convert({**table, "config": path}, SubmitOptions)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(f"{path}: [{TABLE}] {_named(str(exc))}") from exc


def _named(error: str) -> str:
    """msgspec's ``Expected `int`, got `str` - at `$.nodes``` as ``nodes: expected `int`,
    got `str```."""
    message, _, where = error.rpartition(" - at `$")
    if not message:
        return error
    key = where.rstrip("`").lstrip(".")
    return f"{key}: {message[:1].lower()}{message[1:]}"


def as_arguments(options: SubmitOptions) -> dict[str, Any]:
    """The options that differ from the defaults (for the log line at start)."""
    defaults = SubmitOptions()
    return {name: getattr(options, name) for name in options.__struct_fields__
            if getattr(options, name) != getattr(defaults, name)}
