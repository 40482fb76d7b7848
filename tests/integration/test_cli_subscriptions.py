"""``endpoint-runtime subscriptions list|add|remove`` against a real PostgreSQL."""

from __future__ import annotations

from tests.integration import test_cli
from tests.integration.test_cli import Cli, Database
from tests.support.cli import Outcome

cli = test_cli.cli  # the fixtures of the command-line tests
db = test_cli.db


def test_add_list_and_remove_a_subscription(cli: Cli, db: Database) -> None:
    db.create("billing", "analytics_in")
    assert cli("subscriptions", "list") == Outcome(0, "no subscriptions\n", "")

    assert cli("subscriptions", "add", "billing", "shop.OrderPlaced").code == 0
    added = cli("subscriptions", "add", "analytics", "shop.OrderPlaced", "--queue", "analytics_in")
    assert added == Outcome(
        0, "subscribed analytics (public.analytics_in) to shop.OrderPlaced\n", "")
    listing = cli("subscriptions", "list")
    assert listing.code == 0
    assert [line.split() for line in listing.out.splitlines()] == [
        ["topic", "endpoint", "queue"],
        ["shop.OrderPlaced", "analytics", "public.analytics_in"],
        ["shop.OrderPlaced", "billing", "public.billing"],
    ]

    assert cli("subscriptions", "remove", "billing", "shop.OrderPlaced") == Outcome(
        0, "unsubscribed billing from shop.OrderPlaced\n", "")
    assert cli("subscriptions", "remove", "billing", "shop.OrderPlaced").code == 1
    only = cli("subscriptions", "list", "--endpoint", "billing")
    assert only == Outcome(0, "no subscriptions\n", "")


def test_add_to_a_missing_queue_fails_with_one_line(cli: Cli, db: Database) -> None:
    failed = cli("subscriptions", "add", "nobody", "shop.OrderPlaced")
    assert failed.code == 2
    assert failed.err.count("\n") == 1
    assert "does not exist" in failed.err
