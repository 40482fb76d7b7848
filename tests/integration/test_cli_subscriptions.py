"""``endpoint-runtime subscriptions list|add|remove|prune`` and the subscriptions that
``status`` lists as pointing nowhere, against a real PostgreSQL."""

from __future__ import annotations

from endpoint_runtime.database.privileges import subscription_policies
from endpoint_runtime.transport import QueueAddress
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


def subscribe_by_hand(db: Database, endpoint: str, queue: str) -> None:
    db.execute('INSERT INTO "SubscriptionRouting" (queueaddress, endpoint, topic) '
               "VALUES ($1, $2, 'shop.OrderPlaced')", queue, endpoint)


def test_prune_removes_only_the_subscriptions_whose_queue_does_not_exist(
    cli: Cli, db: Database,
) -> None:
    db.create("billing")
    assert cli("subscriptions", "add", "billing", "shop.OrderPlaced").code == 0
    subscribe_by_hand(db, "gone", "gone")  # its queue was dropped, or never made
    subscribe_by_hand(db, "typo", 'bad"."address"."')  # an address that does not parse
    first = cli("subscriptions", "prune")
    assert first.code == 0
    assert sorted(first.out.splitlines()) == [
        "removed gone -> gone (shop.OrderPlaced): its queue does not exist",
        'removed typo -> bad"."address"." (shop.OrderPlaced): its address does not parse']

    db.execute("CREATE SCHEMA locked")  # exists: kept, whoever may use it
    db.create("locked.tracker")
    subscribe_by_hand(db, "tracker", "locked.tracker")
    subscribe_by_hand(db, "gone", "gone")
    dry = cli("subscriptions", "prune", "--dry-run")
    assert dry.code == 0
    assert dry.out.splitlines() == [
        "would remove gone -> gone (shop.OrderPlaced): its queue does not exist"]
    assert "gone" in cli("subscriptions", "list").out

    pruned = cli("subscriptions", "prune")
    assert pruned == Outcome(
        0, "removed gone -> gone (shop.OrderPlaced): its queue does not exist\n", "")
    assert [line.split()[1] for line in cli("subscriptions", "list").out.splitlines()[1:]] == [
        "billing", "tracker"]
    assert cli("subscriptions", "prune") == Outcome(0, "no subscriptions point nowhere\n", "")


def test_status_lists_the_subscriptions_that_point_nowhere(cli: Cli, db: Database) -> None:
    db.create("sales", "error")
    assert cli("subscriptions", "add", "sales", "shop.OrderPlaced").code == 0
    assert "point nowhere" not in cli("status").out

    subscribe_by_hand(db, "gone", "gone")
    shown = cli("status")
    assert shown.code == 0
    assert shown.out.splitlines()[-2:] == [
        "subscriptions that point nowhere (1; endpoint-runtime subscriptions prune removes "
        "them):", "  gone -> gone (shop.OrderPlaced)"]


def test_policy_prints_the_row_level_security_of_any_endpoint_name(cli: Cli, db: Database) -> None:
    shown = cli("subscriptions", "policy", "Shipping.Tracker", "--role", "shipping_app")
    assert shown.code == 0
    [statement] = subscription_policies(
        QueueAddress("SubscriptionRouting"), "shipping_app", "Shipping.Tracker")
    assert shown.out == statement + "\n"
