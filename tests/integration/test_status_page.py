"""The status page in a real headless Chromium (Selenium, Debian's chromium and chromium-driver) on real etcd and Traefik.

The page must load without a console error, show the live state and update it without a
reload, name a key that freezes Traefik, find an ingress among 10,000, and render values that
came from a push as inert text. A screenshot of each section is saved under the test's tmp dir.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from selenium.common.exceptions import NoAlertPresentException, NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By

from exporter.daemon import Daemon
from exporter.embedded import EmbeddedEtcd, EmbeddedTraefik, free_port
from exporter.etcd.client import EtcdClient
from tests.conftest import API_TOKEN, ROOT, settings_for
from tests.helpers import AUTHORITY, Backend, eventually, holds, uid

pytestmark = pytest.mark.integration
HEALTH = {"enable": True, "interval": 0.5, "max_retries": 1, "max_wait_time": 0.5, "initial_delay": 0}
MAX_LAG = 1.0
T = TypeVar("T")



@pytest.fixture(scope="module")
async def daemon(etcd: EmbeddedEtcd, traefik: EmbeddedTraefik) -> AsyncIterator[Daemon]:
    running = Daemon(settings_for(
        etcd.url, records_prefix=f"{uid('ui')}/records",
        api={"listen": f"127.0.0.1:{free_port()}", "token": API_TOKEN},
        control={"listen": f"127.0.0.1:{free_port()}"},
        traefik={"api_url": traefik.api, "max_lag": MAX_LAG, "poll_interval": 0.2},
    ))
    await running.start()
    await running.parts.reconciler.wait_synced(30)
    leadership = running.parts.leadership
    assert leadership is not None
    await eventually(lambda: holds(leadership.is_leader()), 30)  # the page's first test reads its role
    yield running
    await running.stop()


class Page:
    """The page as the browser sees it, and the daemon's APIs beside it."""

    def __init__(self, driver: Any, daemon: Daemon, http: aiohttp.ClientSession, shots: Path) -> None:
        self.driver, self.daemon, self.http, self.shots = driver, daemon, http, shots
        self.base = f"http://{daemon.settings.control.listen}"
        self.pushed: list[dict[str, Any]] = []

    async def push(self, *ingresses: dict[str, Any], path: str = "upsert") -> None:
        url = f"http://{self.daemon.settings.api.listen}/v2/ingress/{path}"
        async with self.http.post(url, json={"ingresses": list(ingresses)}, headers={"Authorization": f"Bearer {API_TOKEN}"}) as resp:
            assert resp.status == 204, await resp.text()
        if path == "upsert":
            self.pushed += [{"authority": i["authority"], "id": i["id"], "revision": i["revision"]} for i in ingresses]

    # The daemon answers in this test's event loop: every browser call runs in a thread.
    async def run(self, call: Callable[[], T]) -> T:
        return await asyncio.to_thread(call)

    async def open(self, path: str = "/") -> None:
        await self.run(lambda: self.driver.get(self.base + path))

    def text(self, css: str) -> str:
        """Text of the first element matching `css` (call through `run`).

        A live update may replace the element between finding and reading it: then it is read again.
        """
        for _ in range(5):
            try:
                return str(self.driver.find_element(By.CSS_SELECTOR, css).text)
            except StaleElementReferenceException:
                continue
        return str(self.driver.find_element(By.CSS_SELECTOR, css).text)

    async def errors(self) -> list[dict[str, Any]]:
        logs = await self.run(lambda: self.driver.get_log("browser"))
        return [e for e in logs if e["level"] == "SEVERE"]

    async def shot(self, name: str) -> None:
        await self.run(lambda: self.driver.save_screenshot(str(self.shots / f"{name}.png")))

    async def until(self, check: Callable[[], bool], timeout: float) -> float:
        """Poll a condition in the browser with a deadline; the seconds it took."""
        started = time.monotonic()

        def safe() -> bool:
            try:
                return check()
            except (StaleElementReferenceException, NoSuchElementException):
                return False  # replaced by a live update, or not rendered yet: look again

        async def shown() -> bool:
            return await self.run(safe)

        await eventually(shown, timeout=timeout, interval=0.1)
        return time.monotonic() - started


@pytest.fixture
async def page(browser: Any, daemon: Daemon, http: aiohttp.ClientSession, tmp_path: Path) -> AsyncIterator[Page]:
    p = Page(browser, daemon, http, tmp_path)
    await p.run(lambda: browser.get_log("browser"))  # the session's browser: what earlier pages logged is not this test's
    yield p
    for start in range(0, len(p.pushed), 1000):  # the request bound
        await p.push(*p.pushed[start : start + 1000], path="remove")


def ingress(iid: str, url: str, authority: str = AUTHORITY, **extra: Any) -> dict[str, Any]:
    return {"authority": authority, "id": iid, "revision": 1, "hosts": [f"{iid}.test"], "upstream": {"servers": [{"url": url}]}, **extra}


async def test_the_page_loads_clean_shows_the_live_state_and_a_dead_backend_turns_its_row_red(
    page: Page, backends: list[Backend]
) -> None:
    backend = await Backend("ui").start()
    backends.append(backend)
    iid = uid()
    await page.push(ingress(iid, backend.url, health_check=HEALTH))
    await page.open("/")
    assert await page.errors() == []
    assert await page.run(lambda: page.text('#overview [data-field="role"]')) == "leader"
    assert await page.run(lambda: page.text('#overview [data-field="etcd_reachable"]')) == "yes"
    row = f'#rows tr[data-key="{AUTHORITY}/{iid}"]'
    await page.until(lambda: "ok" in page.driver.find_element(By.CSS_SELECTOR, row).get_attribute("class"), 10)
    await page.until(lambda: page.text("#roots tr td.state") == "converged", 10)
    for section in ("overview", "convergence", "ingresses", "events"):
        await page.run(lambda: page.driver.find_element(By.ID, section).screenshot(str(page.shots / f"{section}.png")))
    await page.run(lambda: page.driver.execute_script("document.body.dataset.marker = 'no reload'"))
    await backend.stop()
    took = await page.until(lambda: "bad" in page.driver.find_element(By.CSS_SELECTOR, row).get_attribute("class"), 10)
    assert took <= HEALTH["interval"] + 2
    assert await page.run(lambda: page.driver.execute_script("return document.body.dataset.marker")) == "no reload"
    assert "out of rotation" in await page.run(lambda: page.text(f"{row} td.servers"))
    assert await page.errors() == []
    await page.shot("unhealthy")
    if target := os.environ.get("EXPORTER_DOCS_SCREENSHOT"):  # how docs/status-page.png is made
        shutil.copy(page.shots / "unhealthy.png", target)


async def test_a_key_traefik_cannot_decode_shows_the_root_frozen_with_the_key_named(
    page: Page, etcd_client: EtcdClient, backends: list[Backend]
) -> None:
    backend = await Backend("frozen").start()
    backends.append(backend)
    await page.push(ingress(uid(), backend.url))
    await page.open("/ui/convergence")
    # Earlier tests froze this Traefik too: its provider may still be backing off.
    await page.until(lambda: page.text("#roots tr td.state") == "converged", 30)
    bad = f"{ROOT}/http/routers/foreign-{uid()}/priority"
    await etcd_client.put(bad, "abc")
    try:
        await page.push(ingress(uid(), backend.url))
        await page.until(lambda: page.text("#roots tr td.state") == "frozen" and bad in page.text("#roots td.blocking"), 30)
        await page.shot("frozen")
    finally:
        await etcd_client.delete(bad)
    assert await page.errors() == []


async def test_values_from_a_push_render_as_inert_text(page: Page) -> None:
    hostile = "<img src=x onerror=alert(1)>"
    header = "</td><script>alert(1)</script>"
    iid = uid()
    upstream = {"kind": "ai-proxy-multi", "instances": [
        {"name": "a", "url": "http://127.0.0.1:9", "checks": {"headers": {"Authorization": header}}}]}
    await page.push({"authority": hostile, "id": iid, "revision": 1, "hosts": [f"{iid}.test"], "upstream": upstream})
    await page.open(f"/ui/ingresses?q={iid}")
    assert hostile in await page.run(lambda: page.text("#rows"))  # rendered by the server as text
    # ... and again by a live update (through textContent).
    await page.until(lambda: page.driver.execute_script("return document.body.dataset.updated") is not None, 5)
    assert hostile in await page.run(lambda: page.text("#rows"))
    assert await page.run(lambda: page.driver.find_elements(By.CSS_SELECTOR, "#rows img")) == []
    await page.run(lambda: page.driver.find_element(By.LINK_TEXT, iid).click())
    # The health-check header is redacted on the page (it may be a credential): neither run nor shown.
    assert "<redacted>" in await page.run(lambda: page.text("pre.record"))
    assert header not in await page.run(lambda: page.text("body"))
    with pytest.raises(NoAlertPresentException):
        await page.run(lambda: page.driver.switch_to.alert.text)
    assert await page.run(lambda: page.driver.find_elements(By.CSS_SELECTOR, "script:not([src])")) == []
    assert await page.errors() == []
    await page.shot("ingress")


async def test_the_search_box_finds_an_ingress_by_host_among_10000(page: Page) -> None:
    # Another authority's root: the session Traefik does not read it, so it stays fast.
    authority = uid("many")
    bodies = [ingress(f"i{n}", "http://127.0.0.1:9", authority=authority) for n in range(10_000)]
    for start in range(0, len(bodies), 1000):
        await page.push(*bodies[start : start + 1000])
    await page.open("/")

    def search() -> None:
        box = page.driver.find_element(By.CSS_SELECTOR, "#ingresses input[type=search]")
        box.send_keys("i7345.test")
        box.submit()

    await page.run(search)
    await page.until(lambda: "q=i7345.test" in page.driver.current_url, 10)
    keys = await page.run(lambda: [r.get_attribute("data-key") for r in page.driver.find_elements(By.CSS_SELECTOR, "#rows tr")])
    assert keys == [f"{authority}/i7345"]
    assert await page.run(lambda: page.text('#ingresses [data-field="total"]')) == str(len(page.daemon.parts.reconciler.records))
    await page.shot("search")
