"""The test tiers: which tests are slow, and why (CONTRIBUTING.md, "The tests").

The **fast tier** (``pytest -m "not slow"``) is every test that runs in this process against the session's
server, or against a server on a clock the test moves, and waits for nothing real beyond a second. The
**slow tier** is every test that waits out a lease, the grace second, a renewal schedule or a
``Retry-After`` for real, starts processes of its own (servers, the CLI, workers, flows in subprocesses),
runs fleets, full stacks or chaos, or searches long. ``make test`` runs both tiers.

A test joins the slow tier by ``pytest.mark.slow`` in its module (``pytestmark``), on the test itself, or
by an entry here: a module path with the reason (every test in it), or a module path with its slow tests'
names (every parametrisation) and their reasons. The entries here are for modules where most tests are
fast, and for the folders other work is editing at the same time (a line here merges where an edit in a
test body would not). The root
``conftest.py`` applies them before ``-m`` selects; an entry that names a test its module no longer has
is an error, so the list cannot drift.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

__all__ = ["SLOW", "mark_slow"]

WAITS = "waits out a lease, the grace second, a renewal or a Retry-After for real"
PROCESSES = "starts processes of its own (servers, the CLI, workers) and waits for them"
CONTENDERS = "processes or threads contend for real and are counted"
FLOWS = "runs Prefect flows for real, in this process or in subprocesses"
SEARCH = "a long property-based or fuzzing search"
STACK = "an Airflow api-server, a browser or DAG runs for real"
BROWSER = "drives a real browser against a real server's UI"

SLOW: dict[str, str | dict[str, str]] = {
    "tests/core/test_abandoned.py": {
        "test_a_callers_own_token_is_left_for_the_caller_to_recover": WAITS,
        "test_a_cancelled_async_acquisition_is_released": WAITS,
    },
    "tests/core/test_client.py": {
        "test_rate_limited_with_retry_after": WAITS,
    },
    "tests/core/test_guard.py": {
        "test_async_loss_cancels_body_and_raises_ownership_lost": WAITS,
        "test_async_loss_when_server_stops_answering": WAITS,
        "test_block_exception_takes_precedence_over_loss": WAITS,
        "test_interrupt_in_a_worker_thread": WAITS,
        "test_interrupt_raises_in_the_body": WAITS,
        "test_loss_on_force_release_mid_block": WAITS,
        "test_loss_when_server_stops_answering": WAITS,
        "test_no_safe_window_at_all_refuses_to_enter": WAITS,
        "test_no_safe_window_renews_before_entering": WAITS,
        "test_renewals_use_fresh_request_ids": WAITS,
    },
    "tests/prefect/test_metrics.py": FLOWS,
    "tests/core/test_eta.py": {
        "test_the_engine_reports_the_eta_to_on_waiting": WAITS,
    },
    "tests/core/test_telemetry.py": {
        "test_a_contended_lock_records_every_instrument_sync": WAITS,
        "test_a_contended_lock_records_every_instrument_async": WAITS,
    },
    "tests/core/test_hardening.py": {
        "test_a_dripping_server_cannot_hold_a_sync_call_past_its_timeout": WAITS,
        "test_retry_after_is_capped_and_never_an_untyped_error": WAITS,
        "test_timed_out_calls_leave_no_thread_socket_or_connection_behind": WAITS,
    },
    "tests/core/test_imports.py": {
        "test_every_package_of_the_repository_is_in_the_graph": SEARCH,
    },
    "tests/core/test_keeping.py": {
        "test_async_keep_cancels_the_block_and_raises_the_loss": WAITS,
        "test_async_keep_renews_and_leaves_the_lease_held": WAITS,
        "test_keep_interrupts_the_body_on_loss": WAITS,
        "test_keep_raises_the_loss_after_the_block": WAITS,
        "test_keep_renews_and_leaves_the_lease_held": WAITS,
        "test_the_block_exception_wins_over_the_loss": WAITS,
    },
    "tests/core/test_public_api.py": {
        "test_importing_the_package_for_its_rules_imports_no_client": PROCESSES,
        "test_the_sdk_snippets_run_with_only_the_import_changed": PROCESSES,
    },
    "tests/core/test_releasing.py": {
        "test_async_unanswered_release_lapses": WAITS,
        "test_with_lock_leaves_an_unanswered_release_to_lapse": WAITS,
    },
    "tests/core/test_renewal.py": {
        "test_schedule_invariants": SEARCH,
    },
    "tests/core/test_secrets.py": {
        "test_nothing_secret_leaks": WAITS,
    },
    "tests/core/test_waiting.py": {
        "test_async_waiters_share_one_poll": WAITS,
        "test_raise_mode_abandons_an_unanswered_acquisition_after_a_429": WAITS,
        "test_rate_limited_wait_honours_retry_after": WAITS,
        "test_threads_share_one_poll": WAITS,
        "test_unrelated_credentials_do_not_share": WAITS,
    },
    "tests/server/test_abuse.py": {
        "test_a_busy_request_is_never_displaced": PROCESSES,
        "test_accept_loop_does_not_spin_at_a_low_open_file_limit": PROCESSES,
        "test_bad_limits_are_usage_errors": PROCESSES,
        "test_content_length_larger_than_the_body_is_cut_at_the_total_request_time": WAITS,
        "test_full_server_answers_503_when_nothing_can_make_room": PROCESSES,
        "test_huge_header_sets_on_many_connections_leave_memory_bounded": PROCESSES,
        "test_idle_and_parked_sockets_do_not_lock_out_new_clients": PROCESSES,
        "test_long_paths_leave_memory_and_request_log_bounded": PROCESSES,
        "test_slowloris_drip_is_cut_at_the_total_request_time": WAITS,
    },
    "tests/server/test_cli_serve_keys.py": PROCESSES,
    "tests/server/test_concurrency.py": {
        "test_two_servers_sharing_one_database_never_grant_twice": CONTENDERS,
    },
    "tests/server/test_contract.py": {
        "test_deadline_applies_to_renewals_of_short_leases": WAITS,
    },
    "tests/server/test_faults.py": {
        "test_bad_faults_flag_exits_with_message": PROCESSES,
        "test_503_when_postgres_goes_away_and_recovery": WAITS,
        "test_cli_faults_flag_and_runtime_faults_in_a_subprocess": PROCESSES,
    },
    "tests/server/test_hardening.py": {
        "test_database_and_secret_are_created_private": PROCESSES,
        "test_an_existing_readable_database_is_named_in_a_warning": PROCESSES,
        "test_a_bad_admin_key_is_a_usage_error_that_does_not_show_it": PROCESSES,
        "test_a_readable_secret_file_is_refused": PROCESSES,
        "test_admin_on_a_non_loopback_host_warns": PROCESSES,
        "test_admin_takes_the_servers_admin_key_and_no_projects_key": PROCESSES,
        "test_postgres_connections_stay_within_the_pool_and_waiters_get_503": WAITS,
        "test_serve_prints_the_admin_key_and_takes_one_from_the_env_or_the_flag": PROCESSES,
    },
    "tests/server/test_harness.py": PROCESSES,
    "tests/server/test_http_parsing.py": {
        "test_a_content_length_of_non_ascii_digits_is_a_clean_400": WAITS,
    },
    "tests/server/test_pg_pool.py": {
        "test_hung_database_connect_and_query_are_bounded": WAITS,
        "test_long_lock_waits_are_503": WAITS,
        "test_requests_get_503_while_postgres_hangs_and_recover": WAITS,
    },
    "tests/server/test_quota.py": {
        "test_two_server_processes_on_postgres_share_the_quota": CONTENDERS,
    },
    "tests/server/test_service_properties.py": {
        "test_random_histories_keep_the_invariants": SEARCH,
    },
    "tests/cli/test_ops.py": PROCESSES,
    "tests/docs/test_docs.py": {
        "test_the_first_lock_of_getting_started_runs_against_the_local_server": PROCESSES,
    },
    "tests/docs/test_readme.py": {
        "test_serve_prints_the_three_variables_the_readme_says": PROCESSES,
        "test_the_readme_first_lock_holds_the_lock_while_it_prints_the_fencing_token": PROCESSES,
    },
    "tests/packaging/test_release.py": PROCESSES,  # every test reads the wheel and sdist `make dist` builds
    "tests/support/test_busy.py": {
        "test_processes_running_now_count_before_the_load_average_catches_up": PROCESSES,
    },
    "tests/support/test_pg_select.py": {
        "test_on_this_machine_the_reason_is_honest_about_docker": PROCESSES,
    },
    "tests/chaos/test_fenced_store.py": {
        "test_concurrent_writers_never_get_a_stale_write_accepted": CONTENDERS,
        "test_fencing_rejects_lower_tokens_and_records_every_attempt": PROCESSES,
    },
    "tests/chaos/test_fuzz_protocol.py": {
        "test_acquire_input_gives_invalid_request_before_sending_or_a_correct_lease": SEARCH,
    },
    "tests/chaos/test_fuzz_server.py": {
        "test_httpx_requests_with_fuzzed_parts_never_get_a_500": SEARCH,
        "test_raw_http_never_gets_a_500_and_never_kills_the_server": SEARCH,
    },
    "tests/fencing/test_contention.py": CONTENDERS,
    "tests/fencing/test_s3.py": {
        "test_concurrent_publishers_never_lose_an_accepted_publish": CONTENDERS,
    },
    "tests/fencing/test_sql.py": {
        "test_concurrent_writers_never_lose_an_accepted_write": CONTENDERS,
        "test_two_writers_of_one_resource_wait_for_each_other_without_deadlock": CONTENDERS,
    },
    "tests/fencing/test_table.py": {
        "test_concurrent_writers_leave_the_highest_token": CONTENDERS,
    },
    "tests/fencing/test_takeover.py": CONTENDERS,
    "tests/once/test_sql.py": {
        "test_concurrent_duplicates_on_postgresql_do_the_effect_once": CONTENDERS,
    },
    "tests/once/test_s3.py": {
        "test_concurrent_duplicate_publishes_make_one_current": CONTENDERS,
    },
    "tests/cli/test_once.py": {
        "test_the_installed_command_runs_once": PROCESSES,
    },
    "tests/airflow/test_board.py": {
        "test_a_stale_holder_record_is_not_shown_as_the_holder": STACK,
        "test_opening_the_page_on_200_locks_costs_at_most_its_budget": STACK,
    },
    "tests/airflow/test_board_stack.py": STACK,
    "tests/airflow/test_dags.py": STACK,
    "tests/airflow/test_handoff.py": {
        "test_a_trigger_waits_behind_a_handoff_whose_task_may_still_resume": WAITS,
        "test_a_wait_in_the_worker_slot_frees_a_cleared_tasks_handoff": WAITS,
        "test_a_trigger_never_frees_a_groups_lease_because_its_acquire_task_ended": WAITS,
        "test_a_record_that_outlived_its_lease_frees_nothing": WAITS,
        "test_an_unsealed_record_frees_nothing_and_is_logged": WAITS,
    },
    "tests/airflow/test_waits_stack.py": STACK,
    "tests/airflow/test_holder_watch.py": {
        "test_a_crashed_holders_lease_is_taken_at_its_expiry": WAITS,
    },
    "tests/airflow/test_hold.py": WAITS + "; " + STACK,
    "tests/airflow/test_seal_stack.py": STACK,
    "tests/airflow/test_operators.py": {
        "test_the_first_acquire_waits_out_a_stopped_server": WAITS,
        "test_on_kill_from_another_thread_releases_and_the_keeper_stops_the_callable": WAITS,
        "test_waiting_in_the_worker_slot_says_so_and_how_to_defer": WAITS,
    },
    "tests/airflow/test_plugin.py": PROCESSES,
    "tests/airflow/test_provider_info.py": {
        "test_airflow_providers_list_shows_the_provider": PROCESSES,
    },
    "tests/airflow/test_readme_example.py": STACK,
    "tests/airflow/test_triggers.py": {
        "test_waiting_triggers_share_one_poller_and_one_release_wakes_one": WAITS,
        "test_trigger_rides_out_503_and_429_while_waiting": WAITS,
        "test_trigger_times_out_naming_the_holder": WAITS,
        "test_waiting_lines_name_the_holder_from_the_engines_look_at_no_extra_request": WAITS,
    },
    "tests/airflow/test_ui_connection_form.py": BROWSER,
    "tests/airflow/test_ui_lock_board.py": BROWSER,
    "tests/prefect/test_board.py": FLOWS,
    "tests/prefect/test_credentials.py": {
        "test_cli_block_register": PROCESSES,
    },
    "tests/prefect/test_decoration.py": {
        "test_template_with_kwargs_function_is_checked_at_run_time": FLOWS,
    },
    "tests/prefect/test_endings.py": FLOWS,
    "tests/prefect/test_events.py": FLOWS,
    "tests/prefect/test_flows.py": FLOWS,
    "tests/prefect/test_locked.py": FLOWS,
    "tests/prefect/test_locked_flow.py": FLOWS,
    "tests/prefect/test_once.py": {
        "test_a_second_run_of_a_done_key_ends_as_a_duplicate_with_the_first_result": FLOWS,
        "test_a_duplicate_is_not_cached_and_a_retry_after_commit_is_a_duplicate": FLOWS,
        "test_a_rendered_once_key_that_is_bad_fails_the_task_naming_it": FLOWS,
        "test_current_once_needs_once_key": FLOWS,
        "test_async_task_with_an_async_ledger": FLOWS,
        "test_s3_ledger_under_a_task": FLOWS,
    },
    "tests/prefect/test_race.py": FLOWS,
    "tests/prefect/test_readme_example.py": FLOWS,
    "tests/prefect/test_ui_form.py": BROWSER,
    "tests/prefect/test_secrets.py": {
        "test_no_secret_in_block_results_logs_or_storage": FLOWS,
    },
    "tests/prefect/test_wake.py": FLOWS,
}
"""Module -> why all of it is slow, or module -> {test -> why it is slow}."""


def mark_slow(items: Iterable[pytest.Item], args: Iterable[str]) -> None:
    """Mark the items :data:`SLOW` names; raise on an entry its module no longer has.

    ``args`` are the command line's paths: when one names tests (``path::test``), modules were not
    collected whole and the check for stale entries is skipped.
    """
    used: set[tuple[str, str]] = set()
    modules: set[str] = set()
    for item in items:
        module, _, name = item.nodeid.split("[", 1)[0].partition("::")
        modules.add(module)
        entry = SLOW.get(module)
        if isinstance(entry, str) or (entry is not None and name in entry):
            item.add_marker(pytest.mark.slow)
            used.add((module, "" if isinstance(entry, str) else name))
    if any("::" in arg for arg in args):
        return
    stale = sorted(
        f"{module}::{name}" if name else module
        for module, entry in SLOW.items()
        if module in modules
        for name in ([""] if isinstance(entry, str) else entry)
        if (module, name) not in used
    )
    if stale:
        raise pytest.UsageError(f"tests/tiers.py names tests that no longer exist: {', '.join(stale)}")
