"""``endpoint-runtime send``: decode JSON into a msgspec Struct and send it to a queue.

Example::

    endpoint-runtime send sales --type handlers_examples.messages:PlaceOrder \\
        --json '{"order_id": "1", "customer": "c", "product": "mouse", "quantity": 1,
                 "unit_price": "19.95"}' --header tenant=acme

Without a queue, the message goes where its type is routed: by the routes of the endpoint
``--routes-of package.module:endpoint`` names (``endpoint.route`` and its settings), else by
``ENDPOINT_RUNTIME_ROUTES`` (docs/routing.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

import msgspec

from endpoint_runtime.chain.routing import RouteTable
from endpoint_runtime.cli.common import EXIT_OK, positive_int
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.runtime.endpoint import load_endpoint
from endpoint_runtime.runtime.sender import Sender
from endpoint_runtime.settings import ENV_PREFIX, TransportSettings, pairs

SENDER_NAME = "endpoint-runtime-cli"


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    send = commands.add_parser(
        "send", parents=[common], help="send a message to a queue",
        description="Decode --json into the msgspec Struct named by --type and send it.",
    )
    send.add_argument("queue", metavar="QUEUE", nargs="?", default=None,
                      help="destination queue ([schema.]name); default: the type's route")
    send.add_argument("--type", required=True, metavar="MODULE:STRUCT",
                      help="message type, e.g. handlers_examples.messages:PlaceOrder")
    send.add_argument("--json", required=True, metavar="JSON",
                      help="the message as a JSON object ('-' reads standard input)")
    send.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                      help="extra header (repeatable)")
    send.add_argument("--routes-of", metavar="MODULE:ENDPOINT", default=None,
                      help="route by this endpoint's routes when no QUEUE is given")
    send.add_argument("--count", type=positive_int, default=1, metavar="N",
                      help="send N copies, each with its own message id (default 1)")
    send.set_defaults(handler=send_command)


async def send_command(args: argparse.Namespace, settings: TransportSettings) -> int:
    message_type = import_message_type(args.type)
    message = decode_message(message_type, args.json)
    headers = parse_headers(args.header)
    routes = routes_for(args.routes_of)
    if args.queue is None:
        routes.require(message_type)  # before any connection: the line to add, at once
    async with Sender(SENDER_NAME, settings, routes=routes) as sender:
        for _ in range(args.count):
            message_id = await sender.send(message, args.queue, headers=headers or None)
            print(message_id, flush=True)
    return EXIT_OK


def routes_for(endpoint_path: str | None) -> RouteTable:
    """The routes of the endpoint at ``endpoint_path``, else those of
    ``ENDPOINT_RUNTIME_ROUTES``."""
    if endpoint_path is not None:
        return load_endpoint(endpoint_path).routes
    variable = ENV_PREFIX + "ROUTES"
    return RouteTable(pairs(variable, os.environ.get(variable, "")))


def import_message_type(spec: str) -> type[msgspec.Struct]:
    """``package.module:StructName`` (or ``package.module.StructName``) -> the class."""
    module_name, sep, attribute = spec.partition(":")
    if not sep:
        module_name, _, attribute = spec.rpartition(".")
    if not module_name or not attribute:
        raise ConfigurationError(f"--type {spec!r} must look like 'package.module:StructName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--type {spec!r}: cannot import {module_name!r}: {exc}") from exc
    found: Any = module
    for part in attribute.split("."):  # nested classes: module:Outer.Inner
        found = getattr(found, part, None)
        if found is None:
            raise ConfigurationError(f"--type {spec!r}: {module_name} has no {attribute!r}")
    if not (isinstance(found, type) and issubclass(found, msgspec.Struct)):
        raise ConfigurationError(f"--type {spec!r} is not a msgspec.Struct subclass")
    return found


def decode_message(message_type: type[msgspec.Struct], text: str) -> msgspec.Struct:
    """Decode ``--json`` (``-`` reads standard input) into ``message_type``."""
    if text == "-":
        text = sys.stdin.read()
    try:
        message: msgspec.Struct = msgspec.json.decode(text.encode(), type=message_type)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(
            f"--json does not fit {message_type.__module__}.{message_type.__qualname__}: {exc}"
        ) from exc
    except msgspec.DecodeError as exc:
        raise ConfigurationError(f"--json is not valid JSON: {exc}") from exc
    return message


def parse_headers(pairs: list[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--header {pair!r} must look like NAME=VALUE")
        headers[key.strip()] = value
    return headers
