"""``endpoint-runtime sagas list|show`` against a real PostgreSQL: saga tables found by their
columns, the live instances of one, one instance by correlation value or id; a completed
instance is gone; a table that is not a saga table is refused in one line."""

from __future__ import annotations

import msgspec

from endpoint_runtime.chain.outgoing import create_outgoing
from endpoint_runtime.database.installation import install
from tests.integration import test_cli
from tests.integration.test_cli import Cli, Database
from tests.support.draining import drain
from tests.support.saga_endpoints import Bump, OrderState, Paid, Placed, saga_endpoint

cli = test_cli.cli  # the fixtures of the command-line tests
db = test_cli.db


def run_saga(db: Database, *messages: msgspec.Struct) -> None:
    endpoint = saga_endpoint()

    async def go(transport: test_cli.PostgresTransport) -> None:
        await install(transport, endpoint, endpoint.settings)
        await transport.create_queue("shipments")
        await transport.create_queue("customers")
        for message in messages:
            await transport.send("fulfilment", create_outgoing(message, reply_to="customers"))
        await drain(transport, endpoint)

    db.run(go)


def test_list_and_show_the_live_instances(cli: Cli, db: Database) -> None:
    assert cli("sagas", "list").out == "no saga tables\n"
    run_saga(db, Placed("o-1"), Bump("o-1"), Placed("o-2"), Placed("o-3"), Paid("o-3"))

    tables = cli("sagas", "list")
    assert tables.code == 0, tables.err
    assert [line.split() for line in tables.out.splitlines()] == [
        ["saga", "table", "instances", "correlation"],
        ["public.fulfilment_OrderSaga", "2", "Correlation_order_id"],  # o-3 completed
        ["public.fulfilment_Tally", "0", "Correlation_key"],
    ]
    instances = cli("sagas", "list", "fulfilment_OrderSaga")
    assert instances.code == 0, instances.err
    rows = [line.split(maxsplit=3) for line in instances.out.splitlines()[1:]]
    assert [(r[1], r[2]) for r in rows] == [("o-1", "2"), ("o-2", "1")]

    shown = cli("sagas", "show", "fulfilment_OrderSaga", "--correlation", "o-1")
    assert shown.code == 0, shown.err
    fields = dict(line.split(":", 1) for line in shown.out.splitlines())
    assert msgspec.json.decode(fields["data"].strip(), type=OrderState) == OrderState(
        order_id="o-1", placed=True, bumps=1)
    assert '"Originator":"customers"' in fields["metadata"]
    by_id = cli("sagas", "show", "fulfilment_OrderSaga", "--id", fields["saga id"].strip())
    assert by_id.out == shown.out

    gone = cli("sagas", "show", "fulfilment_OrderSaga", "--correlation", "o-3")
    assert gone.code == 1
    assert "completed instances are deleted" in gone.out


def test_a_table_that_is_no_saga_table_is_refused(cli: Cli, db: Database) -> None:
    db.create("orders")
    refused = cli("sagas", "list", "orders")
    assert refused.code == 2
    assert refused.err.strip() == (
        "endpoint-runtime: error: public.orders is not a saga table, nor is any "
        "<endpoint>_orders (see: endpoint-runtime sagas list)")


def test_a_saga_is_named_by_its_name_alone_when_one_endpoint_has_it(
        cli: Cli, db: Database) -> None:
    """As docs/sagas.md shows it: ``sagas show OrderSaga`` finds fulfilment_OrderSaga; with
    a second endpoint's table of that saga, the name alone is refused naming both."""
    run_saga(db, Placed("o-1"))
    by_table = cli("sagas", "show", "fulfilment_OrderSaga", "--correlation", "o-1")
    by_name = cli("sagas", "show", "OrderSaga", "--correlation", "o-1")
    assert by_name.code == 0, by_name.err
    assert by_name.out == by_table.out
    assert cli("sagas", "list", "OrderSaga").out == cli(
        "sagas", "list", "fulfilment_OrderSaga").out

    db.execute('CREATE TABLE "returns_OrderSaga" (LIKE "fulfilment_OrderSaga" INCLUDING ALL)')
    ambiguous = cli("sagas", "show", "OrderSaga", "--correlation", "o-1")
    assert ambiguous.code == 2
    assert ambiguous.err.strip() == (
        "endpoint-runtime: error: saga 'OrderSaga' has a table in several endpoints "
        "(public.fulfilment_OrderSaga, public.returns_OrderSaga): name one")
    assert cli("sagas", "show", "returns_OrderSaga", "--correlation", "o-1").code == 1
