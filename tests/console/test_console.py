"""The web console (docs/console.md) in a real browser against a real 3-broker cluster with
authentication on, and its refusals over plain HTTP.

The browser is Debian's headless Chromium driven by Selenium (chromium-driver; .ci/run installs
both). Each page loads with no console error, passes axe-core 4.9 (from selenium-axe-python, which
ships axe.min.js: nothing is fetched) including its colour-contrast rule, and is saved as a
screenshot under ARTIFACTS. The keyboard reaches the skip link, then the navigation, in order. A
record produced with the Python client appears in the record browser (text and hex) without
reloading the page; a consumer group appears with its counts; the charts draw from the
brokers' metrics; the API page runs Swagger UI from this broker alone. Last, one broker is
killed with SIGKILL: the cluster page shows it down, and the topic page a new leader for a
partition it led, each by the pages' own refresh.

Over HTTP: forged, foreign-key and expired session cookies, unknown tokens, missing CSRF
tokens, non-admins on admin forms, topics out of a principal's scope, a retired token, and bad
record-browser input each get a redirect or a clear error page, never a 500.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from laminar.client import AsyncClient
from laminar.credentials import add_principal, internal_token, retire_tokens
from laminar.local_cluster import LocalCluster
from laminar.log.batch import Record
from laminar.server.config import read_secret_file
from laminar.server.console.session import COOKIE_NAME, Sessions, session_key
from tests.integration.conftest import make_cluster, wait_until

pytestmark = pytest.mark.integration

#: Where the screenshots go (the CI log names the folder), as e2e/ keeps its artifacts.
ARTIFACTS = Path(
    os.environ.get("LAMINAR_CONSOLE_ARTIFACTS")
    or Path.home() / ".cache" / "laminar" / "artifacts" / "console"
)
TOPIC, PARTITIONS = "shop", 3
OTHER = "other"
WAIT_S = 60.0
NAV = ["Cluster", "Topics", "Records", "Charts", "API"]
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Console:
    cluster: LocalCluster
    tokens: dict[str, str]  # principal -> token
    credentials: Path
    cluster_id: str

    @property
    def entry(self) -> str:
        """The broker the browser uses (never the one killed)."""
        return self.cluster.urls[0]

    def sessions(self, ttl_s: int = 3600) -> Sessions:
        """Sessions signed as the brokers sign them (the key from the cluster secret)."""
        secret = read_secret_file(str(self.cluster.secret_path()))
        return Sessions(session_key(secret, self.cluster_id), ttl_s)


async def _setup(cluster: LocalCluster) -> str:
    async with AsyncClient(cluster.urls, token=cluster.token) as client:
        for name, partitions in ((TOPIC, PARTITIONS), (OTHER, 1)):
            await client.create_topic(name, partitions=partitions, replication_factor=3)
            await client.wait_for_leaders(name)
        return (await client.cluster()).cluster_id


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    path = tmp_path_factory.mktemp("console")
    credentials = LocalCluster(path, 3).credentials_path()
    tokens = {
        "reader": add_principal(credentials, "reader", ["consumer"], [f"{TOPIC}*"]),
        "writer": add_principal(credentials, "writer", ["producer"], [f"{TOPIC}*"]),
        "rotating": add_principal(credentials, "rotating", ["consumer"], [TOPIC]),
    }
    tokens["rotating-new"] = add_principal(credentials, "rotating")
    cluster = make_cluster(path)
    tokens["admin"] = cluster.token
    try:
        cluster_id = asyncio.run(_setup(cluster))
        yield Console(cluster, tokens, credentials, cluster_id)
    finally:
        cluster.stop()


# ---- plain HTTP ----------------------------------------------------------------------------


async def _login(session: aiohttp.ClientSession, base: str, token: str) -> aiohttp.ClientResponse:
    async with session.post(
        base + "/console/login", data={"token": token}, allow_redirects=False
    ) as response:
        await response.read()
        return response


async def _page(
    session: aiohttp.ClientSession, url: str, cookie: str | None = None
) -> tuple[int, str, Any]:
    headers = {"Cookie": f"{COOKIE_NAME}={cookie}"} if cookie else {}
    async with session.get(url, headers=headers, allow_redirects=False) as response:
        return response.status, await response.text(), response.headers


def _cookie(response: aiohttp.ClientResponse) -> str:
    morsel = response.cookies[COOKIE_NAME]
    assert morsel["httponly"] and morsel["samesite"] == "Strict" and morsel["path"] == "/"
    assert not morsel["secure"]  # (this cluster serves plain HTTP; with TLS it is Secure)
    return morsel.value


async def test_pages_need_a_session_and_bad_cookies_go_to_the_login(console: Console) -> None:
    base = console.entry
    now = time.time()
    forged = console.sessions().issue("admin", console.tokens["admin"], now)
    payload, mac = forged.rsplit(".", 1)
    foreign = Sessions(session_key(b"another secret of 32 bytes or more!!", console.cluster_id))
    bad_cookies = {
        "none": None,
        "garbage": "not a session",
        "a changed signature": payload + "." + ("A" if mac[0] != "A" else "B") + mac[1:],
        "another cluster's key": foreign.issue("admin", console.tokens["admin"], now),
        "expired": console.sessions(ttl_s=-1).issue("admin", console.tokens["admin"], now),
        "a principal that does not exist": console.sessions().issue("nobody", "x" * 20, now),
        "another principal's token": console.sessions().issue(
            "admin", console.tokens["reader"], now
        ),
    }
    async with aiohttp.ClientSession() as session:
        for what, cookie in bad_cookies.items():
            for path in ("/console/cluster", "/console/topics", f"/console/topics/{TOPIC}"):
                status, _, headers = await _page(session, base + path, cookie)
                assert status == 303 and headers["Location"] == "/console/login", (what, path)
        status, _, headers = await _page(session, base + "/")
        assert status == 303 and headers["Location"] == "/console/cluster"
        async with session.get(base + "/console/api/rates") as response:
            assert response.status == 401
        # a session the test signs with the cluster's key is one (the brokers share the key)
        status, text, headers = await _page(session, base + "/console/cluster", forged)
        assert status == 200 and "Members" in text
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
        assert "default-src 'self'" in headers["Content-Security-Policy"]


async def test_login_works_through_any_broker(console: Console) -> None:
    async with aiohttp.ClientSession() as session:
        wrong = await _login(session, console.entry, "lmq_" + "w" * 43)
        assert wrong.status == 401 and COOKIE_NAME not in wrong.cookies
        status, text, _ = await _page(session, console.entry + "/console/login")
        assert status == 200 and 'type="password"' in text
        response = await _login(session, console.entry, console.tokens["admin"])
        assert response.status == 303 and response.headers["Location"] == "/console/cluster"
        cookie = _cookie(response)
        for base in console.cluster.urls:  # any broker accepts any broker's session
            status, text, _ = await _page(session, base + "/console/cluster", cookie)
            assert status == 200 and 'id="member-n3"' in text, base


async def test_a_wrong_token_is_refused_and_logins_are_limited(console: Console) -> None:
    base = console.cluster.urls[2]  # (the limiter is per broker: the others stay usable)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            base + "/console/login", data={"token": "lmq_" + "z" * 43}, allow_redirects=False
        ) as response:
            text = await response.text()
            assert response.status == 401 and COOKIE_NAME not in response.cookies
            assert "That token is not known." in text
        statuses = []
        for _ in range(30):  # (bounded: the limiter allows 10 in a burst)
            answered = await _login(session, base, "lmq_" + "z" * 43)
            statuses.append(answered.status)
            if answered.status == 429:
                assert int(answered.headers["Retry-After"]) >= 1
                break
        assert statuses[-1] == 429 and set(statuses[:-1]) == {401}, statuses
        refused = await _login(session, base, console.tokens["admin"])
        assert refused.status == 429  # even the right one, until the allowance comes back
        other = console.cluster.urls[1]
        for content_type, body in (
            ("multipart/form-data", b"token=x"),  # (no boundary)
            ("application/json", b'{"token": "x"}'),
            ("application/x-www-form-urlencoded", b"token=%ff%fe&token"),
        ):
            async with session.post(
                other + "/console/login", data=body, headers={"Content-Type": content_type},
                allow_redirects=False,
            ) as response:  # fmt: skip
                assert response.status == 401, (content_type, await response.text())
    assert console.tokens["admin"] not in console.cluster.tail("n3", 2000)


async def test_a_login_from_another_sites_page_is_refused(console: Console) -> None:
    """Login CSRF: a page elsewhere posting a token of its own would log the victim's browser
    in as someone else. Refused by Sec-Fetch-Site, or Origin where a browser sends no
    Sec-Fetch-Site; the console's own form, and clients that are not browsers, log in."""
    base = console.cluster.urls[0]
    token = console.tokens["admin"]
    async with aiohttp.ClientSession() as session:
        for headers in (
            {"Sec-Fetch-Site": "cross-site", "Origin": "https://elsewhere.example"},
            {"Sec-Fetch-Site": "same-site", "Origin": "https://console.elsewhere.example"},
            {"Origin": "https://elsewhere.example"},
            {"Origin": "null"},
        ):
            async with session.post(
                base + "/console/login", data={"token": token}, headers=headers,
                allow_redirects=False,
            ) as response:  # fmt: skip
                text = await response.text()
                assert response.status == 403, (headers, response.status, text)
                assert COOKIE_NAME not in response.cookies and "is refused" in text, headers
        for headers in ({"Sec-Fetch-Site": "same-origin", "Origin": base}, {"Origin": base}, {}):
            async with session.post(
                base + "/console/login", data={"token": token}, headers=headers,
                allow_redirects=False,
            ) as response:  # fmt: skip
                await response.read()
                assert response.status == 303 and COOKIE_NAME in response.cookies, headers


async def _csrf(session: aiohttp.ClientSession, base: str, cookie: str) -> str:
    status, text, _ = await _page(session, base + "/console/cluster", cookie)
    assert status == 200
    found = CSRF.search(text)
    assert found is not None
    return found[1]


async def test_admin_forms_need_an_admin_and_the_csrf_token(console: Console) -> None:
    base = console.entry
    async with (
        aiohttp.ClientSession() as session,
        AsyncClient(console.cluster.urls, token=console.tokens["admin"]) as client,
    ):
        reader = _cookie(await _login(session, base, console.tokens["reader"]))
        status, text, _ = await _page(session, base + "/console/cluster", reader)
        assert status == 200 and 'id="member-n2"' in text
        assert "/console/nodes/" not in text and ">Drain " not in text  # (no admin form)
        token = await _csrf(session, base, reader)  # (its logout form's)
        headers = {"Cookie": f"{COOKIE_NAME}={reader}"}
        async with session.post(
            base + "/console/nodes/n2/drain", data={"csrf": token}, headers=headers,
            allow_redirects=False,
        ) as response:  # fmt: skip
            assert response.status == 403 and "is not an admin" in await response.text()
        admin = _cookie(await _login(session, base, console.tokens["admin"]))
        headers = {"Cookie": f"{COOKIE_NAME}={admin}"}
        for data in ({}, {"csrf": "forged"}, {"csrf": token}):  # (the reader's is not ours)
            async with session.post(
                base + "/console/nodes/n2/drain", data=data, headers=headers,
                allow_redirects=False,
            ) as response:  # fmt: skip
                assert response.status == 403, data
                assert "CSRF" in await response.text()
        assert not next(m for m in (await client.cluster()).members if m.id == "n2").draining
        token = await _csrf(session, base, admin)
        async with session.post(
            base + "/console/nodes/nobody/drain", data={"csrf": token}, headers=headers,
            allow_redirects=False,
        ) as response:  # fmt: skip
            assert response.status == 404
        for action, draining in (("drain", True), ("undrain", False)):
            async with session.post(
                base + f"/console/nodes/n2/{action}", data={"csrf": token}, headers=headers,
                allow_redirects=False,
            ) as response:  # fmt: skip
                assert response.status == 303, await response.text()
            # the page it redirects to shows the change (the entry broker applied it first)
            status, text, _ = await _page(session, base + "/console/cluster", admin)
            row = text[text.index('id="member-n2"') :].split("</tr>", 1)[0]
            assert status == 200 and ('<span class="marker">draining</span>' in row) is draining

            async def shown(draining: bool = draining) -> bool:
                """(The client's broker, maybe another, applies it a moment after the leader.)"""
                members = (await client.cluster()).members
                return next(m for m in members if m.id == "n2").draining is draining

            await wait_until(f"n2 shown {action}ed", shown)
        async with session.post(
            base + "/console/logout", data={"csrf": token}, headers=headers,
            allow_redirects=False,
        ) as response:  # fmt: skip
            assert response.status == 303 and response.cookies[COOKIE_NAME].value == ""


async def test_pages_show_what_the_principal_may_see(console: Console) -> None:
    base = console.entry
    async with aiohttp.ClientSession() as session:
        writer = _cookie(await _login(session, base, console.tokens["writer"]))
        reader = _cookie(await _login(session, base, console.tokens["reader"]))
        status, text, _ = await _page(session, base + "/console/topics", writer)
        assert status == 200 and f">{TOPIC}<" in text and OTHER not in text
        assert f"/console/topics/{TOPIC}/groups" not in text  # (no consume: no groups link)
        status, text, _ = await _page(session, base + f"/console/topics/{TOPIC}", writer)
        assert status == 200 and 'data-partition="2"' in text
        for cookie, path in (
            (writer, f"/console/records?topic={TOPIC}&partition=0"),
            (writer, f"/console/topics/{TOPIC}/groups"),
            (reader, f"/console/records?topic={OTHER}&partition=0"),
            (reader, f"/console/topics/{OTHER}"),
        ):
            status, text, _ = await _page(session, base + path, cookie)
            assert status == 403 and "may not" in text, (path, status)
        status, text, _ = await _page(session, base + "/console/records", writer)
        assert status == 200 and "No topic you may read." in text


async def test_bad_record_browser_input_is_a_clear_400(console: Console) -> None:
    base = console.entry
    records = base + f"/console/records?topic={TOPIC}"
    cases = {
        "&partition=-1": "not a non-negative whole number",
        "&partition=3": "out of range: it must be 0 to 2",
        "&partition=x": "not a non-negative whole number",
        "&partition=0&from=-5": "not a non-negative whole number",
        "&partition=0&from=1e3": "not a non-negative whole number",
        "&partition=0&from=99999999999999999999": "not a non-negative whole number",
        "&partition=0&max=0": "out of range: it must be 1 to 200",
        "&partition=0&max=201": "out of range",
        "&partition=%D9%A3": "not a non-negative whole number",  # an Arabic-Indic digit
    }
    async with aiohttp.ClientSession() as session:
        admin = _cookie(await _login(session, base, console.tokens["admin"]))
        for query, message in cases.items():
            status, text, _ = await _page(session, records + query, admin)
            assert status == 400 and message in text, (query, status, text[-600:])
            assert '<form class="browse"' in text  # (the form, to correct it)
        status, text, _ = await _page(
            session, base + "/console/records?topic=bad%20name!&partition=0", admin
        )
        assert status == 400 and "must match" in text
        status, text, _ = await _page(session, base + "/console/records?topic=nope", admin)
        assert status == 404 and "no topic nope" in text
        status, text, _ = await _page(session, base + "/console/topics/nope/groups", admin)
        assert status == 404
        status, _, _ = await _page(session, base + "/console/static/..%2Fsession.py", admin)
        assert status == 404


async def test_a_retired_token_ends_its_sessions(console: Console) -> None:
    base = console.entry
    async with aiohttp.ClientSession() as session:
        old = _cookie(await _login(session, base, console.tokens["rotating"]))
        new = _cookie(await _login(session, base, console.tokens["rotating-new"]))
        status, _, _ = await _page(session, base + f"/console/topics/{TOPIC}", old)
        assert status == 200
        assert retire_tokens(console.credentials, "rotating", keep=1) == 1
        for pid in console.cluster.serving_pids().values():
            os.kill(pid, signal.SIGHUP)  # (re-read the credentials at once)

        async def refused() -> bool:
            status, _, headers = await _page(session, base + "/console/cluster", old)
            return status == 303 and headers["Location"] == "/console/login"

        await wait_until("the retired token's session to end", refused, 30)
        status, _, _ = await _page(session, base + f"/console/topics/{TOPIC}", new)
        assert status == 200


async def test_the_brokers_groups_endpoint_is_theirs_alone(console: Console) -> None:
    url = console.entry + f"/console/internal/groups?topic={TOPIC}"
    secret = read_secret_file(str(console.cluster.secret_path()))
    internal = internal_token(secret, console.cluster_id)
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as response:
            assert response.status == 401
        admin = {"Authorization": f"Bearer {console.tokens['admin']}"}
        async with session.get(url, headers=admin) as response:
            assert response.status == 403
        brokers = {"Authorization": f"Bearer {internal}"}
        async with session.get(url, headers=brokers) as response:
            assert response.status == 200 and (await response.json())["node"] == "n1"
        async with session.get(url.replace(TOPIC, "bad!"), headers=brokers) as response:
            assert response.status == 400


async def test_the_openapi_document_is_served(console: Console) -> None:
    import yaml

    spec = Path(__file__).resolve().parents[2] / "broker/laminar/server/openapi.yaml"
    async with aiohttp.ClientSession() as session:
        async with session.get(console.entry + "/openapi.yaml") as response:
            assert response.status == 200 and await response.read() == spec.read_bytes()
        async with session.get(console.entry + "/openapi.json") as response:
            assert response.status == 200
            assert await response.json() == yaml.safe_load(spec.read_text())


async def test_with_allow_anonymous_the_console_opens_as_the_anonymous_admin(
    tmp_path: Path,
) -> None:
    cluster = make_cluster(tmp_path / "open", 1, extra_args=("--allow-anonymous",))
    try:
        async with aiohttp.ClientSession() as session:
            status, text, headers = await _page(session, cluster.urls[0] + "/console/cluster")
            assert status == 200 and "anonymous (admin)" in text and "Drain n1" in text
            assert COOKIE_NAME in headers["Set-Cookie"]  # (a session: the forms' CSRF token)
    finally:
        cluster.stop()


# ---- the browser ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium  # (given, with the driver: Selenium fetches nothing)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # (as root, in CI)
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--no-first-run",
        "--disable-background-networking",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield driver
    finally:
        driver.quit()


def eventually(what: str, check: Callable[[], object], timeout_s: float = WAIT_S) -> None:
    """Poll `check` (a page in the browser) until it returns True."""
    from selenium.common.exceptions import WebDriverException

    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except WebDriverException as e:  # (an element swapped by a refresh meanwhile)
            last = e
        if last is True:
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def console_errors(driver: Any) -> list[dict[str, Any]]:
    """The browser's console errors since the last look."""
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def check_page(driver: Any, name: str) -> None:
    """A screenshot; no axe-core violation (colour contrast included); no console error."""
    from selenium_axe_python import Axe

    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))  # (before axe scrolls the page)
    axe = Axe(driver)
    axe.inject()
    results = axe.run()
    assert results["violations"] == [], (name, axe.report(results["violations"]))
    assert console_errors(driver) == [], name


def text_of(driver: Any, selector: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, selector).text)


def log_in(driver: Any, console: Console) -> None:
    from selenium.webdriver.common.by import By

    driver.get(console.entry + "/")
    assert urlsplit(driver.current_url).path == "/console/login"
    check_page(driver, "login")
    driver.find_element(By.ID, "token").send_keys(console.tokens["admin"])
    driver.find_element(By.CSS_SELECTOR, "form.login button").click()
    eventually("the cluster page", lambda: urlsplit(driver.current_url).path == "/console/cluster")


def test_every_page_in_the_browser(console: Console, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    base = console.entry
    log_in(driver, console)
    assert text_of(driver, "h1") == "Cluster"
    check_page(driver, "cluster")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#members tbody tr")) == 3
    assert driver.find_elements(By.CSS_SELECTOR, "form[action='/console/nodes/n2/drain']")
    for path, name, heading in (
        ("/console/topics", "topics", "Topics"),
        (f"/console/topics/{TOPIC}", "topic", f"Topic {TOPIC}"),
        ("/console/records", "records-form", "Records"),
    ):
        driver.get(base + path)
        assert text_of(driver, "h1") == heading
        check_page(driver, name)
    driver.get(base + f"/console/topics/{TOPIC}")
    rows = driver.find_elements(By.CSS_SELECTOR, "#partitions tbody tr")
    assert [r.get_attribute("data-partition") for r in rows] == ["0", "1", "2"]
    assert all(r.get_attribute("data-leader") in console.cluster.nodes for r in rows)


def test_keyboard_reaches_the_skip_link_then_the_navigation(console: Console, browser: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    driver = browser
    driver.get(console.entry + "/console/topics")
    focused, outlines = [], []
    for _ in range(1 + len(NAV)):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        focused.append(driver.execute_script("return document.activeElement.textContent.trim()"))
        outlines.append(
            driver.execute_script("return getComputedStyle(document.activeElement).outlineStyle")
        )
    assert focused == ["Skip to content", *NAV]
    assert "none" not in outlines  # (the focus shows)
    for _ in range(len(NAV)):
        ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
    assert driver.execute_script("return document.activeElement.className") == "skip-link"
    ActionChains(driver).send_keys(Keys.ENTER).perform()
    assert driver.execute_script("return document.activeElement.id") == "main"


def _append(console: Console, records: list[Record]) -> int:
    async def append() -> int:
        async with AsyncClient(console.cluster.urls, token=console.tokens["admin"]) as client:
            return (await client.append(TOPIC, 0, records)).base_index

    return asyncio.run(append())


def test_a_produced_record_appears_in_the_record_browser(console: Console, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    start = _append(console, [Record(value=b"before")]) + 1
    driver.get(console.entry + f"/console/records?topic={TOPIC}&partition=0&from={start}")
    assert "No records from index" in text_of(driver, "#records-data")
    base = _append(
        console,
        [
            Record(key=b"order-7", value=b"<b>paid</b> 12 EUR", headers=(("trace", b"t-1"),)),
            Record(key=None, value=b"\x00\x9f\xff", headers=(("raw", b"\xfe"),)),
        ],
    )
    row = f"#records tr[data-index='{base}']"
    eventually(  # the page's own refresh, no reload
        "the record in the browser",
        lambda: bool(driver.find_elements(By.CSS_SELECTOR, row)),
    )
    cells = [c.text for c in driver.find_elements(By.CSS_SELECTOR, f"{row} td")]
    assert cells[1:] == ["order-7", "<b>paid</b> 12 EUR", "trace: t-1"], cells
    assert not driver.find_elements(By.CSS_SELECTOR, "#records b")  # (shown, not markup)
    binary = f"#records tr[data-index='{base + 1}'] td"
    cells = [c.text for c in driver.find_elements(By.CSS_SELECTOR, binary)]
    assert cells[1:] == ["(none)", "hex 00 9f ff", "raw: hex fe"], cells
    check_page(driver, "records")


def test_consumer_groups_show_their_counts(console: Console, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    async def acquire() -> dict[int, int]:
        async with AsyncClient(console.cluster.urls, token=console.tokens["admin"]) as client:
            held = {}
            for partition in range(PARTITIONS):  # (partitions led by every broker)
                await client.append(TOPIC, partition, [Record(value=b"job")])
                got = await client.acquire(
                    TOPIC, partition, "billing", max_messages=1, lease_ms=600_000
                )
                held[partition] = len(got.messages)
            return held

    held = asyncio.run(acquire())
    driver = browser
    driver.get(console.entry + f"/console/topics/{TOPIC}/groups")
    for partition in range(PARTITIONS):
        row = f"#groups tr[data-group='billing'][data-partition='{partition}']"
        cells = [c.text for c in driver.find_elements(By.CSS_SELECTOR, f"{row} td")]
        assert cells, (partition, text_of(driver, "main"))
        acquired, lag = int(cells[2]), int(cells[-1])
        assert acquired == held[partition] == 1 and lag >= acquired, cells
    check_page(driver, "groups")


def test_the_charts_draw_from_the_brokers_metrics(console: Console, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(console.entry + "/console/charts")
    _append(console, [Record(value=b"tick")])
    eventually(
        "two points of the charts",
        lambda: int(driver.find_element(By.ID, "charts").get_attribute("data-samples") or 0) >= 2,
    )
    assert driver.find_elements(By.CSS_SELECTOR, "#chart-rates polyline")
    assert "published" in text_of(driver, "#rates-latest")
    assert "3 brokers" in text_of(driver, "#rates-latest")
    check_page(driver, "charts")


def test_the_api_page_loads_swagger_ui_from_the_broker_alone(
    console: Console, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(console.entry + "/console/api-docs")
    eventually(
        "Swagger UI",
        lambda: (
            "Laminar broker HTTP API"
            in "".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, ".swagger-ui .title"))
        ),
    )
    assert driver.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    urls = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert any(u.endswith("/openapi.json") for u in urls), urls
    hosts = {urlsplit(u).hostname for u in [*urls, driver.current_url]}
    assert all(ipaddress.ip_address(h).is_loopback for h in hosts if h), hosts
    check_page(driver, "api")


def test_a_killed_broker_shows_down_and_its_partitions_a_new_leader(
    console: Console, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    cluster = console.cluster

    async def leaders() -> dict[int, str | None]:
        async with AsyncClient(cluster.urls, token=console.tokens["admin"]) as client:
            described = await client.describe_topic(TOPIC)
            return {p.partition: p.leader for p in described.partition_states}

    led = {p: leader for p, leader in asyncio.run(leaders()).items() if leader != "n1"}
    if not led:  # (all led by the entry broker, which stays: hand some over)

        async def hand_off() -> bool:
            async with AsyncClient(cluster.urls, token=console.tokens["admin"]) as client:
                await client.handoff("n1")
            return any(leader != "n1" for leader in (await leaders()).values())

        asyncio.run(wait_until("a partition led elsewhere than n1", hand_off))
        led = {p: leader for p, leader in asyncio.run(leaders()).items() if leader != "n1"}
    partition, victim = next((p, leader) for p, leader in sorted(led.items()) if leader)
    driver = browser
    driver.get(console.entry + "/console/cluster")
    row = f"#member-{victim}"
    assert driver.find_element(By.CSS_SELECTOR, row).get_attribute("data-state") == "alive"
    cluster.kill(victim)
    eventually(  # by the page's refresh (no reload)
        f"{victim} shown down",
        lambda: (
            "DOWN" in text_of(driver, row)
            and driver.find_element(By.CSS_SELECTOR, row).get_attribute("data-state") != "alive"
        ),
    )
    check_page(driver, "cluster-broker-down")
    driver.get(console.entry + f"/console/topics/{TOPIC}")
    cell = f"#partitions tr[data-partition='{partition}']"
    eventually(
        f"partition {partition} led by another broker than {victim}",
        lambda: (
            driver.find_element(By.CSS_SELECTOR, cell).get_attribute("data-leader")
            not in ("", victim)
        ),
    )
    check_page(driver, "topic-new-leader")
