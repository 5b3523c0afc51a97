"""locked_task's own arguments are checked when the decorator is applied; what cannot be then, at run time."""

from __future__ import annotations

from typing import Any

import prefect
import pytest
from packaging.version import Version
from prefect import flow, task

from prefect_volcano import VolcanoCredentials, current_lease, locked_flow, locked_task
from tests.prefect.helpers import assert_failed_with
from volcano_locks import InvalidRequest, validate_key, validate_ttl, validate_wait_timeout

PREFECT_VERSION = Version(Version(prefect.__version__).base_version)


def body(region: str, day: str = "2026-11-29") -> str:
    return region + day


@pytest.mark.parametrize("ttl", [4, 7_776_001, -1, 0, "30", 30.0, True, None])
@pytest.mark.parametrize("decorator", [locked_task, locked_flow])
def test_ttl_is_checked_by_the_core_rule(ttl: Any, decorator: Any) -> None:
    # The same message as the core client's (one rule, one place): volcano_locks.protocol.validate_ttl.
    with pytest.raises(InvalidRequest) as raised:
        decorator("k", ttl=ttl)
    with pytest.raises(InvalidRequest) as core:
        validate_ttl(ttl)
    assert str(raised.value) == str(core.value)
    assert f"invalid ttl {ttl!r}: expected an integer number of seconds, 5..7776000" == str(core.value)


def test_on_contention_choices() -> None:
    with pytest.raises(ValueError, match="on_contention must be one of 'wait', 'skip', 'fail', got 'raise'"):
        locked_task("k", on_contention="raise")  # type: ignore[arg-type]


def test_result_choices() -> None:
    with pytest.raises(ValueError, match="result must be one of 'value', 'locked_result', got 'lease'"):
        locked_task("k", result="lease")  # type: ignore[arg-type]


def test_wait_timeout_rules() -> None:
    with pytest.raises(ValueError, match="wait_timeout applies only to on_contention='wait', not 'skip'"):
        locked_task("k", on_contention="skip", wait_timeout=5)
    # The core's rule and message (volcano_locks.validate_wait_timeout), at decoration time.
    for bad in (-1, float("inf"), float("nan"), "5", True):
        for decorator in (locked_task, locked_flow):
            with pytest.raises(InvalidRequest) as raised:
                decorator("k", wait_timeout=bad)
            with pytest.raises(InvalidRequest) as core:
                validate_wait_timeout(bad)
            assert str(raised.value) == str(core.value)
            assert str(raised.value).startswith(
                f"invalid wait_timeout {bad!r}: expected None or seconds >= 0"
            )
    locked_task("k", wait_timeout=0)
    locked_task("k", wait_timeout=2.5)
    locked_flow("k", wait_timeout=None)


def test_credentials_types() -> None:
    with pytest.raises(
        TypeError, match="credentials must be a VolcanoCredentials block, a saved block's name"
    ):
        locked_task("k", credentials={"service_key": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty string"):
        locked_task("k", credentials="  ")
    locked_task("k", credentials="my-volcano")
    locked_task("k", credentials=VolcanoCredentials(service_key="x"))


@pytest.mark.parametrize("key", ["bad key", "-leading-dash", "x" * 129, "", "abc\n"])
def test_invalid_static_key(key: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        locked_task(key)
    with pytest.raises(InvalidRequest) as core:
        validate_key(key)
    assert str(raised.value) == str(core.value) and str(raised.value).startswith("invalid lock key")


def test_key_type() -> None:
    with pytest.raises(TypeError, match="key must be a string, a template string or a callable, got int"):
        locked_task(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("rollup:{}", "must name the task's parameters"),
        ("rollup:{0}", "must name the task's parameters"),
        ("rollup:{region", "is malformed"),
        (
            "rollup/{region}",
            r"key template 'rollup/\{region\}' cannot make a valid lock key: invalid lock key",
        ),
        ("-{region}", "cannot make a valid lock key"),
        ("{region}\n", "cannot make a valid lock key"),
    ],
)
def test_malformed_templates(template: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        locked_task(template)


def test_template_must_name_parameters_of_the_function() -> None:
    decorator = locked_task("rollup:{regoin}")
    with pytest.raises(ValueError, match=r"uses 'regoin', which 'body' has no parameter of that name"):
        decorator(body)
    with pytest.raises(ValueError, match="'regoin'"):
        decorator(task(body))


@pytest.mark.usefixtures("volcano_env")
def test_template_with_kwargs_function_is_checked_at_run_time(unique_key: str) -> None:
    # Any name may arrive through **kwargs, so applying the decorator checks nothing: each run renders
    # the key from the call's keyword arguments, and a call without the name fails that run, naming it.
    @task
    @locked_task(unique_key + "-{region}")
    def anything(**kwargs: Any) -> str:
        return current_lease().lock_key

    states: list[Any] = []

    @flow
    def f() -> str:
        states.append(anything(day="2026-11-29", return_state=True))
        return anything(region="eu", day="2026-11-29")

    assert f() == f"{unique_key}-eu"
    (missing,) = states
    assert_failed_with(
        missing, InvalidRequest, r"^key template '.*-\{region\}' cannot be rendered: KeyError\('region'\)$"
    )


def test_template_attribute_and_index_access_is_allowed() -> None:
    def cfg(conf: dict[str, str], region: Any) -> None:
        return None

    locked_task("rollup:{conf[name]}:{region.code}")(cfg)


def test_refuses_flows_generators_and_non_callables() -> None:
    @flow
    def a_flow() -> None:
        return None

    def gen() -> Any:
        yield 1

    async def agen() -> Any:
        yield 1

    with pytest.raises(TypeError, match="not flows"):
        locked_task("k")(a_flow)
    with pytest.raises(TypeError, match="cannot lock generator function"):
        locked_task("k")(gen)
    with pytest.raises(TypeError, match="cannot lock generator function"):
        locked_task("k")(agen)
    with pytest.raises(TypeError, match="expects a task or a function, got int"):
        locked_task("k")(3)  # type: ignore[call-overload]


def test_both_orders_keep_the_task_identity() -> None:
    original = task(body, name="regional-body", retries=3, retry_delay_seconds=0, tags={"x"})
    above = locked_task("rollup:{region}")(original)
    below = task(
        locked_task("rollup:{region}")(body),
        name="regional-body",
        retries=3,
        retry_delay_seconds=0,
        tags={"x"},
    )
    # Prefect 3.9 derives a task's key from the user's function under our wrapper; 3.7 and 3.8 from the
    # wrapper, so only a locked_task above @task keeps the key there (docs: supported versions).
    assert above.task_key == original.task_key
    assert (below.task_key == original.task_key) is (Version("3.9") <= PREFECT_VERSION)
    for locked in (above, below):
        assert locked.name == "regional-body"
        assert locked.retries == 3
        assert locked.tags == {"x"}
        assert locked.fn.__name__ == "body"
        assert locked.isasync is False
    assert above is not original and original.fn is body


def test_async_functions_stay_async() -> None:
    async def abody(region: str) -> str:
        return region

    assert task(locked_task("r:{region}")(abody)).isasync
    assert locked_task("r:{region}")(task(abody)).isasync


def test_current_lease_outside_a_body() -> None:
    with pytest.raises(RuntimeError, match="only available inside the body of a locked_task"):
        current_lease()


def test_locked_flow_refuses_tasks_and_keeps_the_flow_identity() -> None:
    with pytest.raises(TypeError, match="not tasks; use locked_task for that"):
        locked_flow("k")(task(body))
    with pytest.raises(ValueError, match="'regoin'"):
        locked_flow("nightly:{regoin}")(flow(body))
    original = flow(body, name="nightly-body", retries=2)
    above = locked_flow("nightly:{region}")(original)
    below = flow(locked_flow("nightly:{region}")(body), name="nightly-body", retries=2)
    for locked in (above, below):
        assert locked.name == "nightly-body" and locked.retries == 2
        assert list(locked.parameters.properties) == ["region", "day"]
        assert locked.fn.__name__ == "body" and locked.isasync is False
    assert above is not original and original.fn is body
