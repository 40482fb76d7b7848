"""Main job (placeholder until the Ray runtime lands): create the example queues on the
embedded database, send one message, receive it, and print what happened."""

from __future__ import annotations

import asyncio

import msgspec

from endpoint_runtime.outgoing import create_outgoing
from endpoint_runtime.transport import PostgresTransport


class PlaceOrder(msgspec.Struct):
    order_id: str
    amount: float


async def main() -> None:
    async with PostgresTransport.connect() as transport:
        for queue in ("sales", "billing", "shipping", "error"):
            await transport.create_queue(queue)
        sent = create_outgoing(PlaceOrder("order-1", 42.0), originating_endpoint="examples")
        await transport.send("sales", sent)
        print(f"sent {sent.message_id} to sales (depth now {await transport.depth('sales')})")
        received = await transport.receive("sales")
        print(f"received {received}")


if __name__ == "__main__":
    asyncio.run(main())
