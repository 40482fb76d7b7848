"""``endpoint-runtime queues list|create|purge|peek``: manage queue tables.

Example::

    endpoint-runtime queues create sales billing
    endpoint-runtime queues list --schema public
    endpoint-runtime queues peek sales
    endpoint-runtime queues purge sales --expired-only
"""

from __future__ import annotations

import argparse

from endpoint_runtime.cli.common import EXIT_OK, existing_queue, printable
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    queues = commands.add_parser("queues", parents=[common], help="list, create, purge, peek")
    queue_commands = queues.add_subparsers(dest="queues_command", required=True,
                                           metavar="COMMAND")
    listing = queue_commands.add_parser("list", parents=[common],
                                        help="queue tables and their depth")
    listing.add_argument("--schema", default=None, help="only this schema (default: all)")
    listing.set_defaults(handler=queues_list)
    create = queue_commands.add_parser("create", parents=[common],
                                       help="create queues (idempotent)")
    create.add_argument("names", nargs="+", metavar="NAME", help="[schema.]name")
    create.set_defaults(handler=queues_create)
    purge = queue_commands.add_parser("purge", parents=[common],
                                      help="delete the messages of a queue")
    purge.add_argument("name", metavar="NAME")
    purge.add_argument("--expired-only", action="store_true",
                       help="delete only messages whose time to be received has passed")
    purge.set_defaults(handler=queues_purge)
    peek = queue_commands.add_parser("peek", parents=[common],
                                     help="the peek estimate and the exact depth")
    peek.add_argument("name", metavar="NAME")
    peek.set_defaults(handler=queues_peek)


async def queues_list(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        found = await transport.list_queues(args.schema)
    if not found:
        where = f"schema {printable(args.schema, keep='')}" if args.schema else "any schema"
        print(f"no queues in {where}")
        return EXIT_OK
    names = [_shown(q.address) for q in found]
    width = max(len("queue"), *(len(n) for n in names))
    print(f"{'queue':<{width}}  {'depth':>10}")
    for name, queue in zip(names, found, strict=True):
        print(f"{name:<{width}}  {queue.depth:>10}")
    return EXIT_OK


async def queues_create(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        for name in args.names:
            address = await transport.create_queue(name)
            print(f"queue {_shown(address)} is ready")
    return EXIT_OK


async def queues_purge(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        address = await existing_queue(transport, args.name)
        if args.expired_only:
            deleted = await transport.purge_expired(address)
            print(f"purged {deleted} expired message(s) from {_shown(address)}")
        else:
            deleted = await transport.purge(address)
            print(f"purged {deleted} message(s) from {_shown(address)}")
    return EXIT_OK


async def queues_peek(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport:
        address = await existing_queue(transport, args.name)
        estimate = await transport.peek(address)
        depth = await transport.depth(address)
    print(f"queue {_shown(address)}: estimate {estimate} (unlocked, max-min seq), "
          f"depth {depth} (rows)")
    return EXIT_OK


def _shown(address: QueueAddress) -> str:
    """A queue's name as printed: a table may be named anything, terminal escapes included."""
    return printable(str(address), keep="")
