"""The Volcano Credentials block as a user meets it: the Prefect UI's create form, in a real browser.

The session harness serves the API only (an ephemeral server has no UI), so this module starts a
`prefect server start` of its own, with the UI, on a free port and a private database. Skipped, with
the reason, where Playwright or Debian's chromium is missing (CI installs `chromium`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

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
        with prefect_server(home, services=False) as base:
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


BOARD_DEMO = Path(__file__).with_name("board_demo.py")


def test_lock_current_view_and_a_skipped_run_in_the_deployment_runs_tab(
    prefect_ui: str, volcano_server: Any, tmp_path: Path
) -> None:
    import uuid

    from prefect_volcano import artifact_key

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
                        json={"artifacts": {"key": {"any_": [artifact_key(key)]}}},
                    ).json()
                    page.goto(
                        f"{prefect_ui}/artifacts/artifact/{latest['latest_id']}", wait_until="networkidle"
                    )
                    page.get_by_text("Fencing token").first.wait_for(timeout=20_000)
                    shown = page.locator("body").inner_text()
                    assert holder["name"] in shown and "held" in shown and "process-pool" in shown
                    assert volcano_server.service_key not in page.content()
                    page.screenshot(path=str(SCREENSHOTS / "prefect-lock-current-view.png"), full_page=True)

                    page.goto(f"{prefect_ui}/artifacts/key/{artifact_key(key)}", wait_until="networkidle")
                    page.get_by_text(f"Volcano lock {key}").first.wait_for(timeout=20_000)
                    page.screenshot(path=str(SCREENSHOTS / "prefect-lock-history.png"))

                    page.goto(f"{prefect_ui}/artifacts", wait_until="networkidle")
                    page.get_by_text(artifact_key(key)).first.wait_for(timeout=20_000)
                    page.screenshot(path=str(SCREENSHOTS / "prefect-lock-artifacts-page.png"))

                    page.goto(
                        f"{prefect_ui}/deployments/deployment/{deployment_id}?tab=Runs",
                        wait_until="networkidle",
                    )
                    page.get_by_text(skipped["name"]).first.wait_for(timeout=20_000)
                    shown = page.locator("body").inner_text()
                    assert holder["name"] in shown and skipped["name"] in shown
                    page.screenshot(path=str(SCREENSHOTS / "prefect-deployment-runs-skipped.png"))
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
