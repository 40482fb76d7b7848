"""A step of one's own: the tenant of an order travels with every message it causes.

The client stamps ``Examples.Tenant`` on each order it sends (``Sender.on_outgoing``). The
``tenant`` step, added to the endpoints that send, reads the header of the incoming message and
gives every message their handlers send, publish or reply the same header, through the chain's
outgoing hook. The handlers themselves never mention tenants. (See docs/pipeline.md.)
"""

from __future__ import annotations

from collections.abc import MutableMapping

from endpoint_runtime import Endpoint, IncomingContext, Next

TENANT_HEADER = "Examples.Tenant"


async def copy_tenant(context: IncomingContext, next: Next) -> None:
    """Copy the incoming message's tenant to every outgoing one (a handler's own
    ``headers=`` entry wins)."""
    tenant = context.headers.get(TENANT_HEADER)
    if tenant is not None:

        def stamp(headers: MutableMapping[str, str]) -> None:
            headers.setdefault(TENANT_HEADER, tenant)

        context.on_outgoing(stamp)
    await next(context)


def carry_tenant(endpoint: Endpoint) -> None:
    """Add the step to ``endpoint``, just before its handlers."""
    endpoint.add_step("tenant", copy_tenant, before="invoke_handlers")
