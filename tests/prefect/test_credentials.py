"""The VolcanoCredentials block: Prefect conventions, save/load with masked secrets, clients, registration."""

from __future__ import annotations

import subprocess
import sys
import uuid
from importlib.metadata import entry_points
from typing import Any

import pytest
from prefect.blocks.core import Block
from prefect.client.orchestration import get_client
from prefect.plugins import load_prefect_collections
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import ValidationError

import prefect_volcano
from prefect_volcano import VolcanoCredentials
from volcano_locks import AsyncVolcanoLocks, AuthError, VolcanoLocks


class TestVolcanoCredentialsStandard(BlockStandardTestSuite):
    """Prefect's own checks for a block: description, docs URL, field descriptions, code example."""

    @pytest.fixture
    def block(self) -> type[Block]:
        return VolcanoCredentials


def test_block_type_metadata() -> None:
    assert VolcanoCredentials.get_block_type_name() == "Volcano Credentials"
    assert VolcanoCredentials.get_block_type_slug() == "volcano-credentials"
    assert set(VolcanoCredentials.model_json_schema()["secret_fields"]) == {"service_key", "anon_key"}
    assert VolcanoCredentials.model_fields["api_url"].default == "https://api.volcano.dev"


def test_repr_and_json_mask_secrets() -> None:
    block = VolcanoCredentials(service_key="svc-SECRET-1", anon_key="anon-SECRET-2")
    for text in (repr(block), str(block), block.model_dump_json()):
        assert "svc-SECRET-1" not in text
        assert "anon-SECRET-2" not in text


@pytest.mark.parametrize("url", ["ftp://example.com", "", "http://", "https://api volcano.dev", "h:99999"])
def test_rejects_unusable_api_url(url: str) -> None:
    with pytest.raises(ValidationError, match="api_url") as refused:
        VolcanoCredentials(api_url=url, service_key="k")
    assert repr(url) in str(refused.value)  # the value is named (a URL is not a secret)


@pytest.mark.parametrize(
    ("typed", "url"),
    [("api.volcano.dev", "https://api.volcano.dev"), ("127.0.0.1:8000", "http://127.0.0.1:8000")],
)
def test_api_url_without_a_scheme_follows_the_core_rule(typed: str, url: str) -> None:
    assert VolcanoCredentials(api_url=typed, service_key="k").api_url == url
    assert "pattern" not in VolcanoCredentials.model_json_schema()["properties"]["api_url"]


@pytest.mark.parametrize("timeout", [0, 0.05, -1, 301])
def test_rejects_bad_timeout(timeout: float) -> None:
    with pytest.raises(ValidationError, match="timeout"):
        VolcanoCredentials(service_key="k", timeout=timeout)


@pytest.mark.parametrize("budget", [0, 601, -5])
def test_wait_budget_follows_the_core_rule(budget: int) -> None:
    with pytest.raises(ValidationError, match="wait_budget"):
        VolcanoCredentials(service_key="k", wait_budget=budget)


def test_wait_budget_reaches_the_clients_governor(volcano_server: Any) -> None:
    block = VolcanoCredentials(
        api_url=volcano_server.url, service_key=volcano_server.service_key, wait_budget=42
    )
    with block.get_client() as client:
        assert client.governor.stats().wait_budget == 42


def test_service_key_is_required() -> None:
    with pytest.raises(ValidationError, match="service_key"):
        VolcanoCredentials()


def test_save_and_load_keeps_secrets_out_of_the_stored_json(volcano_server: Any) -> None:
    name = f"volcano-{uuid.uuid4().hex[:12]}"
    VolcanoCredentials(
        api_url=volcano_server.url, service_key=volcano_server.service_key, anon_key=volcano_server.anon_key
    ).save(name)

    with get_client(sync_client=True) as client:
        document = client.read_block_document_by_name(
            name, block_type_slug="volcano-credentials", include_secrets=False
        )
    stored = document.model_dump_json()
    assert volcano_server.service_key not in stored
    assert volcano_server.anon_key not in stored
    assert set(document.data["service_key"]) == {"*"}
    assert set(document.data["anon_key"]) == {"*"}
    assert document.data["api_url"] == volcano_server.url

    loaded = VolcanoCredentials.load(name, _sync=True)  # type: ignore[call-overload]
    assert loaded.service_key.get_secret_value() == volcano_server.service_key
    assert loaded.anon_key is not None and loaded.anon_key.get_secret_value() == volcano_server.anon_key
    assert volcano_server.service_key not in loaded.model_dump_json()


def test_get_client_talks_to_the_server(credentials: VolcanoCredentials, unique_key: str) -> None:
    with credentials.get_client() as client:
        assert isinstance(client, VolcanoLocks)
        assert client.get(unique_key).held is False
        with client.with_lock(unique_key, 5) as guard:
            assert guard.acquired and guard.fencing_token is not None
            assert client.get(unique_key).held is True


async def test_get_async_client_talks_to_the_server(credentials: VolcanoCredentials, unique_key: str) -> None:
    async with credentials.get_async_client() as client:
        assert isinstance(client, AsyncVolcanoLocks)
        lease = await client.acquire(unique_key, 5)
        assert (await client.get(unique_key)).fencing_token == lease.fencing_token
        await client.release(unique_key, lease)
        assert (await client.get(unique_key)).held is False


def test_wrong_service_key_is_an_auth_error(volcano_server: Any, unique_key: str) -> None:
    block = VolcanoCredentials(api_url=volcano_server.url, service_key=volcano_server.anon_key)
    with block.get_client() as client, pytest.raises(AuthError) as info:
        client.get(unique_key)
    assert volcano_server.anon_key not in str(info.value)


def test_entry_point_loads_the_collection() -> None:
    names = {ep.name: ep.value for ep in entry_points(group="prefect.collections")}
    assert names.get("prefect_volcano") == "prefect_volcano"
    assert load_prefect_collections()["prefect_volcano"] is prefect_volcano


def test_cli_block_register(prefect_subprocess_env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "prefect", "block", "register", "-m", "prefect_volcano"],
        env=prefect_subprocess_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Successfully registered 1 block" in proc.stdout
    assert "Volcano Credentials" in proc.stdout

    with get_client(sync_client=True) as client:
        block_type = client.read_block_type_by_slug("volcano-credentials")
        schema = client.get_most_recent_block_schema_for_block_type(block_type.id)
    assert block_type.name == "Volcano Credentials"
    assert block_type.documentation_url is not None
    assert schema is not None
    assert set(schema.fields["secret_fields"]) == {"service_key", "anon_key"}
