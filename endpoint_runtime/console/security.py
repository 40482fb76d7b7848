"""The console's gate: a token on every request, a CSRF token on every POST, read-only mode.

The token comes as ``?token=`` once (the console then sets an HttpOnly, SameSite=Strict cookie
and redirects to the same page without it, so it does not stay in the address bar), as the
cookie, or as ``Authorization: Bearer``. The CSRF token is an HMAC of the token: a form of
the console carries it, a page of another site cannot know it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.datastructures import URL
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

COOKIE = "endpoint_runtime_console"
CSRF_FIELD = "csrf"
HEADERS = {
    # Scripts only from the console itself (no inline script runs, even if escaping failed);
    # no framing; forms post only here; the token in a first URL goes to no other site.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; "
    "form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def new_token() -> str:
    return secrets.token_urlsafe(24)


def csrf_token(token: str) -> str:
    return hmac.new(token.encode(), b"console csrf", hashlib.sha256).hexdigest()


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


class TokenGate(BaseHTTPMiddleware):
    """Refuses (403) a request without the token and a POST without the CSRF token."""

    def __init__(self, app: object, token: str, read_only: bool) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self.token = token
        self.csrf = csrf_token(token)
        self.read_only = read_only

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await self._gate(request, call_next)
        response.headers.update(HEADERS)
        return response

    async def _gate(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        if _same(request.query_params.get("token"), self.token):
            url = URL(str(request.url)).remove_query_params("token")
            response: Response = RedirectResponse(str(url.path if not url.query
                                                       else f"{url.path}?{url.query}"), 303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            return response
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        if not (_same(request.cookies.get(COOKIE), self.token) or _same(bearer, self.token)):
            return PlainTextResponse(
                "403: this console needs its token (printed when it started): open the URL "
                "with ?token=...", 403)
        if request.method not in ("GET", "HEAD"):
            if self.read_only:
                return PlainTextResponse("403: the console is read-only", 403)
            form = await request.form()
            if not _same(_text(form.get(CSRF_FIELD)), self.csrf):
                return PlainTextResponse("403: missing or wrong CSRF token", 403)
        return await call_next(request)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
