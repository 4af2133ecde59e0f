"""mqdashboard in a real browser: Playwright driving Debian's chromium (headless) against a real
`mqdashboard` process, NameServer and broker(s).

A screenshot of every page visited goes to `test-artifacts/dashboard/<test>/` (gitignored),
with the browser's console log; on failure also the page's HTML (`failure.html`).
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    PushConsumer,
)
from tests.helpers import wait_until
from tests.integration.client_support import create_topic, fast_config
from tests.integration.procs import BIN_DIR, BrokerProc, ManagedProcess, NamesrvProc, stop_all

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "dashboard"
StartBroker = Callable[..., BrokerProc]


class DashboardProc(ManagedProcess):
    """`mqdashboard -n NAMESRV --listen 127.0.0.1:<port> --sample-interval 1 [args]`."""

    def __init__(
        self,
        workdir: Path,
        namesrv_addr: str,
        *,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ) -> None:
        from tests.helpers import free_port

        super().__init__("mqdashboard", workdir, free_port(), env)
        self.namesrv_addr = namesrv_addr
        self.args = args

    def argv(self) -> list[str]:
        return [
            str(BIN_DIR / "mqdashboard"),
            "-n",
            self.namesrv_addr,
            "--listen",
            self.addr,
            "--sample-interval",
            "1",
            *self.args,
        ]

    @property
    def url(self) -> str:
        return f"http://{self.addr}"


@pytest.fixture
def start_dashboard(tmp_path: Path) -> Iterator[Callable[..., DashboardProc]]:
    started: list[ManagedProcess] = []

    def _start(namesrv_addr: str, **kw: Any) -> DashboardProc:
        proc = DashboardProc(tmp_path / f"dashboard{len(started)}", namesrv_addr, **kw)
        started.append(proc)
        proc.start()
        return proc

    try:
        yield _start
    finally:
        stop_all(started)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: run `make browser-install`")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()


class Recorder:
    """A page with its console log; `shot` writes a numbered screenshot."""

    def __init__(self, page: Page, outdir: Path) -> None:
        self.page = page
        self.outdir = outdir
        self.console: list[str] = []
        self.shots = 0
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.console.append(f"pageerror: {exc}"))

    def _on_console(self, msg: ConsoleMessage) -> None:
        self.console.append(f"{msg.type}: {msg.text}")

    def shot(self, name: str) -> None:
        self.shots += 1
        self.page.screenshot(path=str(self.outdir / f"{self.shots:02d}-{name}.png"), full_page=True)


@pytest.fixture
def rec(browser: Browser, request: pytest.FixtureRequest) -> Iterator[Recorder]:
    outdir = ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)
    shutil.rmtree(outdir, ignore_errors=True)
    outdir.mkdir(parents=True)
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15_000)
    r = Recorder(page, outdir)
    try:
        yield r
    finally:
        (outdir / "console.log").write_text("\n".join(r.console) + "\n", encoding="utf-8")
        context.close()


@contextmanager
def on_failure_dump(rec: Recorder) -> Iterator[None]:
    """On failure: the page's HTML (and a last screenshot) next to the console log."""
    try:
        yield
    except BaseException:
        try:
            (rec.outdir / "failure.html").write_text(rec.page.content(), encoding="utf-8")
            rec.shot("failure")
        except Exception as exc:  # the page may be gone; keep the test's own error
            (rec.outdir / "failure.html").write_text(f"(no page: {exc})\n", encoding="utf-8")
        raise


@pytest.fixture
def cluster(namesrv: NamesrvProc, start_broker: StartBroker) -> str:
    start_broker(namesrv.addr, name="broker-a")
    return namesrv.addr


def _wait_registered(page: Page, url: str, brokers: int) -> None:
    """Reload the cluster page until `brokers` rows show (registration takes a moment)."""
    for _ in range(100):
        page.goto(f"{url}/cluster")
        if page.locator("#brokers tr.broker").count() >= brokers:
            return
        page.wait_for_timeout(200)
    raise AssertionError(f"{brokers} broker(s) not shown on the cluster page")


def test_create_topic_send_and_find_by_key(
    cluster: str, start_dashboard: Callable[..., DashboardProc], rec: Recorder
) -> None:
    dash = start_dashboard(cluster)
    page = rec.page
    with on_failure_dump(rec):
        _wait_registered(page, dash.url, 1)
        row = page.locator("#brokers tr.broker").first
        expect(row).to_contain_text("broker-a")
        expect(row).to_contain_text("ASYNC_MASTER")
        rec.shot("cluster")

        # Create a topic from the topics page.
        page.goto(f"{dash.url}/topics")
        form = page.locator("#create-topic")
        form.locator("input[name=topic]").fill("DashTopic")
        form.locator("input[name=read]").fill("2")
        form.locator("input[name=write]").fill("2")
        rec.shot("topics-create")
        form.locator("button[type=submit]").click()
        expect(page.locator("#notice")).to_contain_text("DashTopic created/updated")
        expect(page.locator("#route")).to_contain_text("broker-a")
        expect(page.locator("#status tbody tr")).to_have_count(2)
        rec.shot("topic")

        # Update it from its page: 3 queues.
        update = page.locator("#update-topic")
        expect(update.locator("input[name=read]")).to_have_value("2")
        update.locator("input[name=read]").fill("3")
        update.locator("input[name=write]").fill("3")
        update.locator("button[type=submit]").click()
        expect(page.locator("#notice")).to_contain_text("DashTopic created/updated")
        for _ in range(50):
            if page.locator("#status tbody tr").count() == 3:
                break
            page.wait_for_timeout(200)
            page.reload()
        expect(page.locator("#status tbody tr")).to_have_count(3)
        rec.shot("topic-updated")

        # A bad name: a clear message on the page, the markup shown as text.
        page.goto(f"{dash.url}/topics")
        page.locator("#create-topic input[name=topic]").fill("<img src=x id=injected>")
        page.locator("#create-topic button[type=submit]").click()
        expect(page.locator("#error")).to_contain_text("illegal characters")
        expect(page.locator("#error")).to_contain_text("<img src=x id=injected>")
        assert page.locator("#injected").count() == 0
        rec.shot("topics-bad-name")

        # Search lists it.
        page.goto(f"{dash.url}/topics?q=dashtop")
        expect(page.locator("#topic-list")).to_contain_text("DashTopic")
        rec.shot("topics-search")

        # Send a test message whose body is markup.
        page.goto(f"{dash.url}/topic?t=DashTopic")
        send = page.locator("#send-message")
        send.locator("input[name=tags]").fill("TagD")
        send.locator("input[name=keys]").fill("order-42 other")
        send.locator("textarea[name=body]").fill("<b>hello</b> dashboard")
        send.locator("button[type=submit]").click()
        expect(page.locator("#send-status")).to_have_text("SEND_OK")
        msg_id = page.locator("#send-msg-id").inner_text().strip()
        assert re.fullmatch(r"[0-9A-F]{32}", msg_id)
        rec.shot("sent")

        # Find it by key (the index is written as the message is dispatched: poll).
        for _ in range(50):
            page.goto(f"{dash.url}/messages")
            key_form = page.locator("#by-key")
            key_form.locator("input[name=topic]").fill("DashTopic")
            key_form.locator("input[name=key]").fill("order-42")
            key_form.locator("button[type=submit]").click()
            if page.locator("section.message").count():
                break
            page.wait_for_timeout(200)
        expect(page.locator("section.message")).to_have_count(1)
        msg = page.locator("section.message").first
        expect(msg.locator(".msg-id")).to_have_text(msg_id)
        expect(msg.locator("pre.body")).to_have_text("<b>hello</b> dashboard")
        assert msg.locator("pre.body b").count() == 0  # shown, not interpreted
        expect(msg.locator(".msg-keys")).to_have_text("order-42 other")
        rec.shot("messages-by-key")

        # By id, and by queue and offset.
        page.goto(f"{dash.url}/messages?mode=id&topic=DashTopic&id={msg_id}")
        expect(page.locator("section.message .msg-id")).to_have_text(msg_id)
        rec.shot("messages-by-id")
        page.goto(f"{dash.url}/topic?t=DashTopic")
        page.locator("#status a", has_text="browse").first.click()
        expect(page.locator("section.message .msg-id")).to_have_text(msg_id)
        rec.shot("messages-by-offset")
        page.goto(
            f"{dash.url}/messages?mode=offset&topic=DashTopic&broker=broker-a&queue=0&offset=x"
        )
        expect(page.locator("#error")).to_contain_text("offset must be a whole number")
        rec.shot("messages-bad-offset")


async def _produce(ns: str, topic: str, n: int, prefix: str) -> None:
    async with Producer("pg_dash", fast_config(ns)) as p:
        for i in range(n):
            await p.send(Message(topic, f"{prefix}{i}".encode(), keys=f"{prefix}{i}"))


async def _consume(
    ns: str, group: str, topic: str, n: int, stop: threading.Event | None = None
) -> None:
    """Run a push consumer until it has consumed `n` messages, and then until `stop` is set
    (at most 60 s); its offsets are committed as it stops."""
    got: set[str] = set()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        got.update(m.msg_id for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        group,
        fast_config(ns),
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    c.subscribe(topic)
    async with c:
        await wait_until(lambda: len(got) >= n, total=30, what=f"{n} messages consumed")
        if stop is not None:
            await wait_until(stop.is_set, total=60, interval=0.1, what="told to stop")


def _group_lag(page: Page, url: str, group: str) -> int:
    page.goto(f"{url}/group?g={group}")
    return int(page.locator("#total-lag").inner_text())


def test_group_lag_falls_to_zero_after_a_consumer_runs(
    cluster: str, start_dashboard: Callable[..., DashboardProc], rec: Recorder
) -> None:
    trio.run(create_topic, cluster, "DashLag")
    trio.run(_produce, cluster, "DashLag", 3, "a")
    trio.run(_consume, cluster, "cg_dash", "DashLag", 3)  # the group now has offsets
    trio.run(_produce, cluster, "DashLag", 7, "b")
    dash = start_dashboard(cluster)
    page = rec.page
    with on_failure_dump(rec):
        # The consumer stopped: 7 messages wait for it.
        for _ in range(100):
            if _group_lag(page, dash.url, "cg_dash") == 7:
                break
            page.wait_for_timeout(200)
        expect(page.locator("#total-lag")).to_have_text("7")
        expect(page.locator("#no-connections")).to_be_visible()
        rows = page.locator("#progress tbody tr", has_text="DashLag")
        expect(rows).to_have_count(4)  # one per queue (the group's %RETRY% queue has a row too)
        lags = [int(t) for t in rows.locator("td.lag").all_inner_texts()]
        assert sum(lags) == 7
        rec.shot("group-lag-7")

        page.goto(f"{dash.url}/groups")
        row = page.locator("#groups tr", has_text="cg_dash")
        expect(row.locator("td.lag")).to_have_text("7")
        rec.shot("groups")

        # The live chart's latest sample shows the lag too (sampled every second).
        page.goto(f"{dash.url}/charts")
        expect(page.locator("#latest tr.sample-row", has_text="lag cg_dash")).to_contain_text("7")
        assert page.evaluate("typeof window.Chart") == "function"  # Debian's Chart.js loaded
        rec.shot("charts-lag-7")

        # A consumer runs (in its own thread, online until told to stop): the lag falls to 0
        # and the page lists its connection.
        stop = threading.Event()
        errors: list[BaseException] = []

        def consume_online() -> None:
            try:
                trio.run(_consume, cluster, "cg_dash", "DashLag", 7, stop)
            except BaseException as exc:
                errors.append(exc)

        worker = threading.Thread(target=consume_online, daemon=True)
        worker.start()
        try:
            for _ in range(150):
                if (
                    _group_lag(page, dash.url, "cg_dash") == 0
                    and page.locator("#connections tbody tr").count()
                ):
                    break
                page.wait_for_timeout(200)
            expect(page.locator("#total-lag")).to_have_text("0")
            expect(page.locator("#connections tbody tr")).to_have_count(1)
            expect(page.locator("#subscriptions")).to_contain_text("DashLag")
            # The client's own figures (its running info): it consumed 7 within the minute.
            status = page.locator("#client-status tbody tr", has_text="DashLag")
            expect(status).to_have_count(1)
            assert float(status.locator("td.ok-tps").inner_text()) > 0
            rec.shot("group-lag-0-online")
            client_id = page.locator("#connections tbody tr td").first.inner_text()

            # That client consumes one message again, directly (309), from the message's page.
            page.goto(f"{dash.url}/messages?mode=key&topic=DashLag&key=b0")
            form = page.locator("form.consume-directly").first
            form.locator("input[name=group]").fill("cg_dash")
            form.locator("input[name=client]").fill(client_id)
            form.locator("button[type=submit]").click()
            expect(page.locator("#notice")).to_contain_text(f"{client_id} of cg_dash consumed")
            expect(page.locator("#notice")).to_contain_text("CR_SUCCESS")
            rec.shot("message-consumed-directly")
            form = page.locator("form.consume-directly").first
            form.locator("input[name=group]").fill("cg_dash")
            form.locator("input[name=client]").fill("nobody@1")
            form.locator("button[type=submit]").click()
            expect(page.locator("#error")).to_contain_text("The Consumer <nobody@1> Not Online")
        finally:
            stop.set()
            worker.join(timeout=60)
        assert not worker.is_alive()
        assert not errors, errors
        page.goto(f"{dash.url}/charts")
        expect(page.locator("#latest tr.sample-row", has_text="lag cg_dash")).to_contain_text("0")
        rec.shot("charts-lag-0")

        # Reset by time to the start: the lag is back to all 10.
        page.goto(f"{dash.url}/group?g=cg_dash")
        reset = page.locator("#reset-offset")
        reset.locator("input[name=topic]").fill("DashLag")
        reset.locator("input[name=time]").fill("0")
        reset.locator("button[type=submit]").click()
        expect(page.locator("#notice")).to_contain_text("offsets of DashLag reset")
        expect(page.locator("#total-lag")).to_have_text("10")
        rec.shot("group-reset")
        reset = page.locator("#reset-offset")
        reset.locator("input[name=topic]").fill("DashLag")
        reset.locator("input[name=time]").fill("tomorrow")
        reset.locator("button[type=submit]").click()
        expect(page.locator("#error")).to_contain_text("epoch milliseconds")
        rec.shot("group-reset-bad-time")


async def _dead_letter(ns: str, broker_addr: str, group: str, topic: str) -> None:
    """One message that always fails: after one retry it is in `%DLQ%<group>`."""

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        raise RuntimeError("always fails")

    cfg = fast_config(ns, max_reconsume_times=1)
    c = PushConsumer(
        group, cfg, listener=listener, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
    )
    c.subscribe(topic)
    dlq = MessageQueue(f"%DLQ%{group}", "broker-a", 0)
    async with Producer("pg_dlq", cfg) as p, c:
        await p.send(Message(topic, b"\x00\x01poison<i>", keys="poison-1"))
        api = c.instance.api

        async def in_dlq() -> bool:
            try:
                return await api.get_max_offset(broker_addr, dlq) == 1
            except Exception:
                return False

        await wait_until(in_dlq, total=30, what="message in the DLQ")


def test_dlq_message_resent(
    namesrv: NamesrvProc,
    start_broker: StartBroker,
    start_dashboard: Callable[..., DashboardProc],
    rec: Recorder,
) -> None:
    # Every retry level 1 s: the message is dead-lettered within seconds.
    broker = start_broker(namesrv.addr, env={"TRIMQ_MESSAGE_DELAY_LEVEL": "1s 1s 1s"})
    trio.run(create_topic, namesrv.addr, "DashDlq")
    trio.run(_dead_letter, namesrv.addr, broker.addr, "cg_dead", "DashDlq")
    dash = start_dashboard(namesrv.addr)
    page = rec.page
    with on_failure_dump(rec):
        page.goto(f"{dash.url}/group?g=cg_dead")
        page.locator("a", has_text="dead-letter queue").click()
        msg = page.locator("section.message")
        expect(msg).to_have_count(1)
        expect(msg.locator(".msg-keys")).to_have_text("poison-1")
        expect(msg.locator("pre.body-hex")).to_contain_text("00 01 70 6f 69 73 6f 6e")
        msg.locator("summary").click()
        expect(msg.locator("table.props")).to_contain_text("RETRY_TOPIC")
        rec.shot("dlq")
        msg.locator("button", has_text="Resend").click()
        expect(page.locator("#notice")).to_contain_text("resent to DashDlq: SEND_OK")
        rec.shot("dlq-resent")
        page.goto(f"{dash.url}/topic?t=DashDlq")
        expect(page.locator("main")).to_contain_text("2 message(s) stored")  # original + copy
        rec.shot("dlq-topic")
        page.goto(f"{dash.url}/dlq?g=nobody")
        expect(page.locator("#error")).to_contain_text("group nobody has no dead-letter queue")


async def _traced_send_and_consume(ns: str, topic: str) -> str:
    """One message sent and consumed with trace on (records written as the clients close)."""
    cfg = fast_config(ns, enable_trace=True)
    async with Producer("pg_traced", cfg) as p:
        sent = await p.send(Message(topic, b"traced", keys="traced-1"))
    done: set[str] = set()

    async def listener(msgs: list[MessageExt]) -> ConsumeStatus:
        done.update(m.msg_id for m in msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    c = PushConsumer(
        "cg_traced",
        cfg,
        listener=listener,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    c.subscribe(topic)
    async with c:
        await wait_until(lambda: sent.msg_id in done, total=30, what="traced message consumed")
    return sent.msg_id


def test_message_trace(
    cluster: str, start_dashboard: Callable[..., DashboardProc], rec: Recorder
) -> None:
    trio.run(create_topic, cluster, "DashTrace")
    msg_id = trio.run(_traced_send_and_consume, cluster, "DashTrace")
    dash = start_dashboard(cluster)
    page = rec.page
    with on_failure_dump(rec):
        page.goto(f"{dash.url}/messages?mode=id&topic=DashTrace&id={msg_id}")
        page.locator("section.message a.trace-link").click()
        expect(page.locator("#trace-msg-id")).to_have_text(msg_id)
        # The broker indexes the trace messages shortly after they are written: reload.
        for _ in range(100):
            if page.locator("#trace tr.trace-SubAfter").count():
                break
            page.wait_for_timeout(200)
            page.reload()
        pub = page.locator("#trace tr.trace-Pub")
        expect(pub).to_have_count(1)
        expect(pub).to_contain_text("pg_traced")
        expect(pub).to_contain_text("DashTrace")
        expect(pub).to_contain_text("traced-1")
        expect(page.locator("#trace tr.trace-SubAfter")).to_contain_text("cg_traced")
        expect(page.locator("#trace tr.trace-SubAfter")).to_contain_text("success")
        rec.shot("trace")
        page.goto(f"{dash.url}/trace?id={msg_id}&topic=NoTraceTopic")
        expect(page.locator("#error")).to_contain_text("no trace topic NoTraceTopic")
        rec.shot("trace-no-topic")


def test_brokers_of_a_running_cluster(
    namesrv: NamesrvProc,
    start_broker: StartBroker,
    start_dashboard: Callable[..., DashboardProc],
    rec: Recorder,
) -> None:
    a = start_broker(namesrv.addr, name="broker-a")
    b = start_broker(namesrv.addr, name="broker-b")
    dash = start_dashboard(namesrv.addr)
    page = rec.page
    with on_failure_dump(rec):
        _wait_registered(page, dash.url, 2)
        rows = page.locator("#brokers tr.broker")
        expect(rows).to_have_count(2)
        expect(rows.nth(0)).to_contain_text("broker-a")
        expect(rows.nth(0)).to_contain_text(a.addr)
        expect(rows.nth(1)).to_contain_text("broker-b")
        expect(rows.nth(1)).to_contain_text(b.addr)
        for i in range(2):
            expect(rows.nth(i)).to_contain_text("ASYNC_MASTER")
            expect(rows.nth(i)).to_contain_text("%")  # disk use
        rec.shot("cluster-two-brokers")


def test_login(cluster: str, start_dashboard: Callable[..., DashboardProc], rec: Recorder) -> None:
    dash = start_dashboard(
        cluster,
        env={"TRIMQ_DASHBOARD_USER": "ops", "TRIMQ_DASHBOARD_PASSWORD": "pa<ss>word"},
    )
    page = rec.page
    with on_failure_dump(rec):
        page.goto(f"{dash.url}/topics")
        expect(page).to_have_url(f"{dash.url}/login")
        page.locator("input[name=user]").fill("ops")
        page.locator("input[name=password]").fill("wrong")
        page.locator("button[type=submit]").click()
        expect(page.locator("#error")).to_have_text("wrong user or password")
        rec.shot("login-wrong")
        page.locator("input[name=user]").fill("ops")
        page.locator("input[name=password]").fill("pa<ss>word")
        page.locator("button[type=submit]").click()
        expect(page).to_have_url(f"{dash.url}/cluster")
        expect(page.locator("#brokers")).to_be_visible()
        rec.shot("login-ok")
        page.locator("nav form button").click()
        expect(page).to_have_url(f"{dash.url}/login")
        page.goto(f"{dash.url}/cluster")
        expect(page).to_have_url(f"{dash.url}/login")
