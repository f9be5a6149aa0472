import pytest

from preflight.base.units import format_cpulist, parse_cpulist


@pytest.mark.parametrize("text, cpus", [
    ("0-23,48-71", [*range(0, 24), *range(48, 72)]),
    ("0", [0]),
    ("0-1,3,5-7", [0, 1, 3, 5, 6, 7]),
])
def test_cpulist_round_trips(text, cpus):
    assert parse_cpulist(text) == cpus
    assert format_cpulist(cpus) == text
    assert format_cpulist(set(reversed(cpus))) == text


@pytest.mark.parametrize("text", ["", "a-b", "5-3", "1,,2"])
def test_parse_cpulist_rejects_what_is_not_a_cpu_list(text):
    with pytest.raises(ValueError, match="is not a CPU list"):
        parse_cpulist(text)
