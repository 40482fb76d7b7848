"""Files the console serves: its script, and the Spark report's latest page and plots (from
the report's output directory, ``--report DIR``), behind the same token.

Only ``report.html`` and ``plots/<name>.png`` (a plain name: letters, digits, ``_``, ``-``)
are served, and only when the file, its links followed, is inside that directory: no path
from a request reaches any other file."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

SCRIPT = Path(__file__).parent / "static" / "console.js"
PLOT_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}\.png")


def file_routes(report: Path | None) -> list[Route]:
    async def script(request: Request) -> Response:
        return FileResponse(SCRIPT, media_type="text/javascript")

    async def report_page(request: Request) -> Response:
        if report is None:
            return PlainTextResponse(
                "no report here: start the console with --report DIR, the directory "
                "`endpoint-runtime report --out DIR` writes", 404)
        page = report / "report.html"
        if not _inside(page, report):
            return PlainTextResponse(f"no report in {report} yet", 404)
        return FileResponse(page, media_type="text/html")

    async def plot(request: Request) -> Response:
        name = request.path_params["name"]
        if report is None or not PLOT_NAME.fullmatch(name):
            return PlainTextResponse("no such plot", 404)
        path = report / "plots" / name
        if not _inside(path, report / "plots"):
            return PlainTextResponse("no such plot", 404)
        return FileResponse(path, media_type="image/png")

    async def to_report(request: Request) -> Response:
        return RedirectResponse("/report/", 303)

    return [Route("/console.js", script), Route("/report", to_report),
            Route("/report/", report_page), Route("/report/plots/{name}", plot)]


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is a file that is in ``folder`` once every link is followed."""
    return path.is_file() and path.resolve().is_relative_to(folder.resolve())
