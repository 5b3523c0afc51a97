"""The Volcano Credentials block as a user meets it: the Prefect UI's create form, in a real browser.

The session harness serves the API only (an ephemeral server has no UI), so this module starts a
`prefect server start` of its own, with the UI, on a free port and a private database. Skipped, with
the reason, where Playwright or Debian's chromium is missing (CI installs `chromium`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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


def _saved(base: str, name: str) -> list[dict[str, Any]]:
    return [b for b in httpx.post(f"{base}/api/block_documents/filter", json={}).json() if b["name"] == name]


def _fill_create_form(page: Any, base: str, name: str, api_url: str | None, budget: str | None) -> None:
    page.goto(f"{base}/blocks/catalog/volcano-credentials/create", wait_until="networkidle")
    form = page.locator("form")
    form.locator("input[type=text]").first.fill(name)
    if api_url is not None:
        form.locator("textarea").nth(0).fill(api_url)
    form.locator("textarea").nth(1).fill(SERVICE_KEY)
    if budget is not None:  # the last number input: the waiting budget (the timeout comes before it)
        form.locator("input[type=number]").last.fill(budget)
    page.get_by_role("button", name="Create").click()
    page.wait_for_timeout(1500)  # time for a (wrong) save to land; the form's own check is at once


def test_the_form_refuses_a_waiting_budget_of_0(prefect_ui: str) -> None:
    """The form checks the schema's bounds (`minimum` 1): a budget of 0 is refused, nothing saved."""
    import uuid

    name = f"refused-{uuid.uuid4().hex[:8]}"
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            _fill_create_form(page, prefect_ui, name, None, "0")
            assert _saved(prefect_ui, name) == []
            shown = page.locator("form").inner_text()
            assert "greater than or equal to 1" in shown or "at least 1" in shown, shown
            page.screenshot(path=str(SCREENSHOTS / "prefect-volcano-credentials-refused-budget.png"))
            _fill_create_form(page, prefect_ui, name, None, "1")  # the same form, corrected, saves
            assert len(_saved(prefect_ui, name)) == 1
        finally:
            browser.close()


def test_a_url_without_a_scheme_is_refused_with_its_value_named(prefect_ui: str) -> None:
    """Prefect's block form checks only a field's bounds and lengths (its schema-form rules in the UI
    bundle: required, min/max, exclusive bounds), never a `pattern`, so it saves a URL without a scheme;
    the block then refuses to load, naming the value and the fix. This test fails the day the form
    checks the pattern the block's schema carries: then the form refuses it, and the docs change."""
    import uuid

    from prefect_volcano import VolcanoCredentials

    name = f"no-scheme-{uuid.uuid4().hex[:8]}"
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1100})
            _fill_create_form(page, prefect_ui, name, "api.volcano.dev", None)
            (saved,) = _saved(prefect_ui, name)
            assert saved["data"]["api_url"] == "api.volcano.dev"
        finally:
            browser.close()
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: f"{prefect_ui}/api"}),
        pytest.raises(RuntimeError, match="due to failed validation") as refused,
    ):
        VolcanoCredentials.load(name)
    cause = refused.value.__cause__ or refused.value.__context__
    assert "api.volcano.dev" in str(cause) and "should match pattern" in str(cause), cause


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

                    for where, shot in (
                        (
                            f"deployments/deployment/{deployment_id}?tab=Runs",
                            "prefect-deployment-runs-skipped.png",
                        ),
                        ("runs", "prefect-flow-runs-skipped.png"),
                    ):
                        page.goto(f"{prefect_ui}/{where}", wait_until="networkidle")
                        page.get_by_text(skipped["name"]).first.wait_for(timeout=20_000)
                        row = _row(page, skipped["name"])
                        assert SKIPPED_TAG in row, (where, row)  # told apart at a glance: the tag
                        assert "Completed" in row, (where, row)
                        assert SKIPPED_TAG not in _row(page, holder["name"]), where
                        page.screenshot(path=str(SCREENSHOTS / shot))
                    # The dashboard's Flow Runs card lists a state's runs under its state tab, by flow.
                    page.goto(f"{prefect_ui}/dashboard", wait_until="networkidle")
                    for state, run, tagged in (("running", holder, False), ("completed", skipped, True)):
                        row = _dashboard_row(page, state, run["name"])
                        assert (SKIPPED_TAG in row) is tagged, (state, row)
                        assert state.capitalize() in row, (state, row)
                    page.wait_for_timeout(1500)  # the flow's list finishes opening
                    page.screenshot(path=str(SCREENSHOTS / "prefect-dashboard-skipped.png"))
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
