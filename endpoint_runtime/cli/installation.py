"""``endpoint-runtime db install|grants``: an endpoint's tables, and a role that may only use
them (docs/security.md).

Example::

    endpoint-runtime db install handlers_examples.sales:endpoint         # as an admin role
    endpoint-runtime db grants handlers_examples.sales:endpoint --role sales_app \\
        --sends-to billing --database shop | psql shop
"""

from __future__ import annotations

import argparse

import msgspec

from endpoint_runtime.cli.common import EXIT_OK, printable
from endpoint_runtime.cli.run import merged_transport
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.database.installation import EndpointTables, install
from endpoint_runtime.database.privileges import endpoint_grants
from endpoint_runtime.runtime.endpoint import Endpoint, load_endpoint
from endpoint_runtime.settings import EndpointSettings, TransportSettings


def add_parsers(
    db_commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    """``install`` and ``grants`` under ``db``."""
    installing = db_commands.add_parser(
        "install", parents=[common], help="create an endpoint's queues and tables (DDL)",
        description="Create what a deployment of the endpoint uses (its queue, error and audit "
        "queues, delayed store, outbox, subscription table) when missing, and run its business "
        "schema (schema_sql, install hooks), as the connecting role; then endpoints may run "
        "with ENDPOINT_RUNTIME_INSTALLERS=false and no DDL rights. Idempotent; not a "
        "migration tool.")
    installing.add_argument("endpoint", metavar="MODULE:ATTR")
    installing.set_defaults(handler=db_install)
    grants = db_commands.add_parser(
        "grants", parents=[common], help="print the GRANTs a role needs to run an endpoint",
        description="Print GRANT statements that let ROLE run the endpoint (no CREATE, no "
        "ownership), and the row-level security that lets it change only its own "
        "subscriptions; grants on the handlers' business tables (even those the endpoint "
        "declares) are yours to add.")
    grants.add_argument("endpoint", metavar="MODULE:ATTR")
    grants.add_argument("--role", required=True, help="the endpoint's database role")
    grants.add_argument("--sends-to", action="append", default=[], metavar="QUEUE",
                        help="a queue the handlers send, publish or reply to (repeatable)")
    grants.add_argument("--database", default=None,
                        help="also grant CONNECT on this database")
    grants.set_defaults(handler=db_grants)


def endpoint_settings(endpoint: Endpoint, args: argparse.Namespace) -> EndpointSettings:
    """The endpoint's settings with the transport of ``--config`` and the environment, as
    ``run`` deploys it."""
    transport = merged_transport(endpoint, args.config)
    return msgspec.structs.replace(endpoint.settings, transport=transport)


async def db_install(args: argparse.Namespace, settings: TransportSettings) -> int:
    endpoint = load_endpoint(args.endpoint)
    endpoint_config = endpoint_settings(endpoint, args)
    async with PostgresTransport.connect(endpoint_config.transport) as transport:
        await install(transport, endpoint, endpoint_config)
    for what, table in EndpointTables.of(endpoint, endpoint_config).named():
        print(printable(f"{what}: {table}"))
    for name in endpoint.business_schema.tables:
        print(printable(f"business table: {name}"))
    return EXIT_OK


async def db_grants(args: argparse.Namespace, settings: TransportSettings) -> int:
    endpoint = load_endpoint(args.endpoint)
    for statement in endpoint_grants(endpoint, endpoint_settings(endpoint, args), args.role,
                                     sends_to=args.sends_to, database=args.database):
        print(printable(statement))
    if endpoint.business_schema.tables:  # a reminder, as an SQL comment: psql skips it
        print(printable("-- not granted here: the business tables the endpoint declares ("
                        + ", ".join(endpoint.business_schema.tables)
                        + "); grant the role what its handlers do with them"))
    return EXIT_OK
