"""``endpoint-runtime sagas list|show``: the live saga instances in their tables.

Example::

    endpoint-runtime sagas list                           # saga tables and their instances
    endpoint-runtime sagas list sales_OrderFulfilment     # the instances of one saga type
    endpoint-runtime sagas show sales_OrderFulfilment --correlation o-17
    endpoint-runtime sagas show OrderFulfilment --correlation o-17  # the saga's name alone

A saga table is found by its columns (NServiceBus SQL persistence's layout), so the command
needs no endpoint module. Completed instances are deleted (as NServiceBus does): they are in
the audit copies (``NServiceBus.InvokedSagas``), not here.
"""

from __future__ import annotations

import argparse

from endpoint_runtime.chain.sagas.storage import (
    SagaTable,
    find_saga_tables,
    list_instances,
    stored_table,
)
from endpoint_runtime.cli.common import EXIT_FAILED, EXIT_OK, printable
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.errors import ConfigurationError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.transport import QueueAddress
from endpoint_runtime.transport.connection import DatabaseConnection

DATA_WIDTH = 60


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    common: argparse.ArgumentParser,
) -> None:
    sagas = commands.add_parser("sagas", parents=[common], help="live saga instances")
    saga_commands = sagas.add_subparsers(dest="sagas_command", required=True, metavar="COMMAND")
    listing = saga_commands.add_parser(
        "list", parents=[common],
        help="saga tables and their instance counts, or the instances of TYPE")
    listing.add_argument("type", nargs="?", metavar="TYPE",
                         help="a saga table, [schema.]<endpoint>_<SagaName>, or <SagaName> "
                              "when one endpoint has it")
    listing.add_argument("--schema", default=None, help="only this schema (default: all)")
    listing.add_argument("--limit", type=int, default=100, help="most instances shown")
    listing.set_defaults(handler=sagas_list)
    show = saga_commands.add_parser("show", parents=[common],
                                    help="one instance's state and metadata")
    show.add_argument("type", metavar="TYPE",
                      help="a saga table, [schema.]<endpoint>_<SagaName>, or <SagaName>")
    which = show.add_mutually_exclusive_group(required=True)
    which.add_argument("--correlation", metavar="VALUE", help="its correlation value")
    which.add_argument("--id", metavar="SAGA_ID", help="its saga id")
    show.set_defaults(handler=sagas_show)


async def sagas_list(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport, \
            transport.pool.acquire() as connection:
        if args.type is None:
            stored = await find_saga_tables(connection, args.schema)
            if not stored:
                print("no saga tables")
                return EXIT_OK
            names = [printable(str(t.address)) for t in stored]
            width = max(len("saga table"), *(len(n) for n in names))
            print(f"{'saga table':<{width}}  {'instances':>10}  correlation")
            for name, found in zip(names, stored, strict=True):
                column = printable(found.correlation_column or "-")
                print(f"{name:<{width}}  {found.instances:>10}  {column}")
            return EXIT_OK
        table = await saga_table(connection, args.type, settings)
        instances = await list_instances(connection, table, limit=args.limit)
    if not instances:
        print(f"no live instances in {printable(str(table.address))}")
        return EXIT_OK
    print(f"{'saga id':<36}  {'correlation':<20}  {'version':>7}  data")
    for row in instances:
        data = row["data"]
        if len(data) > DATA_WIDTH:
            data = data[:DATA_WIDTH - 3] + "..."
        print(f"{row['Id']!s:<36}  {printable(str(row['correlation'] or '-')):<20}  "
              f"{row['Concurrency']:>7}  {printable(data)}")
    return EXIT_OK


async def sagas_show(args: argparse.Namespace, settings: TransportSettings) -> int:
    async with PostgresTransport.connect(settings) as transport, \
            transport.pool.acquire() as connection:
        table = await saga_table(connection, args.type, settings)
        found = await list_instances(connection, table, limit=1, correlation=args.correlation,
                                     saga_id=args.id)
    if not found:
        what = (f"correlation {args.correlation!r}" if args.correlation is not None
                else f"id {args.id!r}")
        print(f"no live instance of {printable(str(table.address))} with {printable(what)} "
              "(completed instances are deleted)")
        return EXIT_FAILED
    row = found[0]
    print(f"saga id:           {row['Id']}")
    print(f"correlation:       {printable(str(row['correlation'] or '-'))}")
    print(f"concurrency:       {row['Concurrency']}")
    print(f"saga type version: {printable(str(row['SagaTypeVersion']))}")
    print(f"metadata:          {printable(row['Metadata'])}")
    print(f"data:              {printable(row['data'])}")
    return EXIT_OK


def _address(name: str, settings: TransportSettings) -> QueueAddress:
    return QueueAddress.parse(name, settings.schema)


async def saga_table(connection: DatabaseConnection, name: str,
                     settings: TransportSettings) -> SagaTable:
    """``name`` as a saga table (``[schema.]<endpoint>_<SagaName>``, NServiceBus's table
    name), else as a saga's name alone: the one table, in any schema, named
    ``<endpoint>_<name>``. Several endpoints with that saga, or none: ``ConfigurationError``
    naming what there is."""
    address = _address(name, settings)
    try:
        return await stored_table(connection, address)
    except ConfigurationError:
        if "." in name:
            raise
    suffix = f"_{name}"
    matches = [found.address for found in await find_saga_tables(connection)
               if found.address.table.endswith(suffix)]
    if len(matches) == 1:
        return await stored_table(connection, matches[0])
    if matches:
        tables = ", ".join(sorted(printable(str(m)) for m in matches))
        raise ConfigurationError(f"saga {printable(name)!r} has a table in several endpoints "
                                 f"({tables}): name one")
    raise ConfigurationError(f"{printable(str(address))} is not a saga table, nor is any "
                             f"<endpoint>_{printable(name)} (see: endpoint-runtime sagas list)")
