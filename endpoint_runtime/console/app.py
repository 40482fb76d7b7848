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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from endpoint_runtime.chain.recoverability.policy import ErrorHeaders
from endpoint_runtime.connections.connecting import PostgresTransport
from endpoint_runtime.console.diagram import diagram, short_type
from endpoint_runtime.console.files import file_routes
from endpoint_runtime.console.jobs import Job, Jobs
from endpoint_runtime.console.security import CSRF_FIELD, TokenGate, csrf_token
from endpoint_runtime.console.storage import GROUPINGS, ConsoleData
from endpoint_runtime.errors import EndpointRuntimeError, QueueNotFoundError
from endpoint_runtime.pages import environment
from endpoint_runtime.settings import TransportSettings
from endpoint_runtime.wire.messages import Headers, RetryHeaders

TEMPLATES = environment(Path(__file__).parent / "templates")  # shared with the report's page
TEMPLATES.filters["short_type"] = short_type
TEMPLATES.filters["fromjson"] = lambda value: (value if isinstance(value, dict)
                                               else json.loads(value))


def create_app(settings: TransportSettings, token: str, *, error_queue: str = "error",
               read_only: bool = False, report: Path | None = None) -> Starlette:
    """The console over the database of ``settings``; ``token`` opens it; ``report`` is the
    Spark report's output directory, if it is to be served."""

    jobs = Jobs()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with PostgresTransport.connect(settings) as transport:
            app.state.data = ConsoleData(transport, error_queue)
            await app.state.data.setup()
            try:
                yield
            finally:
                await jobs.stop()

    def page(request: Request, template: str, status_code: int = 200,
             **values: Any) -> HTMLResponse:
        html = TEMPLATES.get_template(template).render(
            csrf=csrf_token(token), csrf_field=CSRF_FIELD, read_only=read_only, **values)
        return HTMLResponse(html, status_code)

    def data(request: Request) -> ConsoleData:
        console: ConsoleData = request.app.state.data
        return console

    async def failed(request: Request) -> Response:
        by = _grouping(request)
        return page(request, "failed.html", groups=await data(request).groups(by), by=by,
                    groupings=list(GROUPINGS))

    async def group(request: Request) -> Response:
        key = request.path_params["key"]
        rows = await data(request).group_messages(key, _grouping(request))
        return page(request, "group.html", key=key, messages=rows)

    async def message(request: Request) -> Response:
        native_id = _uuid(request.path_params["native_id"])
        row = None if native_id is None else await data(request).message(native_id)
        if row is None:
            return page(request, "missing.html", what=request.path_params["native_id"],
                        status_code=404)
        return page(request, "message.html", **_message_view(row))

    async def act(request: Request) -> Response:
        console, action = data(request), request.path_params["action"]
        move = {"retry": console.retry_one, "archive": console.archive_one,
                "restore": console.restore_one}.get(action)
        if move is None:
            return HTMLResponse("unknown action", 404)
        client = request.client
        where = f"{client.host}:{client.port}" if client else "-"

        async def log(job: Job, ids: list[uuid.UUID]) -> None:
            await console.log_action(action, ids, job.outcome, where)

        if "key" in request.path_params:
            ids = await console.group_ids(request.path_params["key"], _grouping(request))
            job = jobs.start(action, ids, move, lambda job: log(job, ids))
            return RedirectResponse(f"/jobs/{job.id}", 303)
        native_id = _uuid(request.path_params["native_id"])
        if native_id is None:
            return HTMLResponse("not a native id", 404)
        job = Job(id="-", action=action, total=1, done=1, finished=True)
        why = await move(native_id)
        job.stayed.extend([why] if why else [])
        await log(job, [native_id])
        return RedirectResponse("/actions", 303)

    async def job_page(request: Request) -> Response:
        job = jobs.get(request.path_params["job_id"])
        if job is None:
            return page(request, "missing.html", what=request.path_params["job_id"],
                        status_code=404)
        return page(request, "job.html", job=job)

    async def archive(request: Request) -> Response:
        return page(request, "archive.html", messages=await data(request).archived())

    async def actions(request: Request) -> Response:
        return page(request, "actions.html", actions=await data(request).action_log())

    async def endpoints(request: Request) -> Response:
        console = data(request)
        return page(request, "endpoints.html", endpoints=await console.endpoints(),
                    deployments=await console.deployments(),
                    subscriptions=await console.subscriptions(), sagas=await console.sagas())

    async def messages(request: Request) -> Response:
        params = request.query_params
        query = params.get("q", "").strip()
        window = {name: params.get(name, "").strip() for name in ("since", "until")}
        try:
            since, until = (_utc_time(window["since"]), _utc_time(window["until"]))
        except ValueError:
            return page(request, "messages.html", query=query, window=window, messages=[],
                        searched=False, problem="times are YYYY-MM-DDTHH:MM (UTC)",
                        status_code=400)
        searched = bool(query or since or until)
        rows = await data(request).search(query, since, until) if searched else []
        return page(request, "messages.html", query=query, window=window, messages=rows,
                    searched=searched, problem=None)

    async def conversation(request: Request) -> Response:
        conversation_id = request.path_params["conversation_id"]
        rows = await data(request).conversation(conversation_id)
        return page(request, "conversation.html", conversation_id=conversation_id,
                    diagram=diagram(rows))

    async def home(request: Request) -> Response:
        return RedirectResponse("/failed", 303)

    async def problem(request: Request, exc: Exception) -> Response:
        return page(request, "problem.html", problem=str(exc),
                    status_code=404 if isinstance(exc, QueueNotFoundError) else 500)

    routes = [
        Route("/", home),
        Route("/failed", failed),
        Route("/failed/group/{key}", group),
        Route("/failed/group/{key}/{action}", act, methods=["POST"]),
        Route("/message/{native_id}", message),
        Route("/message/{native_id}/{action}", act, methods=["POST"]),
        Route("/jobs/{job_id}", job_page),
        Route("/archive", archive),
        Route("/actions", actions),
        Route("/endpoints", endpoints),
        Route("/messages", messages),
        Route("/conversation/{conversation_id}", conversation),
        *file_routes(report),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={EndpointRuntimeError: problem},
                     middleware=[Middleware(TokenGate, token=token, read_only=read_only)])


def _utc_time(text: str) -> datetime | None:
    """A time of the search form (``datetime-local``: no zone; read as UTC)."""
    if not text:
        return None
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _grouping(request: Request) -> str:
    """``?by=``: one of :data:`GROUPINGS` (anything else: by exception)."""
    by = request.query_params.get("by", "exception")
    return by if by in GROUPINGS else "exception"


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
