"""``endpoint-runtime subscriptions list|add|remove|prune``: the publish/subscribe table by
hand.

A subscription maps (endpoint, topic) to the queue that receives the topic's events; a topic
is a message type's wire name (``module.QualName``, or its ``__message_type_name__``).
Deployments subscribe by themselves to every type they handle but commands; these commands
are for peers that do not (or for undoing a subscription).

Example::

    endpoint-runtime subscriptions list
    endpoint-runtime subscriptions add billing shop.events.OrderPlaced [--queue billing]
    endpoint-runtime subscriptions remove billing shop.events.OrderPlaced
    endpoint-runtime subscriptions prune [--dry-run]   # those whose queue does not exist
    endpoint-runtime subscriptions policy Shipping.Tracker --role shipping_app

Under row-level security (``db grants``, docs/security.md) a role changes only its own
endpoint's rows; run these as the table's owner to change anyone's.
"""

from __future__ import annotations

import argparse

from endpoint_runtime.chain.subscriptions import (
    dangling_subscriptions,
    prune_dangling,
    subscription_store,
)
from endpoint_runtime.cli.common import EXIT_FAILED, EXIT_OK, existing_queue, printable
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.privileges import subscription_policies
from endpoint_runtime.settings import TransportSettings


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    subscriptions = commands.add_parser(
        "subscriptions", parents=[common], help="list, add, remove event subscriptions",
        description="The subscription table of publish/subscribe (see --help of each command).",
    )
    sub_commands = subscriptions.add_subparsers(dest="subscriptions_command", required=True,
                                                metavar="COMMAND")
    listing = sub_commands.add_parser("list", parents=[common],
                                      help="every subscription, by topic")
    listing.add_argument("--endpoint", default=None, help="only this endpoint's")
    listing.set_defaults(handler=subscriptions_list)
    add = sub_commands.add_parser("add", parents=[common],
                                  help="subscribe an endpoint to a topic (an upsert)")
    add.add_argument("endpoint", metavar="ENDPOINT")
    add.add_argument("topic", metavar="TOPIC", help="the event type's wire name")
    add.add_argument("--queue", default=None,
                     help="the queue that receives the events (default: the endpoint's name)")
    add.set_defaults(handler=subscriptions_add)
    remove = sub_commands.add_parser("remove", parents=[common],
                                     help="unsubscribe an endpoint from a topic")
    remove.add_argument("endpoint", metavar="ENDPOINT")
    remove.add_argument("topic", metavar="TOPIC")
    remove.set_defaults(handler=subscriptions_remove)
    prune = sub_commands.add_parser(
        "prune", parents=[common], help="remove the subscriptions whose queue does not exist",
        description="Remove every subscription whose queue table does not exist (or whose "
        "address does not parse): a decommissioned endpoint, a typo. A table the role may not "
        "use exists all the same and stays.")
    prune.add_argument("--dry-run", action="store_true", help="only list them")
    prune.set_defaults(handler=subscriptions_prune)
    policy = sub_commands.add_parser(
        "policy", parents=[common],
        help="print the row-level security that lets ROLE change only ENDPOINT's rows",
        description="Print the statements (for the subscription table's owner) that let ROLE "
        "change only the subscriptions of ENDPOINT, e.g. an NServiceBus endpoint's role; "
        "db grants prints them for this runtime's endpoints.")
    policy.add_argument("endpoint", metavar="ENDPOINT")
    policy.add_argument("--role", required=True, help="the endpoint's database role")
    policy.set_defaults(handler=subscriptions_policy)


async def subscriptions_list(args: argparse.Namespace, settings: TransportSettings) -> int:
    store = subscription_store(settings)
    async with PostgresTransport.connect(settings) as transport:
        async with transport.pool.acquire() as connection:
            await store.setup(connection)
        found = await store.list(transport.pool, args.endpoint)
    if not found:
        print("no subscriptions")
        return EXIT_OK
    rows = [(printable(s.topic, keep=""), printable(s.endpoint, keep=""),
             printable(s.queue_address, keep="")) for s in found]
    widths = [max(len(title), *(len(row[i]) for row in rows))
              for i, title in enumerate(("topic", "endpoint"))]
    print(f"{'topic':<{widths[0]}}  {'endpoint':<{widths[1]}}  queue")
    for topic, endpoint, queue in rows:
        print(f"{topic:<{widths[0]}}  {endpoint:<{widths[1]}}  {queue}")
    return EXIT_OK


async def subscriptions_add(args: argparse.Namespace, settings: TransportSettings) -> int:
    store = subscription_store(settings)
    async with PostgresTransport.connect(settings) as transport:
        queue = await existing_queue(transport, args.queue or args.endpoint)
        async with transport.pool.acquire() as connection:
            await store.setup(connection)
            await store.subscribe(connection, queue, args.endpoint, args.topic)
    print(f"subscribed {printable(args.endpoint, keep='')} ({queue}) to "
          f"{printable(args.topic, keep='')}")
    return EXIT_OK


async def subscriptions_remove(args: argparse.Namespace, settings: TransportSettings) -> int:
    store = subscription_store(settings)
    async with PostgresTransport.connect(settings) as transport:
        async with transport.pool.acquire() as connection:
            await store.setup(connection)
        removed = await store.unsubscribe(transport.pool, args.endpoint, args.topic)
    what = f"{printable(args.endpoint, keep='')} from {printable(args.topic, keep='')}"
    if not removed:
        print(f"no subscription of {what}")
        return EXIT_FAILED
    print(f"unsubscribed {what}")
    return EXIT_OK


async def subscriptions_prune(args: argparse.Namespace, settings: TransportSettings) -> int:
    store = subscription_store(settings)
    async with PostgresTransport.connect(settings) as transport:
        found = await dangling_subscriptions(transport.pool, store, settings.schema)
        removed = [] if args.dry_run else await prune_dangling(transport.pool, store, found)
    if not found:
        print("no subscriptions point nowhere")
        return EXIT_OK
    gone = {(s.endpoint, s.topic, s.queue_address) for s in removed}
    for dangling in found:
        subscription = dangling.subscription
        key = (subscription.endpoint, subscription.topic, subscription.queue_address)
        verb = ("would remove" if args.dry_run else "removed" if key in gone else "kept")
        why = ("its queue does not exist" if dangling.address is not None
               else "its address does not parse")
        print(f"{verb} {printable(subscription.endpoint, keep='')} -> "
              f"{printable(subscription.queue_address, keep='')} "
              f"({printable(subscription.topic, keep='')}): {why}")
    kept = 0 if args.dry_run else len(found) - len(removed)
    if kept:
        print(f"{kept} kept: created since, or not this role's to change (row-level security; "
              f"run as the table's owner)")
        return EXIT_FAILED
    return EXIT_OK


async def subscriptions_policy(args: argparse.Namespace, settings: TransportSettings) -> int:
    for statement in subscription_policies(subscription_store(settings).table, args.role,
                                           args.endpoint):
        print(printable(statement))
    return EXIT_OK
