"""Endpoints for the outbox tests (importable by path, as receivers need)."""

from __future__ import annotations

from datetime import timedelta

import msgspec

from endpoint_runtime import Endpoint, HandlerContext, Outbox


class PayInvoice(msgspec.Struct):
    invoice: str


class InvoicePaid(msgspec.Struct):
    invoice: str


class PaymentReminder(msgspec.Struct):
    invoice: str


HELD_INVOICE_LOCK = 4343


def make(name: str, *, pessimistic: bool = False, synchronous_acks: bool = False) -> Endpoint:
    endpoint = Endpoint(name, transaction=Outbox(pessimistic=pessimistic,
                                                 synchronous_acks=synchronous_acks),
                        immediate_retries=0, delayed_retries=0)

    @endpoint.handler
    async def pay(message: PayInvoice, context: HandlerContext) -> None:
        # Every run of the body is counted outside the business transaction.
        await context.send(InvoicePaid(message.invoice), destination="handler_runs",
                           immediate=True)
        if message.invoice == "held":  # waits while a test holds the lock
            await context.connection.execute("SELECT pg_advisory_xact_lock($1)",
                                             HELD_INVOICE_LOCK)
        # A handler's own savepoint works in outbox mode as in any other.
        async with context.connection.transaction():
            await context.connection.execute(
                "INSERT INTO paid_invoices (invoice) VALUES ($1)", message.invoice)
        await context.send(InvoicePaid(message.invoice), destination="ledger")
        await context.send(PaymentReminder(message.invoice), destination="ledger",
                           delay=timedelta(seconds=0.5))
        if context.headers.get("NServiceBus.ReplyToAddress"):
            await context.reply(InvoicePaid(message.invoice))

    return endpoint


optimistic = make("payments")
pessimistic = make("payments_p", pessimistic=True)

# One business row and one outgoing message: the dispatch goes with the business commit.
receipts = Endpoint("receipts", transaction=Outbox(acks_per_commit=3),
                    immediate_retries=0, delayed_retries=0)


@receipts.handler
async def receipt(message: PayInvoice, context: HandlerContext) -> None:
    await context.send(InvoicePaid(message.invoice), destination="handler_runs",
                       immediate=True)
    await context.connection.execute(
        "INSERT INTO paid_invoices (invoice) VALUES ($1)", message.invoice)
    if message.invoice == "refused":
        raise ValueError("this invoice cannot be paid")
    if message.invoice == "held":  # waits while a test holds the lock
        await context.connection.execute("SELECT pg_advisory_xact_lock($1)", HELD_INVOICE_LOCK)
    if message.invoice == "astray":  # to a queue that does not exist
        await context.send(InvoicePaid(message.invoice), destination="no_such_ledger")
    elif message.invoice != "quiet":  # "quiet": business work only, nothing to send
        await context.send(InvoicePaid(message.invoice), destination="ledger")


# No receiver while idle (retired half a second after the queue empties), one message at a
# time: what a retired receiver counted must stay in the deployment's status.
receipts_on_demand = Endpoint(
    "receipts_on_demand", transaction=Outbox(), immediate_retries=0,
    delayed_retries=0, min_receivers=0, scale_down_after=0.5, max_concurrency=1)
receipts_on_demand.register(receipt)
