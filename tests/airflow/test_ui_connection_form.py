"""The Volcano connection form and the connections list's Test icon, in a real browser.

A real ``airflow api-server`` (the UI and its API, simple auth manager with a password) on a copy of the
session's metadata database, driven by Playwright through Debian's chromium. Skipped, with the reason,
where the ``playwright`` package or the browser is missing (CI installs ``chromium``).

Set ``VOLCANO_UPDATE_SCREENSHOTS=1`` to write the form's screenshot to docs/images/ for the README;
otherwise it goes to the test's tmp_path, so a test run leaves the working tree as it was.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.airflow.helpers import CHROMIUM, Stack, browser_or_skip, free_port, users_env

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "airflow-volcano-connection-form.png"
USER, PASSWORD = "admin", "volcano-ui-test-password"

sync_api = browser_or_skip()


@pytest.fixture(scope="module")
def ui_url(airflow_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An api-server with the UI, test_connection Enabled and one simple-auth-manager user."""
    home = tmp_path_factory.mktemp("airflow-ui-home")
    shutil.copy(airflow_db / "airflow.pristine.db", home / "airflow.db")
    shutil.copy(airflow_db / "airflow.cfg", home / "airflow.cfg")
    port = free_port()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        **users_env(home, {USER: ("admin", PASSWORD)}),
    }
    env.pop("AIRFLOW_CONN_VOLCANO_DEFAULT", None)
    stack = Stack(home, env)
    stack.url = f"http://127.0.0.1:{port}"
    try:
        stack.start("api-server", "api-server", "-H", "127.0.0.1", "-p", str(port), "-w", "1")
        stack.wait_for_api()
        yield stack.url
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def page(ui_url: str) -> Iterator[Any]:
    """A logged-in chromium page on the connections list."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            pg.set_default_timeout(30_000)
            pg.goto(f"{ui_url}/connections")
            ready = pg.get_by_role("button", name="Add Connection")
            sign_in = pg.get_by_role("button", name="Sign in")
            ready.or_(sign_in).first.wait_for()
            if sign_in.is_visible():  # the UI sent us to the simple auth manager's login page
                pg.get_by_label("Username").fill(USER)
                pg.get_by_label("Password").fill(PASSWORD)
                sign_in.click()
                ready.wait_for()
            yield pg
        finally:
            browser.close()


def _open_volcano_form(page: Any) -> Any:
    page.get_by_role("button", name="Add Connection").click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("combobox").click()
    page.get_by_role("option", name="Volcano", exact=True).click()
    dialog.get_by_text("Standard Fields").wait_for()
    return dialog


def _add_connection(page: Any, conn_id: str, url: str, key: str, port: int | None) -> None:
    dialog = _open_volcano_form(page)
    dialog.locator("input[name=connection_id]").fill(conn_id)
    dialog.locator("input[name=host]").fill(url)
    dialog.locator("input[name=password]").fill(key)
    if port is not None:
        dialog.locator("input[name=port]").fill(str(port))
    dialog.get_by_role("button", name="Save").click()
    dialog.wait_for(state="hidden")
    page.get_by_role("row").filter(has_text=conn_id).wait_for()


def _test_icon(page: Any, conn_id: str) -> tuple[int, str]:
    """Click the row's Test icon; return the API's status and the message the notification shows."""
    page.mouse.move(1, 1)  # a tooltip left over from another row would take the click
    row = page.get_by_role("row").filter(has_text=conn_id)
    with page.expect_response(lambda r: r.url.endswith("/api/v2/connections/test")) as answer:
        row.get_by_role("button", name="Test Connection").click()
    response = answer.value
    body = response.json()
    message = body.get("message") or ("Bad Request" if response.status == 400 else str(body))
    title = "Test Connection Successful" if body.get("status") is True else "Test Connection Failed"
    toast = page.locator("[data-scope=toast][data-part=root]").filter(has_text=title)
    toast.filter(has_text=message).last.wait_for()  # what the user reads
    return response.status, message


def test_volcano_form_fields_labels_and_masked_service_key(page: Any, volcano_server: Any) -> None:
    dialog = _open_volcano_form(page)
    standard = dialog.inner_text().split("\n")
    for label in ("API URL", "Service key", "Port"):
        assert label in standard, label
    for hidden in ("Host", "Login", "Schema", "Password"):
        assert hidden not in standard, f"{hidden} should be hidden or relabelled"
    host, key, port = (dialog.locator(f"input[name={n}]") for n in ("host", "password", "port"))
    assert host.get_attribute("placeholder") == "https://api.volcano.dev"
    assert key.get_attribute("type") == "password"
    assert "Test icon" in (port.get_attribute("placeholder") or "")

    url = volcano_server.url
    dialog.locator("input[name=connection_id]").fill("volcano_default")
    host.fill(url)
    key.fill(volcano_server.service_key)
    port.fill(str(urlsplit(url).port))
    assert key.input_value() == volcano_server.service_key
    assert key.get_attribute("type") == "password"  # shown as dots, not as the key
    target = SCREENSHOT if os.environ.get("VOLCANO_UPDATE_SCREENSHOTS") == "1" else None
    shot = dialog.screenshot(path=str(target) if target else None)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"

    dialog.get_by_text("Extra Fields", exact=True).click()
    extra = dialog.get_by_text("Request timeout (seconds)", exact=True)
    extra.wait_for()
    assert dialog.get_by_text("Anon key", exact=True).is_visible()
    anon = dialog.locator("input[name=element_anon_key]")
    assert anon.get_attribute("type") == "password"
    dialog.get_by_role("button", name="Close").click()
    dialog.wait_for(state="hidden")


def test_test_icon_checks_url_key_and_permission_and_needs_a_port_on_3_3_2(
    page: Any, volcano_server: Any
) -> None:
    import airflow

    url, port = volcano_server.url, urlsplit(volcano_server.url).port
    _add_connection(page, "volcano_ui_ok", url, volcano_server.service_key, port)
    assert _test_icon(page, "volcano_ui_ok") == (200, f"Connected to {url}; the key may manage locks")

    _add_connection(page, "volcano_ui_badkey", url, "not.a.jwt", port)
    assert _test_icon(page, "volcano_ui_badkey") == (
        200,
        f"The service key was rejected by {url} (401): check the key",
    )

    scoped = volcano_server.mint_key(permissions=["storage.read"])
    _add_connection(page, "volcano_ui_scoped", url, scoped, port)
    status, message = _test_icon(page, "volcano_ui_scoped")
    assert status == 200 and "may not manage locks" in message and "(403)" in message
    for secret in (volcano_server.service_key, scoped):
        assert secret not in page.content()

    # Without a stored port, 3.3.2's list sends port 0 and the API server refuses to reuse the stored
    # key (apache/airflow#73298): the reason the form keeps Port. Later versions test it normally.
    _add_connection(page, "volcano_ui_noport", url, volcano_server.service_key, None)
    status, message = _test_icon(page, "volcano_ui_noport")
    if airflow.__version__ == "3.3.2":
        assert (status, message) == (400, "Bad Request")
    else:
        assert message == f"Connected to {url}; the key may manage locks"
