"""The dashboard's handlers over ASGI (httpx, in process): login, CSRF, input errors shown on
the page, escaping, headers. The admin client is never started, so every call that would reach
a cluster fails as a closed client does (the page says so, status 502)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from client.admin import Admin
from client.config import ClientConfig
from dashboard import app as dash_app
from dashboard.app import CSRF_COOKIE, SESSION_COOKIE, Dashboard, Login, create_app
from dashboard.history import History, Sample

XSS = "<script>alert(1)</script>"


def _dashboard(**kw: object) -> Dashboard:
    admin = Admin(ClientConfig(namesrv_addr="127.0.0.1:1"))
    return Dashboard(admin=admin, history=History(5), **kw)  # type: ignore[arg-type]


async def _client(dash: Dashboard) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(dash))
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as c:
        yield c


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async for c in _client(_dashboard()):
        yield c


async def _csrf(client: httpx.AsyncClient, page: str = "/topics") -> str:
    await client.get(page)
    token = client.cookies.get(CSRF_COOKIE)
    assert token
    return token


async def test_pages_show_cluster_errors_not_tracebacks(client: httpx.AsyncClient) -> None:
    for path in ("/cluster", "/topics", "/groups", "/topic?t=T", "/group?g=g", "/dlq?g=g"):
        resp = await client.get(path)
        assert resp.status_code == 502, path
        assert "cluster error" in resp.text
        assert "Traceback" not in resp.text
    root = await client.get("/")
    assert root.status_code == 303
    assert root.headers["location"] == "/cluster"


async def test_security_headers(client: httpx.AsyncClient) -> None:
    resp = await client.get("/messages")
    assert resp.status_code == 200
    assert "script-src 'self'" in resp.headers["content-security-policy"]
    assert resp.headers["x-frame-options"] == "DENY"
    assert resp.headers["cache-control"] == "no-store"
    cookie = resp.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie


async def test_post_without_csrf_token_is_refused(client: httpx.AsyncClient) -> None:
    form = {"topic": "T", "cluster": "DefaultCluster", "read": "4", "write": "4"}
    resp = await client.post("/topics/create", data=form)
    assert resp.status_code == 400
    assert "CSRF" in resp.text
    await _csrf(client)
    resp = await client.post("/topics/create", data={**form, "csrf": "forged"})
    assert resp.status_code == 400
    assert "CSRF" in resp.text


@pytest.mark.parametrize(
    ("form", "msg"),
    [
        ({"topic": XSS, "read": "4", "write": "4", "cluster": "c"}, "illegal characters"),
        ({"topic": "T", "read": "0", "write": "4", "cluster": "c"}, "read queues must be"),
        ({"topic": "T", "read": "4", "write": "x", "cluster": "c"}, "write queues must be"),
        ({"topic": "T", "read": "4", "write": "4", "perm": "5", "cluster": "c"}, "perm is 2"),
        ({"topic": "T", "read": "4", "write": "4"}, "give a cluster or a broker"),
    ],
)
async def test_create_topic_bad_input(
    client: httpx.AsyncClient, form: dict[str, str], msg: str
) -> None:
    token = await _csrf(client)
    resp = await client.post("/topics/create", data={**form, "csrf": token})
    assert resp.status_code == 400
    assert msg in resp.text
    assert XSS not in resp.text  # escaped wherever it is echoed


@pytest.mark.parametrize(
    ("query", "msg"),
    [
        ("mode=offset&topic=T&broker=b&queue=-1&offset=0", "queue id must be between"),
        ("mode=offset&topic=T&broker=b&queue=0&offset=x", "offset must be a whole number"),
        ("mode=offset&topic=T&broker=b&queue=0&offset=0&count=1000", "count must be between"),
        ("mode=offset&topic=T&queue=0&offset=0", "give the broker name"),
        ("mode=key&topic=T&key=", "give a key"),
        ("mode=id&id=" + "%3Cscript%3E", "hex digits"),
        ("mode=key&topic=%3Cb%3E&key=k", "illegal characters"),
        ("mode=what", "unknown lookup"),
    ],
)
async def test_message_lookup_bad_input(client: httpx.AsyncClient, query: str, msg: str) -> None:
    resp = await client.get(f"/messages?{query}")
    assert resp.status_code == 400
    assert msg in resp.text
    assert "<b>" not in resp.text
    assert "<script>" not in resp.text


async def test_trace_page_input(client: httpx.AsyncClient) -> None:
    empty = await client.get("/trace")
    assert empty.status_code == 200
    assert 'name="id"' in empty.text
    bad = await client.get("/trace?id=%3Cb%3E")
    assert bad.status_code == 400
    assert "hex digits" in bad.text
    assert "<b>" not in bad.text
    topic = await client.get("/trace?id=AB&topic=bad%20topic")
    assert topic.status_code == 400
    assert "illegal characters" in topic.text


async def test_group_forms_bad_input(client: httpx.AsyncClient) -> None:
    token = await _csrf(client)
    resp = await client.post(
        "/group/reset", data={"csrf": token, "group": "g", "topic": "T", "time": "soon"}
    )
    assert resp.status_code == 400
    assert "epoch milliseconds" in resp.text
    resp = await client.post(
        "/group/delete", data={"csrf": token, "group": "g", "confirm": "other"}
    )
    assert resp.status_code == 400
    assert "to confirm the delete" in resp.text
    resp = await client.post("/topic/delete", data={"csrf": token, "topic": "T"})
    assert resp.status_code == 400
    assert "to confirm the delete" in resp.text
    resp = await client.get("/group?g=" + "%3Cscript%3E")
    assert resp.status_code == 400
    assert "&lt;script&gt;" in resp.text


async def test_oversized_form_is_refused(client: httpx.AsyncClient) -> None:
    token = await _csrf(client)
    body = {"csrf": token, "topic": "T", "body": "x" * (dash_app.MAX_FORM_BYTES + 1)}
    resp = await client.post("/topic/send", data=body)
    assert resp.status_code == 400
    assert "larger than" in resp.text


async def test_history_api_and_chart_library(tmp_path: Path) -> None:
    lib = tmp_path / "chart.min.js"
    lib.write_text("/* chart */")
    dash = _dashboard(chartjs=lib)
    dash.history.add(Sample(1, 2.0, 3.0, {XSS: 4}))
    dash.history.last_error = "boom"
    async for client in _client(dash):
        data = (await client.get("/api/history")).json()
        assert data["samples"] == [{"ts": 1, "tpsIn": 2.0, "tpsOut": 3.0, "lag": {XSS: 4}}]
        assert data["error"] == "boom"
        js = await client.get("/static/chart.min.js")
        assert js.status_code == 200
        assert js.text == "/* chart */"
        page = await client.get("/charts")
        assert '<script src="/static/chart.min.js">' in page.text
        assert (await client.get("/static/charts.js")).status_code == 200
    async for client in _client(_dashboard()):
        assert (await client.get("/static/chart.min.js")).status_code == 404
        page = await client.get("/charts")
        assert "Chart.js is not installed" in page.text


async def test_login_flow() -> None:
    dash = _dashboard(login=Login("admin", "s3cret"))
    async for client in _client(dash):
        resp = await client.get("/cluster")
        assert resp.status_code == 303
        assert resp.headers["location"] == "/login"
        assert (await client.get("/api/history")).status_code == 401
        token = await _csrf(client, "/login")
        bad = await client.post(
            "/login", data={"csrf": token, "user": "admin", "password": "wrong"}
        )
        assert bad.status_code == 401
        assert "wrong user or password" in bad.text
        assert SESSION_COOKIE not in client.cookies
        ok = await client.post(
            "/login", data={"csrf": token, "user": "admin", "password": "s3cret"}
        )
        assert ok.status_code == 303
        assert client.cookies.get(SESSION_COOKIE)
        assert (await client.get("/api/history")).status_code == 200
        page = await client.get("/messages")
        assert page.status_code == 200
        assert re.search(r'action="/logout"', page.text)
        out = await client.post("/logout", data={"csrf": token})
        assert out.status_code == 303
        assert not dash.login or not dash.login.sessions
        client.cookies.delete(SESSION_COOKIE)
        assert (await client.get("/cluster")).status_code == 303


def test_login_check_and_bounded_sessions() -> None:
    login = Login("u", "p")
    assert login.check("u", "p")
    assert not login.check("u", "P")
    assert not login.check("", "")
    assert not login.check("u" * 10_000, "p")
    tokens = [login.open_session() for _ in range(dash_app.MAX_SESSIONS + 5)]
    assert len(login.sessions) == dash_app.MAX_SESSIONS
    assert not login.valid(tokens[0])
    assert login.valid(tokens[-1])
    assert not login.valid(None)
    assert not login.valid("made-up")
    expired = Login("u", "p", session_ttl_s=-1)
    assert not expired.valid(expired.open_session())
