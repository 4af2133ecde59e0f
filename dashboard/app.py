"""The dashboard's web application (Starlette on trio, served by Hypercorn's trio worker).

Safety rules every handler follows:
- every value from the cluster or the request reaches HTML through Jinja2 autoescaping only,
  and the Content-Security-Policy allows no inline script;
- bad input raises `service.BadInput` and a cluster error is caught: both are shown as a
  message on the page (status 400 / 502), never a traceback;
- POSTs carry a per-browser CSRF token (double-submit cookie, SameSite=Strict);
- with a user configured, every page but /login and /static needs a session cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote

import jinja2
import structlog
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from client.admin import Admin
from client.errors import MQClientError, NoRouteError
from dashboard import service
from dashboard.history import History
from remoting.errors import RemoteError, RemotingError

log = structlog.get_logger()

SESSION_COOKIE = "mqdash_session"
CSRF_COOKIE = "mqdash_csrf"
MAX_FORM_BYTES = 256 * 1024
MAX_SESSIONS = 1024
# Debian's libjs-chart.js (Chart.js 3.x, UMD build) first; --chartjs overrides.
CHARTJS_CANDIDATES = (
    "/usr/share/javascript/chart.js/chart.min.js",
    "/usr/share/javascript/chart.js/Chart.min.js",
    "/usr/share/javascript/chartjs/Chart.min.js",
    "/usr/share/nodejs/chart.js/dist/chart.umd.js",
    "/usr/share/nodejs/chart.js/dist/chart.min.js",
)
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)

_PKG = resources.files("dashboard")


def find_chartjs(explicit: str | None = None) -> Path | None:
    for cand in (explicit,) if explicit else CHARTJS_CANDIDATES:
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


@dataclass
class Login:
    """A configured user and password; sessions live in memory (a restart logs everyone out)."""

    user: str
    password: str
    session_ttl_s: float = 12 * 3600
    sessions: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def check(self, user: str, password: str) -> bool:
        # Digests first so the compare takes the same time whatever the lengths.
        ok_user = hmac.compare_digest(_digest(user), _digest(self.user))
        ok_pw = hmac.compare_digest(_digest(password), _digest(self.password))
        return ok_user & ok_pw

    def open_session(self) -> str:
        token = secrets.token_urlsafe(32)
        self.sessions[token] = time.monotonic() + self.session_ttl_s
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        return token

    def valid(self, token: str | None) -> bool:
        if not token:
            return False
        expiry = self.sessions.get(token)
        if expiry is None:
            return False
        if expiry < time.monotonic():
            del self.sessions[token]
            return False
        return True

    def close_session(self, token: str | None) -> None:
        if token:
            self.sessions.pop(token, None)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


@dataclass
class Dashboard:
    """What the handlers share: the admin client, the history, the options."""

    admin: Admin
    history: History
    login: Login | None = None
    chartjs: Path | None = None
    cookie_secure: bool = False
    sample_interval_s: float = 5.0


class Form:
    """An urlencoded POST body, its CSRF token checked."""

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields

    def get(self, name: str, default: str = "") -> str:
        return self.fields.get(name, default)


async def read_form(request: Request) -> Form:
    body = b""
    too_big = service.BadInput(f"the form is larger than {MAX_FORM_BYTES} bytes")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_FORM_BYTES:
        raise too_big
    async with aclosing(request.stream()) as chunks:
        async for chunk in chunks:
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise too_big
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/x-www-form-urlencoded":
        raise service.BadInput("send the form as application/x-www-form-urlencoded")
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise service.BadInput("the form is not UTF-8") from None
    fields = dict(pairs)
    token = request.cookies.get(CSRF_COOKIE, "")
    given = fields.get("csrf", "")
    if not token or not hmac.compare_digest(token.encode(), given.encode()):
        raise service.BadInput("the form expired (no or wrong CSRF token): reload the page")
    return Form(fields)


Handler = Callable[[Request, Dashboard], Awaitable[Response]]


def create_app(dash: Dashboard) -> Starlette:
    # Autoescape always on; ChainableUndefined lets an error page render a template whose
    # data never came (it shows the error and nothing else).
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(_PKG / "templates")),
        autoescape=True,
        undefined=jinja2.ChainableUndefined,
    )
    templates = Jinja2Templates(env=env)
    env.filters["time"] = service.fmt_time
    env.filters["q"] = lambda v: quote(str(v), safe="")
    env.globals["is_system_group"] = service.is_system_group
    env.globals["is_system_topic"] = service.is_system_topic

    def render(
        request: Request, name: str, ctx: dict[str, Any], status_code: int = 200
    ) -> Response:
        csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        full = {
            "csrf": csrf,
            "login_on": dash.login is not None,
            "path": request.url.path,
            "error": None,
            "notice": None,
            **ctx,
        }
        resp = templates.TemplateResponse(request, name, full, status_code=status_code)
        if request.cookies.get(CSRF_COOKIE) != csrf:
            resp.set_cookie(
                CSRF_COOKIE, csrf, httponly=True, samesite="strict", secure=dash.cookie_secure
            )
        return resp

    def page(name: str, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a handler: login check, then its errors as a message on `name`'s page."""

        async def endpoint(request: Request) -> Response:
            if dash.login is not None and not dash.login.valid(request.cookies.get(SESSION_COOKIE)):
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": "login required"}, status_code=401)
                return RedirectResponse("/login", status_code=303)
            try:
                return await handler(request, dash)
            except PageError as exc:
                return render(request, exc.template or name, exc.ctx, exc.status)
            except service.BadInput as exc:
                return render(request, name, {"error": str(exc)}, 400)
            except NoRouteError as exc:
                return render(request, name, {"error": f"no such topic: {exc}"}, 404)
            except (MQClientError, RemoteError, RemotingError, trio.TooSlowError) as exc:
                return render(request, name, {"error": _cluster_error(exc)}, 502)
            except Exception:
                log.exception("dashboard_handler_failed", path=request.url.path)
                return render(
                    request, name, {"error": "internal error (see the dashboard's log)"}, 500
                )

        return endpoint

    async def login_page(request: Request) -> Response:
        if dash.login is None:
            return RedirectResponse("/cluster", status_code=303)
        if request.method == "GET":
            return render(request, "login.html", {})
        try:
            form = await read_form(request)
        except service.BadInput as exc:
            return render(request, "login.html", {"error": str(exc)}, 400)
        if not dash.login.check(form.get("user"), form.get("password")):
            log.warning("dashboard_login_failed", client=request.client and request.client.host)
            await trio.sleep(0.5)  # slows guessing down
            return render(request, "login.html", {"error": "wrong user or password"}, 401)
        resp = RedirectResponse("/cluster", status_code=303)
        resp.set_cookie(
            SESSION_COOKIE,
            dash.login.open_session(),
            httponly=True,
            samesite="strict",
            secure=dash.cookie_secure,
        )
        return resp

    async def logout(request: Request) -> Response:
        if dash.login is not None:
            try:
                await read_form(request)
            except service.BadInput as exc:
                return PlainTextResponse(str(exc), status_code=400)
            dash.login.close_session(request.cookies.get(SESSION_COOKIE))
        resp = RedirectResponse("/login" if dash.login else "/cluster", status_code=303)
        resp.delete_cookie(SESSION_COOKIE)
        return resp

    async def chartjs(request: Request) -> Response:
        if dash.chartjs is None:
            return PlainTextResponse(
                "Chart.js not found: install Debian's libjs-chart.js or give --chartjs",
                status_code=404,
            )
        return FileResponse(dash.chartjs, media_type="text/javascript")

    async def no_icon(request: Request) -> Response:
        return Response(status_code=204)

    async def root(request: Request) -> Response:
        return RedirectResponse("/cluster", status_code=303)

    from dashboard import views  # the handlers; imported here, they need `render`'s helpers

    routes = [
        Route("/", root),
        Route("/favicon.ico", no_icon),
        Route("/login", login_page, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/static/chart.min.js", chartjs),
        Mount("/static", StaticFiles(directory=str(_PKG / "static")), name="static"),
    ]
    for path, template, handler, methods in views.ROUTES:
        routes.append(Route(path, page(template, handler), methods=methods))
    app = Starlette(routes=routes)
    app.add_middleware(_SecurityHeaders)
    app.state.dash = dash
    app.state.render = render
    return app


class PageError(Exception):
    """Render another template (or the same with other context) with a status."""

    def __init__(self, ctx: dict[str, Any], status: int = 400, template: str | None = None):
        super().__init__(ctx.get("error"))
        self.ctx = ctx
        self.status = status
        self.template = template


def _cluster_error(exc: BaseException) -> str:
    if isinstance(exc, trio.TooSlowError):
        return "the cluster did not answer in time"
    if isinstance(exc, RemoteError):
        return f"the broker refused: code {exc.code}: {exc.remark or '(no remark)'}"
    if isinstance(exc, RemotingError):
        return f"cannot reach the cluster: {type(exc).__name__}: {exc}"
    return f"cluster error: {exc}"


class _SecurityHeaders:
    """CSP, no framing, no sniffing, no caching of pages (they hold cluster data)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        is_static = scope.get("path", "").startswith("/static/")

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"no-referrer"),
                ]
                if not is_static:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
