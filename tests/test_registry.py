import pytest

from preflight import registry
from preflight.check import Status
from preflight.errors import UsageError
from preflight.runner import run_checks
from conftest import make_ctx


def test_builtin_shm_is_found_through_its_entry_point():
    assert "shm" in registry.names()
    check = registry.load("shm")
    assert type(check).__module__ == "preflight.checks.shm" and check.name == "shm"


def test_a_third_party_plugin_registers_the_same_way(plugin):
    assert {"passing", "failing", "hanging"} <= set(registry.names())
    assert registry.load("passing").name == "passing"


def test_unknown_names_are_refused_with_the_installed_list():
    with pytest.raises(UsageError, match=r"--only nosuch: no such check; installed checks: .*shm"):
        registry.check_names(["nosuch"], "--only")


def test_a_plugin_that_does_not_import_becomes_an_error_result(plugin):
    check = registry.load("broken")
    r = run_checks([check], make_ctx()).results[0]
    assert r.status is Status.ERROR and "ModuleNotFoundError" in r.summary
    assert "fakes_missing_module" in r.details["traceback"]


def test_a_plugin_whose_name_disagrees_with_its_entry_point_is_an_error(plugin):
    r = run_checks([registry.load("misnamed")], make_ctx()).results[0]
    assert r.status is Status.ERROR and "must agree" in r.summary
