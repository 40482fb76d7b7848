"""The console's pages and actions (Starlette, server-rendered Jinja2 templates).

Every state-changing action is a POST (confirmed in the page, CSRF-checked by
:class:`~endpoint_runtime.console.security.TokenGate`) and is written to the operator log with
what it did, to which messages, when and from where.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.console.diagram import diagram, short_type
from endpoint_runtime.console.security import CSRF_FIELD, TokenGate, csrf_token
from endpoint_runtime.console.storage import ConsoleData
from endpoint_runtime.errors import EndpointRuntimeError, QueueNotFoundError
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.wire.messages import Headers, RetryHeaders

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
TEMPLATES.filters["short_type"] = short_type


def create_app(settings: TransportSettings, token: str, *, error_queue: str = "error",
               read_only: bool = False) -> Starlette:
    """The console over the database of ``settings``; ``token`` opens it."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with PostgresTransport.connect(settings) as transport:
            app.state.data = ConsoleData(transport, error_queue)
            await app.state.data.setup()
            yield

    def page(request: Request, template: str, **values: Any) -> HTMLResponse:
        html = TEMPLATES.get_template(template).render(
            csrf=csrf_token(token), csrf_field=CSRF_FIELD, read_only=read_only, **values)
        return HTMLResponse(html)

    def data(request: Request) -> ConsoleData:
        console: ConsoleData = request.app.state.data
        return console

    async def failed(request: Request) -> Response:
        return page(request, "failed.html", groups=await data(request).groups())

    async def group(request: Request) -> Response:
        key = request.path_params["key"]
        rows = await data(request).group_messages(key)
        return page(request, "group.html", key=key, messages=rows)

    async def message(request: Request) -> Response:
        native_id = _uuid(request.path_params["native_id"])
        row = None if native_id is None else await data(request).message(native_id)
        if row is None:
            return page(request, "missing.html", what=request.path_params["native_id"])
        return page(request, "message.html", **_message_view(row))

    async def act(request: Request) -> Response:
        console, action = data(request), request.path_params["action"]
        if "key" in request.path_params:
            ids = await console.group_ids(request.path_params["key"])
        else:
            parsed = _uuid(request.path_params["native_id"])
            ids = [] if parsed is None else [parsed]
        if action == "retry":
            moved, problems = await console.retry(ids)
            outcome = f"{moved} retried" + (f"; {len(problems)} stayed: {problems[0]}"
                                            if problems else "")
        elif action == "archive":
            outcome = f"{await console.archive_messages(ids)} archived"
        elif action == "restore":
            outcome = f"{await console.restore(ids)} restored"
        else:
            return HTMLResponse("unknown action", 404)
        client = request.client
        await console.log_action(action, ids, outcome,
                                 f"{client.host}:{client.port}" if client else "-")
        return RedirectResponse(f"/actions?done={action}", 303)

    async def archive(request: Request) -> Response:
        return page(request, "archive.html", messages=await data(request).archived())

    async def actions(request: Request) -> Response:
        return page(request, "actions.html", actions=await data(request).action_log())

    async def endpoints(request: Request) -> Response:
        return page(request, "endpoints.html", endpoints=await data(request).endpoints())

    async def messages(request: Request) -> Response:
        query = request.query_params.get("q", "").strip()
        rows = await data(request).search(query) if query else []
        return page(request, "messages.html", query=query, messages=rows)

    async def conversation(request: Request) -> Response:
        conversation_id = request.path_params["conversation_id"]
        rows = await data(request).conversation(conversation_id)
        return page(request, "conversation.html", conversation_id=conversation_id,
                    diagram=diagram(rows))

    async def home(request: Request) -> Response:
        return RedirectResponse("/failed", 303)

    async def problem(request: Request, exc: Exception) -> Response:
        response = page(request, "problem.html", problem=str(exc))
        response.status_code = 404 if isinstance(exc, QueueNotFoundError) else 500
        return response

    routes = [
        Route("/", home),
        Route("/failed", failed),
        Route("/failed/group/{key}", group),
        Route("/failed/group/{key}/{action}", act, methods=["POST"]),
        Route("/message/{native_id}", message),
        Route("/message/{native_id}/{action}", act, methods=["POST"]),
        Route("/archive", archive),
        Route("/actions", actions),
        Route("/endpoints", endpoints),
        Route("/messages", messages),
        Route("/conversation/{conversation_id}", conversation),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={EndpointRuntimeError: problem},
                     middleware=[Middleware(TokenGate, token=token, read_only=read_only)])


def _uuid(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _message_view(row: Any) -> dict[str, Any]:
    """Headers, body (pretty JSON when it is JSON) and the failure of a failed message."""
    body = bytes(row["body"] or b"")
    try:
        text = body.decode("utf-8")
        with contextlib.suppress(ValueError):
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except UnicodeDecodeError:
        text = f"({len(body)} bytes, not UTF-8) {body[:4096].hex(' ')}"
    try:
        headers = json.loads(row["headers"])
        headers = headers if isinstance(headers, dict) else {}
        raw = None
    except ValueError:
        headers, raw = {}, row["headers"]
    return {
        "native_id": str(row["id"]), "headers": sorted(headers.items()), "raw_headers": raw,
        "body": text, "archived": row.get("archived_at") is not None,
        "message_type": headers.get(Headers.ENCLOSED_MESSAGE_TYPES, ""),
        "exception_type": headers.get(ErrorHeaders.EXCEPTION_TYPE, ""),
        "exception_message": headers.get(ErrorHeaders.MESSAGE, ""),
        "stack_trace": headers.get(ErrorHeaders.STACK_TRACE, ""),
        "failed_queue": headers.get(ErrorHeaders.FAILED_QUEUE, ""),
        "delayed_retries": headers.get(RetryHeaders.RETRIES, "0"),
        "conversation_id": headers.get(Headers.CONVERSATION_ID, ""),
    }
