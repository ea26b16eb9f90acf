"""Runs in the agent: the dashboard's pages, its static files, and logging in and out.

The pages are static HTML whose scripts fetch their data from `/ui/api` (see
`gpuhop.agent.ui.api`); nothing a user wrote is ever put into HTML here. `gpuhop.agent.ui.gate` has
already checked the session of every route but `/ui/login` and `/ui/static/...`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response

from gpuhop.agent.callers import caller_of
from gpuhop.agent.errors import not_found
from gpuhop.agent.ui.gate import COOKIE, COOKIE_SCOPE_KEY, PREFIX, denied_page
from gpuhop.agent.ui.sessions import UiSessions

STATIC_DIR = Path(__file__).parent / "static"
# Only the files that ship in the package, by name: no path from a request reaches the disk.
STATIC_FILES = {p.name: p for p in STATIC_DIR.iterdir() if p.suffix in (".css", ".js")}
MEDIA_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
CODE_REFUSED = (
    "This login link has been used already or has expired (each works once, for a minute)."
    " Run gpuhop ui again for a new one."
)

router = APIRouter(prefix=PREFIX, include_in_schema=False)


def sessions(request: Request) -> UiSessions:
    found: UiSessions = request.app.state.ui_sessions
    return found


def _page(name: str) -> FileResponse:
    return FileResponse(STATIC_DIR / name, media_type="text/html; charset=utf-8")


@router.get("/login")
def login(request: Request, code: str = Query(default="", max_length=200)) -> Response:
    """Trade a one-time code for a session cookie, then go to the jobs page."""
    cookie = sessions(request).redeem(code, caller_of(request)) if code else None
    if cookie is None:
        return Response(denied_page(CODE_REFUSED), 401, media_type="text/html; charset=utf-8")
    # Relative: the browser resolves it against the proxy it came through.
    response = RedirectResponse(f"{PREFIX}/", status_code=303)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(sessions(request).session_ttl),
        path=PREFIX,
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/api/logout")
def logout(request: Request) -> JSONResponse:
    sessions(request).end(request.scope[COOKIE_SCOPE_KEY])
    response = JSONResponse({"ok": True})
    response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
    return response


@router.get("")
def root() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/", status_code=308)


@router.get("/")
def jobs_page() -> FileResponse:
    return _page("jobs.html")


@router.get("/jobs/{ref}")
def job_page(ref: str) -> FileResponse:
    return _page("job.html")


@router.get("/sweeps/{ref}")
def sweep_page(ref: str) -> FileResponse:
    return _page("sweep.html")


@router.get("/gpus")
def gpus_page() -> FileResponse:
    return _page("gpus.html")


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    path = STATIC_FILES.get(name)
    if path is None:
        raise not_found(f"no dashboard file {name!r}")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix])
