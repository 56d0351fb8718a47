"""The web console's routes: server-rendered pages (jinja2, autoescaped), their forms, the
charts' JSON, the OpenAPI document and the interactive API page (docs/console.md).

None of these is under /v1, so the API's bearer tokens do not reach them: pages need a session
(`session.py`), opened by logging in with a token that `Authenticator.authenticate` knows,
the API's own principals. Each page shows what its principal may see by the API's rules
(`Principal.may`); the admin forms (drain, undrain) exist for admins alone, carry a CSRF
token, and call the API's own drain and undrain. Every answer forbids framing and allows
scripts, styles and requests from this origin only (Content-Security-Policy): nothing is
loaded from another site, Swagger UI included (its files come from the swagger-ui-py
package).
"""

from __future__ import annotations

import datetime
import functools
import importlib.resources
import logging
import mimetypes
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import jinja2
import orjson
import yaml
from aiohttp import web

from ...client.errors import LaminarError, OutOfRange
from ...contract import MAX_INDEX, METADATA_WAIT_S, TOPIC_NAME, WORKER_NODE_ID
from ...credentials import INTERNAL_PRINCIPAL, Action, Principal
from ...models import ReadResult
from ..http import INTERNAL_MESSAGE, ApiError
from .data import INTERNAL_GROUPS_PATH, MAX_BROWSE_RECORDS, Gatherer
from .session import COOKIE_NAME, LoginLimiter, Session, Sessions, find_principal, session_key

if TYPE_CHECKING:
    from ..api import Api

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
OPENAPI_FILE = HERE.parent / "openapi.yaml"
#: The Swagger UI files the API page uses, from the swagger-ui-py package.
SWAGGER_FILES = ("swagger-ui.css", "swagger-ui-bundle.js")
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
NAV = (
    ("/console/cluster", "Cluster"),
    ("/console/topics", "Topics"),
    ("/console/records", "Records"),
    ("/console/charts", "Charts"),
    ("/console/api-docs", "API"),
)
LOGIN_PATH = "/console/login"
HOME_PATH = "/console/cluster"
#: A login token longer than this is refused unread (tokens are 47 characters).
MAX_TOKEN_CHARS = 1024
DEFAULT_BROWSE_RECORDS = 20
#: How much of a key, value or header the record browser shows.
SHOWN_BYTES = 2048
#: The charts page polls every CHART_POLL_S and keeps CHART_POINTS points.
CHART_POLL_S = 2
CHART_POINTS = 90
#: What `_browse` accepts as a number (ASCII digits only), and its length.
MAX_NUMBER_CHARS = 19

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Page = Callable[[web.Request, "Viewer"], Awaitable[web.Response]]


#: Every route of the console: aiohttp serves them (laminar.server.app), not the API's fast
#: path (server/h1.py), which knows neither cookies, forms nor files.
PATHS = (
    "/",
    LOGIN_PATH,
    "/console/logout",
    HOME_PATH,
    "/console/nodes/{node}/drain",
    "/console/nodes/{node}/undrain",
    "/console/topics",
    "/console/topics/{topic}",
    "/console/topics/{topic}/groups",
    "/console/records",
    "/console/charts",
    "/console/api-docs",
    "/console/api/rates",
    "/console/static/{name}",
    "/console/swagger-ui/{name}",
    INTERNAL_GROUPS_PATH,
    "/openapi.yaml",
    "/openapi.json",
)


def is_console_route(path: str) -> bool:
    """Is `path` (a route as aiohttp spells it) one of the console's, not the API's?"""
    return path in PATHS


def _cross_site(request: web.Request) -> str | None:
    """Why a browser's POST came from another site's page (None: it did not, or it is not a
    browser's: a client that sends neither header is not acting for a victim's browser).
    Sec-Fetch-Site, which browsers set themselves, decides; without it (older browsers) the
    Origin's host must be the one asked (not its scheme: a proxy may end TLS before us)."""
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None:
        if fetch_site in ("same-origin", "none"):
            return None
        return f"a login from a {fetch_site[:20]} page is refused: open the console itself"
    origin = request.headers.get("Origin")
    if origin is not None and (origin == "null" or urlsplit(origin).netloc != request.host):
        return "a login from another origin's page is refused: open the console itself"
    return None


class ConsoleError(Exception):
    """A page's refusal, shown as an error page with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the session's principal, resolved for this request."""

    principal: Principal
    session: Session
    #: a cookie to set with the answer (a session just opened for the anonymous admin)
    new_cookie: str | None = None


@dataclass(frozen=True)
class Shown:
    """Bytes as the record browser shows them."""

    kind: str  # "text", "hex" or "none"
    text: str
    length: int
    shown_bytes: int

    @property
    def cut(self) -> bool:
        return self.shown_bytes < self.length


def shown(data: bytes | None) -> Shown:
    """Text when the bytes are printable UTF-8 (tabs and newlines allowed), else hex; at most
    SHOWN_BYTES of them."""
    if data is None:
        return Shown("none", "", 0, 0)
    part = data[:SHOWN_BYTES]
    hexed = Shown("hex", part.hex(" "), len(data), len(part))
    # (text cut inside a character at SHOWN_BYTES is still text: up to 3 bytes fewer)
    for short in range(4 if len(data) > SHOWN_BYTES else 1):
        try:
            text = part[: len(part) - short].decode()
        except UnicodeDecodeError:
            continue
        if all(c.isprintable() or c in "\t\n\r" for c in text):
            return Shown("text", text, len(data), len(part) - short)
        return hexed
    return hexed


def human_bytes(count: int) -> str:
    """`count` bytes in B, KiB, MiB, GiB or TiB."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"


def _utc(ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{ms % 1000:03d}"


def _swagger_dir() -> Path | None:
    """Where swagger-ui-py keeps Swagger UI's files (None: the package is not installed)."""
    try:
        path = Path(str(importlib.resources.files("swagger_ui") / "static"))
    except ModuleNotFoundError:
        return None
    return path if path.is_dir() else None


class Console:
    """The console of the broker behind `api`."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.broker = api.broker
        config = self.broker.config
        self.sessions = Sessions(session_key(config.secret, config.cluster_id))
        self.limiter = LoginLimiter()
        self.data = Gatherer(api)
        self.secure_cookie = self.broker.tls is not None or config.api_scheme == "https"
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.templates.filters["bytes"] = human_bytes
        self.static = {p.name: p for p in (HERE / "static").iterdir() if p.is_file()}
        swagger = _swagger_dir()
        self.swagger = {name: swagger / name for name in SWAGGER_FILES} if swagger else {}
        self._openapi_json: bytes | None = None

    def register(self, app: web.Application) -> None:
        """Add the console's routes (PATHS) to the broker's application."""
        page = self._page
        routes: list[tuple[str, str, Handler]] = [
            ("GET", "/", self.home),
            ("GET", LOGIN_PATH, self.login_form),
            ("POST", LOGIN_PATH, self.login),
            ("POST", "/console/logout", page(self.logout, form=True)),
            ("GET", HOME_PATH, page(self.cluster)),
            ("POST", "/console/nodes/{node}/drain", page(self.drain, form=True, admin=True)),
            ("POST", "/console/nodes/{node}/undrain", page(self.undrain, form=True, admin=True)),
            ("GET", "/console/topics", page(self.topics)),
            ("GET", "/console/topics/{topic}", page(self.topic)),
            ("GET", "/console/topics/{topic}/groups", page(self.groups)),
            ("GET", "/console/records", page(self.records)),
            ("GET", "/console/charts", page(self.charts)),
            ("GET", "/console/api-docs", page(self.api_docs)),
            ("GET", "/console/api/rates", self.rates),
            ("GET", "/console/static/{name}", self.static_file),
            ("GET", "/console/swagger-ui/{name}", self.swagger_file),
            ("GET", INTERNAL_GROUPS_PATH, self.internal_groups),
            ("GET", "/openapi.yaml", self.openapi_yaml),
            ("GET", "/openapi.json", self.openapi_json),
        ]
        if {path for _, path, _ in routes} != set(PATHS):
            raise RuntimeError("console.PATHS must name every console route (aiohttp serves them)")
        for method, path, handler in routes:
            if method == "GET":
                app.router.add_get(path, handler)  # (and HEAD)
            else:
                app.router.add_route(method, path, handler)
        app.on_cleanup.append(self._cleanup)

    async def _cleanup(self, _: web.Application) -> None:
        await self.data.close()

    # ---- sessions --------------------------------------------------------------------------

    def _principal(self, name: str) -> Principal | None:
        anonymous = self.api.auth.anonymous
        if anonymous is not None and name == anonymous.name:
            return anonymous
        return find_principal(self.api.auth.principals, name)

    def _logged_in(self, request: web.Request, now_s: float) -> Viewer | None:
        """The request's session, if it has a valid one whose principal (and token) still
        exists."""
        session = self.sessions.verify(request.cookies.get(COOKIE_NAME), now_s)
        if session is not None:
            principal = self._principal(session.principal)
            if principal is not None and self.sessions.holds(session, principal):
                return Viewer(principal, session)
        return None

    def _viewer(self, request: web.Request) -> Viewer | None:
        """The request's session; else, with --allow-anonymous, a new one for the anonymous
        admin."""
        now_s = time.time()
        viewer = self._logged_in(request, now_s)
        if viewer is not None:
            return viewer
        anonymous = self.api.auth.anonymous
        if anonymous is None:
            return None
        cookie = self.sessions.issue(anonymous.name, None, now_s)
        opened = self.sessions.verify(cookie, now_s)
        assert opened is not None
        return Viewer(anonymous, opened, new_cookie=cookie)

    def _set_cookie(self, response: web.StreamResponse, cookie: str) -> None:
        response.set_cookie(
            COOKIE_NAME,
            cookie,
            max_age=self.sessions.ttl_s,
            path="/",
            secure=self.secure_cookie,
            httponly=True,
            samesite="Strict",
        )

    def _clear_cookie(self, response: web.StreamResponse) -> None:
        response.del_cookie(
            COOKIE_NAME, path="/", secure=self.secure_cookie, httponly=True, samesite="Strict"
        )

    def _to_login(self, request: web.Request) -> web.Response:
        response = see_other(LOGIN_PATH)
        if COOKIE_NAME in request.cookies:  # (expired, forged, or its principal gone)
            self._clear_cookie(response)
        return response

    # ---- rendering -------------------------------------------------------------------------

    @staticmethod
    def _headers(response: web.Response, cache: str = "no-store") -> web.Response:
        response.headers.update(SECURITY_HEADERS)
        response.headers["Cache-Control"] = cache
        return response

    def _render(
        self,
        template: str,
        viewer: Viewer | None,
        *,
        status: int = 200,
        current: str = "",
        **context: Any,
    ) -> web.Response:
        html = self.templates.get_template(template).render(
            viewer=viewer,
            csrf=self.sessions.csrf_token(viewer.session) if viewer else "",
            nav=NAV,
            current=current,
            cluster_id=self.broker.config.cluster_id,
            node_id=self.broker.id,
            shown_at=datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S"),
            **context,
        )
        response = web.Response(text=html, status=status, content_type="text/html")
        return self._headers(response)

    def _error(self, viewer: Viewer | None, status: int, message: str) -> web.Response:
        titles = {400: "Bad request", 403: "Forbidden", 404: "Not found", 429: "Too many tries"}
        title = titles.get(status, "Not available" if status >= 500 else "Error")
        return self._render(
            "error.html", viewer, status=status, title=title, message=message, back=None
        )

    def _page(self, render: Page, *, form: bool = False, admin: bool = False) -> Handler:
        """`render(request, viewer)` for a request with a session (others: to the login
        page); a form's POST needs its CSRF token, an admin form an admin. Refusals and the
        cluster's errors become error pages, never a traceback."""

        @functools.wraps(render)
        async def handler(request: web.Request) -> web.StreamResponse:
            viewer = self._viewer(request)
            if viewer is None:
                return self._to_login(request)
            try:
                if form:
                    token = (await form_fields(request)).get("csrf")
                    if not self.sessions.check_csrf(viewer.session, token):
                        raise ConsoleError(403, "the form's CSRF token is missing or wrong")
                if admin and not viewer.principal.admin:
                    raise ConsoleError(403, f"{viewer.principal.describe()} is not an admin")
                response = await render(request, viewer)
            except ConsoleError as e:
                response = self._error(viewer, e.status, e.message)
            except ApiError as e:
                response = self._error(viewer, e.status if e.status >= 400 else 503, e.message)
            except LaminarError as e:
                status = e.status if 400 <= e.status <= 599 else 503
                response = self._error(viewer, status, e.message)
            except web.HTTPException:
                raise
            except Exception:
                log.exception("console: %s %s failed unexpectedly", request.method, request.path)
                response = self._error(viewer, 500, INTERNAL_MESSAGE)
            if viewer.new_cookie is not None:
                self._set_cookie(response, viewer.new_cookie)
            return response

        return handler

    # ---- login -----------------------------------------------------------------------------

    async def home(self, request: web.Request) -> web.StreamResponse:
        return see_other(HOME_PATH)

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        if self._logged_in(request, time.time()) is not None:
            return see_other(HOME_PATH)
        return self._render("login.html", None, title="Log in", error=None)

    async def login(self, request: web.Request) -> web.StreamResponse:
        """Check a token as the API does; a session cookie for its principal. Failures are
        counted per client address (LoginLimiter) and logged without the token. A login a
        browser sends from another site's page is refused before anything is read (login
        CSRF: it would log the victim in as someone else), by the request's Sec-Fetch-Site
        and Origin headers (no form token: there is no session yet to bind one to)."""
        if (refused := _cross_site(request)) is not None:
            return self._error(None, 403, refused)
        address = request.remote or "unknown"
        now_s = time.time()
        if not self.limiter.allowed(address, now_s):
            response = self._error(None, 429, "too many failed logins from your address; wait")
            response.headers["Retry-After"] = str(self.limiter.retry_after_s(address, now_s))
            return response
        token = (await form_fields(request)).get("token", "").strip()
        principal = None
        if token and len(token) <= MAX_TOKEN_CHARS:
            try:
                principal = self.api.auth.authenticate(f"Bearer {token}")
            except ApiError:
                principal = None
        if principal is None:
            self.limiter.failed(address, now_s)
            log.info("console: a failed login from %s", address)
            return self._render(
                "login.html", None, status=401, title="Log in", error="That token is not known."
            )
        log.info("console: %s logged in from %s", principal.name, address)
        response = see_other(HOME_PATH)
        self._set_cookie(response, self.sessions.issue(principal.name, token, now_s))
        return response

    async def logout(self, request: web.Request, viewer: Viewer) -> web.Response:
        response = see_other(LOGIN_PATH)
        self._clear_cookie(response)
        return response

    # ---- the cluster -----------------------------------------------------------------------

    async def cluster(self, request: web.Request, viewer: Viewer) -> web.Response:
        members = await self.data.members()
        return self._render(
            "cluster.html",
            viewer,
            title="Cluster",
            current=HOME_PATH,
            members=members,
            alive=sum(1 for m in members if m.alive),
            metadata_leader=self.broker.core.metadata_leader,
        )

    def _node(self, request: web.Request) -> str:
        node = request.match_info["node"]
        state = self.broker.core.state
        known = set(self.broker.members()) | set(state.weights) | state.draining
        if not WORKER_NODE_ID.fullmatch(node) or node not in known:
            raise ConsoleError(404, f"no member {node[:60]!r}")
        return node

    async def drain(self, request: web.Request, viewer: Viewer) -> web.Response:
        """Through the API's own drain (the brokers' client: any broker, which forwards it
        to the metadata leader)."""
        node = self._node(request)
        await self._shown(self.broker.internal_client().drain(node))
        log.info("console: %s drained %s", viewer.principal.name, node)
        return see_other(HOME_PATH)

    async def undrain(self, request: web.Request, viewer: Viewer) -> web.Response:
        node = self._node(request)
        await self._shown(self.broker.internal_client().undrain(node))
        log.info("console: %s undrained %s", viewer.principal.name, node)
        return see_other(HOME_PATH)

    async def _shown(self, change: Awaitable[object]) -> None:
        """An admin change made, then applied by this broker too (up to METADATA_WAIT_S), so
        the page the form redirects to shows it: it was committed by the metadata leader,
        which this broker may follow a moment behind (read-your-writes, as the API's
        Laminar-Metadata-Index)."""
        await change
        index = self.broker.internal_client().metadata_index
        await self.broker.waits.metadata_applied(index, METADATA_WAIT_S)

    # ---- topics ----------------------------------------------------------------------------

    def _topic(self, name: str, viewer: Viewer, action: Action) -> str:
        """Topic `name`, which must exist, if the viewer may do `action` on it."""
        if not TOPIC_NAME.fullmatch(name):
            raise ConsoleError(400, f"topic name {name[:50]!r} must match {TOPIC_NAME.pattern}")
        if not viewer.principal.may(action, name):
            verb = "describe" if action is Action.DESCRIBE else "read"
            raise ConsoleError(403, f"{viewer.principal.describe()} may not {verb} topic {name}")
        if name not in self.broker.core.state.topics:
            raise ConsoleError(404, f"no topic {name}")
        return name

    async def topics(self, request: web.Request, viewer: Viewer) -> web.Response:
        principal = viewer.principal
        rows = await self.data.topics(principal.in_scope)
        return self._render(
            "topics.html",
            viewer,
            title="Topics",
            current="/console/topics",
            topics=rows,
            may_describe=lambda name: principal.may(Action.DESCRIBE, name),
            may_consume=lambda name: principal.may(Action.CONSUME, name),
        )

    async def topic(self, request: web.Request, viewer: Viewer) -> web.Response:
        name = self._topic(request.match_info["topic"], viewer, Action.DESCRIBE)
        rows = await self.data.partitions(name)
        return self._render(
            "topic.html",
            viewer,
            title=f"Topic {name}",
            current="/console/topics",
            topic=name,
            partitions=rows,
            under_replicated=sum(1 for r in rows if r.under_replicated),
            may_consume=viewer.principal.may(Action.CONSUME, name),
        )

    async def groups(self, request: web.Request, viewer: Viewer) -> web.Response:
        name = self._topic(request.match_info["topic"], viewer, Action.CONSUME)
        rows, unknown = await self.data.groups(name)
        return self._render(
            "groups.html",
            viewer,
            title=f"Consumer groups of {name}",
            current="/console/topics",
            topic=name,
            groups=rows,
            unknown=unknown,
        )

    # ---- records ---------------------------------------------------------------------------

    @staticmethod
    def _number(text: str, what: str, low: int, high: int) -> int:
        text = text.strip()
        if not text.isascii() or not text.isdigit() or len(text) > MAX_NUMBER_CHARS:
            raise ConsoleError(400, f"{what} {text[:30]!r} is not a non-negative whole number")
        value = int(text)
        if not low <= value <= high:
            raise ConsoleError(400, f"{what} {value} is out of range: it must be {low} to {high}")
        return value

    async def records(self, request: web.Request, viewer: Viewer) -> web.Response:
        """The record browser: a form, and the records it asks for (consume on the topic)."""
        principal = viewer.principal
        readable = self.data.topic_names(lambda n: principal.may(Action.CONSUME, n))
        query = request.query
        form = {
            "topic": query.get("topic", ""),
            "partition": query.get("partition", "0"),
            "from": query.get("from", ""),
            "max": query.get("max", str(DEFAULT_BROWSE_RECORDS)),
        }
        page: dict[str, Any] = {
            "title": "Records",
            "current": "/console/records",
            "topics": readable,
            "form": form,
            "max_records": MAX_BROWSE_RECORDS,
            "result": None,
            "rows": [],
            "next_href": None,
            "error": None,
        }
        if "topic" not in query:
            return self._render("records.html", viewer, **page)
        name = self._topic(form["topic"], viewer, Action.CONSUME)
        partitions = self.broker.core.state.topics[name].partitions
        try:
            partition = self._number(form["partition"], "partition", 0, partitions - 1)
            from_index = (
                self._number(form["from"], "from index", 0, MAX_INDEX) if form["from"] else None
            )
            max_records = self._number(form["max"], "records", 1, MAX_BROWSE_RECORDS)
        except ConsoleError as e:
            page["error"] = e.message
            return self._render("records.html", viewer, status=e.status, **page)
        try:
            result = await self.data.records(name, partition, from_index, max_records)
        except OutOfRange as e:
            start = "?" if e.log_start is None else e.log_start
            where = f"{name}/{partition}"
            page["error"] = f"index {from_index} is below the log start ({start}) of {where}"
            return self._render("records.html", viewer, status=400, **page)
        page["result"] = result
        page["rows"] = list(_record_rows(result))
        if result.next_index <= result.commit_index:  # (more is readable now)
            page["next_href"] = "/console/records?" + urlencode(
                {**form, "partition": partition, "from": result.next_index}
            )
        return self._render("records.html", viewer, **page)

    # ---- charts and the API page -----------------------------------------------------------

    async def charts(self, request: web.Request, viewer: Viewer) -> web.Response:
        return self._render(
            "charts.html",
            viewer,
            title="Charts",
            current="/console/charts",
            poll_s=CHART_POLL_S,
            points=CHART_POINTS,
        )

    async def rates(self, request: web.Request) -> web.StreamResponse:
        """The charts' data (JSON): rates and latency percentiles between the last two
        scrapes of every broker's metrics."""
        if self._viewer(request) is None:
            body = {"error": {"code": "unauthorized", "message": "log in to the console"}}
            return self._headers(web.json_response(body, status=401))
        return self._headers(web.json_response(await self.data.rates()))

    async def api_docs(self, request: web.Request, viewer: Viewer) -> web.Response:
        if not self.swagger:
            raise ConsoleError(503, "Swagger UI is not installed (pip install swagger-ui-py)")
        return self._render("api_docs.html", viewer, title="API", current="/console/api-docs")

    # ---- files -----------------------------------------------------------------------------

    def _file(self, path: Path | None) -> web.StreamResponse:
        if path is None:
            raise web.HTTPNotFound()
        content_type, _ = mimetypes.guess_type(path.name)
        response = web.FileResponse(path)
        response.content_type = content_type or "application/octet-stream"
        response.headers.update(SECURITY_HEADERS)
        response.headers["Cache-Control"] = "no-cache"
        return response

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        return self._file(self.static.get(request.match_info["name"]))

    async def swagger_file(self, request: web.Request) -> web.StreamResponse:
        return self._file(self.swagger.get(request.match_info["name"]))

    async def openapi_yaml(self, request: web.Request) -> web.StreamResponse:
        """The API's OpenAPI document, as the broker ships it (open, as /metrics is)."""
        response = self._file(OPENAPI_FILE)
        response.content_type = "application/yaml"
        return response

    async def openapi_json(self, request: web.Request) -> web.Response:
        if self._openapi_json is None:
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            document = yaml.load(OPENAPI_FILE.read_text(), Loader=loader)
            self._openapi_json = orjson.dumps(document)
        response = web.Response(body=self._openapi_json, content_type="application/json")
        return self._headers(response, cache="no-cache")

    # ---- between brokers -------------------------------------------------------------------

    async def internal_groups(self, request: web.Request) -> web.Response:
        """The consumer groups of topic `?topic=`'s partitions this broker leads: for the
        console of another broker (its principal alone may ask)."""
        try:
            principal = self.api.auth.authenticate(request.headers.get("Authorization"))
        except ApiError as e:
            return e.response()
        if principal.name != INTERNAL_PRINCIPAL:
            return ApiError(403, "forbidden", "only the brokers may").response()
        topic = request.query.get("topic", "")
        if not TOPIC_NAME.fullmatch(topic):
            return ApiError(400, "bad_request", "?topic= must be a topic name").response()
        rows = [row.to_json() for row in self.data.local_groups(topic)]
        return web.json_response({"node": self.broker.id, "groups": rows}, dumps=_dumps)


async def form_fields(request: web.Request) -> dict[str, str]:
    """A form's text fields (none, for a body that is not a form: its fields are missing)."""
    try:
        fields = await request.post()
    except (ValueError, UnicodeDecodeError, AssertionError):  # (not a form aiohttp can read)
        return {}
    return {name: value for name, value in fields.items() if isinstance(value, str)}


def see_other(location: str) -> web.Response:
    """A 303 to `location` (a page of this console), with the console's headers."""
    response = web.Response(status=303, headers={"Location": location})
    return Console._headers(response)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


@dataclass(frozen=True)
class RecordRow:
    index: int
    timestamp: str
    key: Shown
    value: Shown
    headers: list[tuple[str, Shown]]


def _record_rows(result: ReadResult) -> Iterator[RecordRow]:
    for record in result.records:
        yield RecordRow(
            index=record.index,
            timestamp=_utc(record.timestamp_ms),
            key=shown(record.key),
            value=shown(record.value),
            headers=[(name, shown(value)) for name, value in record.headers],
        )
