"""The view's HTTP side (Starlette; the `ui` extra): routes, the token, security headers, metrics.

Beyond loopback every route but `/healthz` needs the token: `Authorization: Bearer TOKEN` (a
scraper, a script) or the session cookie that `POST /login` sets from it (a browser). The cookie
holds an HMAC of the token, not the token, and is HttpOnly and SameSite=Strict. A token never
goes in a URL, where logs, history and Referer headers would keep it. On loopback there is no
token, and only loopback Host names are answered (Starlette's `TrustedHostMiddleware`, on every
route): a web page cannot reach the view through a DNS name rebound to 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Final
from urllib.parse import parse_qs

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from detector.contracts.findings import Severity, Status
from detector.timeline.markup import CSP
from detector.view import pages
from detector.view.metrics import ViewMetrics
from detector.view.store import Filters, FindingsStore, listed

COOKIE: Final = "splitbrain_ui_session"
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]")  # as a Host header spells them
MAX_LOGIN_BODY: Final = 4096
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)
HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
Endpoint = Callable[[Request], Awaitable[Response]]


def _session(token: str) -> str:
    return hmac.new(token.encode(), b"splitbrain ui session", hashlib.sha256).hexdigest()


def _equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _local(next_path: str) -> str:
    """Only a path of this view: never `//elsewhere` or an absolute URL (an open redirect)."""
    ok = next_path.startswith("/") and not next_path.startswith(("//", "/\\"))
    return next_path if ok else "/"


class _Guard:
    """Beyond loopback: the token, as a bearer header or the session cookie."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.session = _session(token)

    def allows(self, request: Request) -> bool:
        bearer = request.headers.get("authorization", "")
        if bearer.startswith("Bearer ") and _equal(bearer.removeprefix("Bearer "), self.token):
            return True
        return _equal(request.cookies.get(COOKIE, ""), self.session)

    def refusal(self, request: Request, *, wrong: bool = False) -> Response:
        next_path = _local(str(request.query_params.get("next", request.url.path)))
        if request.url.path != "/login" and request.url.query:
            next_path += "?" + request.url.query
        return HTMLResponse(
            pages.login(next_path, refused=wrong),
            status_code=401,
            headers={**HEADERS, "WWW-Authenticate": 'Bearer realm="splitbrain ui"'},
        )

    def guarded(self, endpoint: Endpoint) -> Endpoint:
        async def checked(request: Request) -> Response:
            if not self.allows(request):
                return self.refusal(request)
            return await endpoint(request)

        return checked

    async def login(self, request: Request) -> Response:
        """`POST /login`: the token from the form, for the session cookie."""
        body = await request.body()
        form = parse_qs(body[:MAX_LOGIN_BODY].decode("utf-8", "replace"))
        if not _equal((form.get("token") or [""])[0], self.token):
            return self.refusal(request, wrong=True)
        response = RedirectResponse(
            _local(request.query_params.get("next", "/")), status_code=303, headers=HEADERS
        )
        response.set_cookie(COOKIE, self.session, httponly=True, samesite="strict")
        return response


class _Counted:
    """Counts each answer by its route's template (never the path: a finding id is unbounded)."""

    def __init__(self, app: ASGIApp, routes: list[Route], metrics: ViewMetrics) -> None:
        self.app, self.routes, self.metrics = app, routes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = next((r.path for r in self.routes if r.matches(scope)[0] == Match.FULL), "other")
        code = 500

        async def sending(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(route, str(code)).inc()


def _html(body: str, status: int = 200, extra: Mapping[str, str] | None = None) -> Response:
    return HTMLResponse(body, status_code=status, headers={**HEADERS, **(extra or {})})


def _filters(request: Request) -> Filters:
    """Unknown values show everything rather than fail: a hand-edited URL still lists."""
    q = request.query_params
    severity = q.get("severity", "")
    status = q.get("status", "")
    return Filters(
        severity=Severity(severity) if severity in Severity._value2member_map_ else None,
        status=Status(status) if status in Status._value2member_map_ else None,
        workflow=q.get("workflow") or None,
    )


def create_app(store: FindingsStore, metrics: ViewMetrics, *, token: str | None) -> Starlette:
    guard = None if token is None else _Guard(token)

    def guarded(endpoint: Endpoint) -> Endpoint:
        """On loopback the Host check (below) stands in for the token."""
        return endpoint if guard is None else guard.guarded(endpoint)

    async def index(request: Request) -> Response:
        filters = _filters(request)
        latest = store.latest()
        return _html(
            pages.index(
                listed(latest, filters),
                filters,
                total=len(latest),
                caught_up=store.caught_up,
                failure=store.failure,
            )
        )

    async def finding(request: Request) -> Response:
        finding_id = str(request.path_params["finding_id"])
        revisions = store.history(finding_id)
        if revisions:
            return _html(pages.finding(revisions))
        revisions = store.history(finding_id.removesuffix(".html"))
        if finding_id.endswith(".html") and revisions:
            name = "".join(c if c.isalnum() or c in "-_." else "_" for c in finding_id[:-5])
            disposition = f'attachment; filename="splitbrain-{name[:100]}.html"'
            return _html(
                pages.finding(revisions, export=True), extra={"Content-Disposition": disposition}
            )
        return _html(pages.not_found(finding_id), 404)

    async def metrics_route(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        if store.failure is not None:
            return PlainTextResponse(f"reading the findings topic stopped: {store.failure}", 503)
        if not store.caught_up:
            return PlainTextResponse("catching up with the findings topic", 503)
        return PlainTextResponse("ready")

    routes = [
        Route("/", guarded(index)),
        Route("/findings/{finding_id:path}", guarded(finding)),
        Route("/metrics", guarded(metrics_route)),
        Route("/healthz", healthz),
    ]
    if guard is None:
        app = Starlette(routes=routes)
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=LOOPBACK_HOSTS, www_redirect=False)
    else:
        routes.append(Route("/login", guard.login, methods=["POST"]))
        app = Starlette(routes=routes)
    app.add_middleware(_Counted, routes=routes, metrics=metrics)  # outermost: counts refusals too
    return app


class _Server(uvicorn.Server):
    """uvicorn's server, but SIGTERM and Ctrl-C end it like any command of ours: a graceful
    shutdown, then back to the caller (which closes the reader) and exit 0. uvicorn raises the
    signal again once shut down, which would end the process before that, with status 143."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(app: Starlette, sock: socket.socket, log_level: str) -> None:
    """Until SIGTERM or Ctrl-C, on a socket already bound."""
    config = uvicorn.Config(app, log_level=log_level.lower(), access_log=False, lifespan="off")
    _Server(config).run(sockets=[sock])
