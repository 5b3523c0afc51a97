"""The Volcano Credentials block as a user meets it: the Prefect UI's create form, in a real browser.

The session harness serves the API only (an ephemeral server has no UI), so this module starts a
`prefect server start` of its own, with the UI, on a free port and a private database. Skipped, with
the reason, where Playwright or Debian's chromium is missing (CI installs `chromium`).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prefect_volcano import SKIPPED_TAG
from tests.prefect.helpers import prefect_server

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "images"
SERVICE_KEY = "sk-demo-not-a-real-key-7f3a9c"  # what a user types; must never show again

playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not CHROMIUM.exists():
    pytest.skip(f"no browser: {CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def prefect_ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prefect server with its UI; yields the base URL."""
    home = tmp_path_factory.mktemp("prefect-ui-home")
    try:
        with prefect_server(home, services=False, start_timeout=600) as base:
            # The server registers installed collections' blocks at startup (prefect.collections entry point).
            slugs = [b["slug"] for b in httpx.post(f"{base}/api/block_types/filter", json={}).json()]
            assert "volcano-credentials" in slugs
            yield base
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_create_form_fields_and_the_saved_key_is_masked(prefect_ui: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 820})
            page.goto(f"{prefect_ui}/blocks/catalog/volcano-credentials/create", wait_until="networkidle")
            form = page.locator("form")
            form.get_by_text("Service key").wait_for()  # the form renders after the network settles
            labels = form.locator("label").all_inner_texts()
            assert labels[:3] == ["Block Name", "API URL (Optional)", "Service key"]
            assert "Timeout (Optional)" in labels
            text = form.inner_text()
            for described in (
                "Base URL of the Volcano API",
                "The project's service-role key; lock calls authenticate with it.",
                "Anon key",
                "Seconds allowed for each HTTP request to the locks API.",
            ):
                assert described in text
            api_url, service_key = form.locator("textarea").nth(0), form.locator("textarea").nth(1)
            assert api_url.input_value() == "https://api.volcano.dev"  # the default, filled in
            page.screenshot(path=str(SCREENSHOTS / "prefect-volcano-credentials-form.png"))

            form.locator("input[type=text]").first.fill("volcano")
            api_url.fill("http://127.0.0.1:8000")
            service_key.fill(SERVICE_KEY)
            page.get_by_role("button", name="Create").click()
            page.get_by_text("Block created successfully").first.wait_for(timeout=20_000)

            saved = httpx.post(f"{prefect_ui}/api/block_documents/filter", json={}).json()
            (block,) = [b for b in saved if b["name"] == "volcano"]
            assert block["data"] == {"api_url": "http://127.0.0.1:8000", "service_key": "********"}

            page.goto(f"{prefect_ui}/blocks/block/{block['id']}", wait_until="networkidle")
            page.get_by_text("Service key").first.wait_for()
            shown = page.locator("body").inner_text()
            assert "Service key\n********" in shown and "http://127.0.0.1:8000" in shown
            assert SERVICE_KEY not in page.content()
            page.screenshot(path=str(SCREENSHOTS / "prefect-volcano-credentials-saved.png"))
        finally:
            browser.close()


def test_v2_create_form_fields_and_the_saved_key_is_masked(prefect_ui: str) -> None:
    """The same in the UI a Prefect 3.9 user meets first (V2, its default)."""
    import uuid

    name = f"volcano-v2-{uuid.uuid4().hex[:6]}"
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{prefect_ui}/", wait_until="networkidle")
            assert page.url.startswith(f"{prefect_ui}/v2"), page.url  # where a new browser lands
            _fill_create_form(page, prefect_ui, "v2", name, api_url="http://127.0.0.1:8000")
            (block,) = _saved(prefect_ui, name)
            assert block["data"]["service_key"] == "********"
            page.goto(f"{prefect_ui}/v2/blocks/block/{block['id']}", wait_until="networkidle")
            page.get_by_text("http://127.0.0.1:8000").first.wait_for(timeout=20_000)
            assert SERVICE_KEY not in page.content()
            page.screenshot(path=str(SCREENSHOTS / "prefect-volcano-credentials-saved-v2.png"))
            page.goto(f"{prefect_ui}/v2/blocks/catalog/volcano-credentials/create", wait_until="networkidle")
            form = page.locator("form")
            form.get_by_text("Service key").wait_for()
            text = form.inner_text()
            for described in (
                "Name",
                "API URL (Optional)",
                "without a scheme: https, or http for localhost",
                "Waiting budget (Optional)",
                "Timeout (Optional)",
            ):
                assert described in text, described
            page.screenshot(path=str(SCREENSHOTS / "prefect-volcano-credentials-form-v2.png"))
        finally:
            browser.close()


def _row(page: Any, name: str) -> str:
    """The text of the innermost list row showing run `name` with its state."""
    rows = page.locator("div, li, tr", has_text=name).filter(has_text=re.compile("Completed|Running"))
    return str(rows.last.inner_text())


def _dashboard_row(page: Any, state: str, name: str) -> str:
    """The dashboard's row of run `name`: its Flow Runs card's tab for `state`, the flow's list opened."""
    card = page.locator(".p-tabs.flow-run-state-type-tabs")
    card.locator(".p-tab").filter(has=page.locator(f".bg-state-{state}-500")).first.click()
    header = page.locator(".flow-runs-accordion-header").first
    header.wait_for(timeout=20_000)
    if not page.get_by_text(name).count():
        header.click()  # the flow's runs are folded under its name
    page.get_by_text(name).first.wait_for(timeout=20_000)
    return _row(page, name)


def _v2_dashboard_row(page: Any, state: str, name: str) -> str:
    """The V2 dashboard's row of run `name`: its Flow Runs card's tab for `state`, the flow opened."""
    tab = page.get_by_role("tab").filter(has=page.locator(f"[class*='bg-state-{state}-']")).first
    tab.click()
    trigger = page.locator("[data-slot=accordion-trigger]").first
    trigger.wait_for(timeout=20_000)
    if trigger.get_attribute("aria-expanded") != "true":
        trigger.locator("span").last.click()  # the run count: the flow's name is a link to its page
    page.get_by_text(name).first.wait_for(timeout=20_000)
    return _row(page, name)


def _after_the_minute_of(runs: list[dict[str, Any]]) -> float:
    """Seconds until the minute after the runs' latest expected start has begun: V2's dashboard asks
    for runs expected before the current minute's start, so a run shows there from the next minute."""
    import datetime

    latest = max(datetime.datetime.fromisoformat(r["expected_start_time"]) for r in runs)
    shown_from = latest.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1, seconds=1)
    return max(0.0, (shown_from - datetime.datetime.now(datetime.UTC)).total_seconds())


def _saved(base: str, name: str) -> list[dict[str, Any]]:
    return [b for b in httpx.post(f"{base}/api/block_documents/filter", json={}).json() if b["name"] == name]


UIS = {"v1": "", "v2": "/v2"}
"""The path prefix of each UI Prefect 3.9 serves. Its root sends a browser without a saved choice to
V2 (`server.ui.v2_enabled`, default true); V1 stays one click away ("Switch to V1 UI") and is the UI
of Prefect 3.7. The two build their block forms differently, so each is tried."""


def _shot(name: str, ui: str) -> str:
    """Where a screenshot of UI `ui` goes: V1's keep their names, V2's end in `-v2`."""
    return str(SCREENSHOTS / f"{name}{'' if ui == 'v1' else '-v2'}.png")


def _fill_create_form(
    page: Any,
    base: str,
    ui: str,
    name: str,
    *,
    api_url: str | None = None,
    service_key: str = SERVICE_KEY,
    timeout: str | None = None,
    budget: str | None = None,
) -> Any:
    """Fill Prefect's create form for the block in UI `ui` and press its button; returns the form."""
    page.goto(f"{base}{UIS[ui]}/blocks/catalog/volcano-credentials/create", wait_until="networkidle")
    form = page.locator("form")
    form.get_by_text("Service key").wait_for()  # the form renders after the network settles
    form.locator("input").first.fill(name)  # the block's name comes first in both
    if api_url is not None:
        form.locator("textarea").nth(0).fill(api_url)
    # V1 shows the key in a textarea (masked once saved); V2 in a password input.
    (form.locator("textarea").nth(1) if ui == "v1" else form.locator("input[type=password]")).fill(
        service_key
    )
    if timeout is not None:  # the first number input: the timeout comes before the budget
        form.locator("input[type=number]").first.fill(timeout)
    if budget is not None:
        if ui == "v2":  # V2 shows an optional integer as a choice of "int" or "None"
            form.get_by_text("int", exact=True).click()
        form.locator("input[type=number]").last.fill(budget)
    page.get_by_role("button", name="Create" if ui == "v1" else "Save").click()
    page.wait_for_timeout(1500)  # time for a (wrong) save to land; the form's own check is at once
    return form


def _refusal(form: Any, ui: str, field: str) -> str:
    """What the form says of a refused field: V1 writes it under the field; V2's number input has the
    browser's own check (the schema's `minimum` is its `min`), whose message the browser shows."""
    if ui == "v1":
        return str(form.inner_text())
    number = form.locator("input[type=number]")
    return str((number.first if field == "timeout" else number.last).evaluate("e => e.validationMessage"))


@pytest.mark.parametrize("ui", UIS)
@pytest.mark.parametrize(("field", "bound"), [("budget", "1"), ("timeout", "0.1")])
def test_the_form_refuses_a_waiting_budget_or_timeout_of_0(
    prefect_ui: str, ui: str, field: str, bound: str
) -> None:
    """Both forms check a number against the schema's `minimum` (V1 in its own rules, V2 through the
    input's `min`): a budget or a timeout of 0, which could never load, is refused and nothing saved."""
    import uuid

    name = f"refused-{field}-{ui}-{uuid.uuid4().hex[:6]}"
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            form = _fill_create_form(page, prefect_ui, ui, name, **{field: "0"})
            assert _saved(prefect_ui, name) == []
            said = _refusal(form, ui, field)
            assert f"greater than or equal to {bound}" in said, said
            if field == "budget":
                page.screenshot(path=_shot("prefect-volcano-credentials-refused-budget", ui))
            _fill_create_form(page, prefect_ui, ui, name, **{field: bound})  # the bound itself saves
            assert len(_saved(prefect_ui, name)) == 1
        finally:
            browser.close()


@pytest.mark.parametrize("ui", UIS)
def test_a_url_without_a_scheme_saved_by_the_form_loads_and_takes_a_lock(
    prefect_ui: str, ui: str, volcano_server: Any
) -> None:
    """Neither form checks a URL's shape (V1's rules are bounds and lengths; V2 sends the values in
    place of the schema to Prefect's validate endpoint, so nothing is checked), so whatever the form
    saves must load: a URL without a scheme loads by the core's rule (https, http for a loopback host)
    and the block takes a lock on the local server with it. A wrong scheme (`ftp://`) is still saved by
    the forms and refused at load, naming the value."""
    import uuid

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_volcano import VolcanoCredentials

    assert volcano_server.url.startswith("http://127.0.0.1:")
    typed = volcano_server.url.removeprefix("http://")
    names = {
        u: f"url-{u.split(':')[0].replace('.', '-')}-{ui}-{uuid.uuid4().hex[:6]}"
        for u in (typed, "api.volcano.dev", "ftp://api.volcano.dev")
    }
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            for url, name in names.items():
                key = volcano_server.service_key if url == typed else SERVICE_KEY
                _fill_create_form(page, prefect_ui, ui, name, api_url=url, service_key=key)
                (saved,) = _saved(prefect_ui, name)
                assert saved["data"]["api_url"] == url
        finally:
            browser.close()
    with temporary_settings(updates={PREFECT_API_URL: f"{prefect_ui}/api"}):
        local = VolcanoCredentials.load(names[typed])
        assert local.api_url == volcano_server.url  # http: the host is loopback
        with (
            local.get_client() as client,
            client.with_lock(f"form-{ui}-{uuid.uuid4().hex[:6]}", ttl=5) as guard,
        ):
            assert guard.fencing_token
        assert VolcanoCredentials.load(names["api.volcano.dev"]).api_url == "https://api.volcano.dev"
        with pytest.raises(RuntimeError, match="due to failed validation") as refused:
            VolcanoCredentials.load(names["ftp://api.volcano.dev"])
    cause = refused.value.__cause__ or refused.value.__context__
    assert "'ftp://api.volcano.dev' is not an http(s) URL" in str(cause), cause


BOARD_DEMO = Path(__file__).with_name("board_demo.py")


def test_lock_current_view_and_a_skipped_run_in_the_runs_lists_and_the_dashboard(
    prefect_ui: str, volcano_server: Any, tmp_path: Path
) -> None:
    import uuid

    from prefect_volcano import artifact_key
    from tests.prefect.helpers import PROJECT

    key = f"nightly-rollup:{uuid.uuid4().hex[:6]}"
    env = dict(os.environ)
    env.update(volcano_server.env())
    env.update(
        PREFECT_API_URL=f"{prefect_ui}/api",
        PREFECT_UI_URL=prefect_ui,
        PREFECT_HOME=str(tmp_path),
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with subprocess.Popen(
        [sys.executable, str(BOARD_DEMO), key],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as demo:
        assert demo.stdin is not None and demo.stdout is not None
        try:
            line = demo.stdout.readline()
            assert line.startswith("READY"), line
            deployment_id = line.split()[1]
            runs = httpx.post(
                f"{prefect_ui}/api/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment_id]}}}
            ).json()
            by_message = {(r["state"]["message"] or "").startswith("Skipped: "): r for r in runs}
            holder, skipped = by_message[False], by_message[True]
            assert skipped["state"]["name"] == "Completed" and holder["state"]["name"] == "Running"
            with playwright_sync.sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
                try:
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    (latest,) = httpx.post(
                        f"{prefect_ui}/api/artifacts/latest/filter",
                        json={"artifacts": {"key": {"any_": [artifact_key(key, PROJECT)]}}},
                    ).json()
                    page.goto(
                        f"{prefect_ui}/artifacts/artifact/{latest['latest_id']}", wait_until="networkidle"
                    )
                    page.get_by_text("Fencing token").first.wait_for(timeout=20_000)
                    shown = page.locator("body").inner_text()
                    assert holder["name"] in shown and "held" in shown and "process-pool" in shown
                    assert volcano_server.service_key not in page.content()
                    page.screenshot(path=str(SCREENSHOTS / "prefect-lock-current-view.png"), full_page=True)

                    page.goto(
                        f"{prefect_ui}/artifacts/key/{artifact_key(key, PROJECT)}", wait_until="networkidle"
                    )
                    page.get_by_text(f"Volcano lock {key}").first.wait_for(timeout=20_000)
                    page.screenshot(path=str(SCREENSHOTS / "prefect-lock-history.png"))

                    page.goto(f"{prefect_ui}/artifacts", wait_until="networkidle")
                    page.get_by_text(artifact_key(key, PROJECT)).first.wait_for(timeout=20_000)
                    page.screenshot(path=str(SCREENSHOTS / "prefect-lock-artifacts-page.png"))

                    # Both UIs (V2 is the one Prefect 3.9 opens by default): the same lists, the same tag.
                    for ui, (where, shot) in itertools.product(
                        UIS,
                        (
                            (
                                f"deployments/deployment/{deployment_id}?tab=Runs",
                                "prefect-deployment-runs-skipped",
                            ),
                            ("runs", "prefect-flow-runs-skipped"),
                        ),
                    ):
                        page.goto(f"{prefect_ui}{UIS[ui]}/{where}", wait_until="networkidle")
                        page.get_by_text(skipped["name"]).first.wait_for(timeout=20_000)
                        row = _row(page, skipped["name"])
                        assert SKIPPED_TAG in row, (ui, where, row)  # told apart at a glance: the tag
                        assert "Completed" in row, (ui, where, row)
                        assert SKIPPED_TAG not in _row(page, holder["name"]), (ui, where)
                        page.screenshot(path=_shot(shot, ui))
                    # The dashboard's Flow Runs card lists a state's runs under its state tab, by flow;
                    # V2's shows a run from the minute after it started.
                    for ui, row_of in (("v1", _dashboard_row), ("v2", _v2_dashboard_row)):
                        time.sleep(_after_the_minute_of(runs) if ui == "v2" else 0)
                        for state, run, tagged in (("running", holder, False), ("completed", skipped, True)):
                            page.goto(f"{prefect_ui}{UIS[ui]}/dashboard", wait_until="networkidle")
                            row = row_of(page, state, run["name"])
                            assert (SKIPPED_TAG in row) is tagged, (ui, state, row)
                            assert state.capitalize() in row, (ui, state, row)
                        page.wait_for_timeout(1500)  # the flow's list finishes opening
                        page.screenshot(path=_shot("prefect-dashboard-skipped", ui))
                finally:
                    browser.close()
        finally:
            demo.stdin.close()
            try:
                demo.wait(timeout=30)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait()
    assert demo.returncode == 0
