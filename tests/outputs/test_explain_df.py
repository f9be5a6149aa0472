"""`preflight explain` of `df` output: /dev/shm judged by the shm check's own
judge against the profile's floor, or the least floor any built-in sets where none is named."""

import pytest
from conftest import FIXTURES

from preflight.base.errors import UsageError
from preflight.checkkit import shm_judges
from preflight.outputs.explain import explain_df
from preflight.pipeline import profiles
from preflight.readers.system.shm_mount import Mount

HERE = FIXTURES / "df"
MiB, GiB = 2**20, 2**30


def profile(name: str) -> profiles.ResolvedProfile:
    path = profiles.find(name, None)
    return profiles.resolve(profiles.load(path), path, {}, f"--profile {name}")


def explained(name: str, p: str | None = None):
    (path,) = HERE.glob(name + "*")
    return explain_df.explain(path.read_text(), path.name, profile(p) if p else None)


def test_dockers_64m_fails_with_the_shm_checks_words_against_the_generic_floor():
    e = explained("shm_01_")
    assert (e.kind, e.title) == ("df", "df output") and e.failed
    fail, info = e.findings
    assert (fail.severity, fail.summary) == ("fail", "/dev/shm is 64 MiB, below the 1 GiB floor")
    assert "Docker's default --shm-size" in fail.cause
    assert "--shm-size=1g" in fail.fix and "--ipc=host" in fail.fix and "medium: Memory" in fail.fix
    assert info.severity == "info" and info.summary == "/dev/shm: 64 MiB, 64 MiB free (shm); the floor is 1 GiB"
    assert e.facts["floor_profile"] == "cpu" and e.facts["floor_bytes"] == GiB
    assert e.facts["floor_from"].startswith("no --profile given: the least floor, profile cpu's")
    assert "NGC" in e.facts["floor_source"]
    assert e.facts["shm"]["size_bytes"] == 64 * MiB and e.facts["layout"] == "human" and len(e.facts["rows"]) == 10


def test_one_judge_two_readers_the_df_finding_is_the_checks_finding():
    e = explained("shm_01_")
    facts = shm_judges.ShmFacts(path="/dev/shm", exists=True, mount=Mount("/dev/shm", "tmpfs", "shm", []), size_bytes=64 * MiB, free_bytes=64 * MiB)
    (live,), _ = shm_judges.judge(facts, GiB)
    assert (e.findings[0].summary, e.findings[0].cause, e.findings[0].fix) == (live.summary, live.cause, live.remedy)


def test_a_gpu_profile_judges_by_its_own_floor():
    e = explained("shm_01_", "h100-sxm")
    assert e.findings[0].summary == "/dev/shm is 64 MiB, below the 16 GiB floor" and "--shm-size=16g" in e.findings[0].fix
    assert e.facts["floor_profile"] == "h100-sxm" and e.facts["floor_from"].startswith("profile h100-sxm (profile ")


@pytest.mark.parametrize("name", ["shm_02_", "shm_04_"])
def test_df_k_and_df_t_read_the_same_64m(name):
    assert explained(name).findings[0].summary == "/dev/shm is 64 MiB, below the 1 GiB floor"


def test_df_t_names_the_filesystem_type_and_judges_it():
    e = explained("shm_04_")
    assert e.facts["filesystem_type"] == "tmpfs" and [i.severity for i in e.findings] == ["fail", "info"]
    overlay = explained("shm_05_")
    (fail, info) = overlay.findings
    assert (fail.severity, fail.summary) == ("fail", "/dev/shm is overlay, not tmpfs") and "not be backed by RAM" in fail.cause
    assert "(overlay overlay)" in info.summary


def test_a_big_enough_dev_shm_that_is_nearly_full_fails_on_free_space():
    e = explained("shm_03_", "h100-sxm")
    (fail, _) = e.findings
    assert fail.summary == "only 512 MiB of /dev/shm is free, below the 16 GiB floor" and "stale segments" in fail.fix


def test_a_wrapped_listing_with_a_healthy_dev_shm_passes_against_the_generic_floor():
    e = explained("shm_06_")
    assert not e.failed and [i.severity for i in e.findings] == ["info"]
    assert e.findings[0].summary == "/dev/shm: 15.5 GiB, 15.5 GiB free (tmpfs); the floor is 1 GiB"


def test_a_grepd_row_is_judged_too():
    e = explained("shm_07_")
    assert e.failed and e.findings[0].summary == "/dev/shm is 64 MiB, below the 1 GiB floor"


def test_df_h_rounding_up_to_the_floor_is_said():
    text = "Filesystem      Size  Used Avail Use% Mounted on\ntmpfs            16G     0   16G   0% /dev/shm\n"
    e = explain_df.explain(text, "df.txt", profile("h100-sxm"))
    assert not e.failed
    (note, _) = e.findings
    assert note.severity == "info" and "df -h rounds up" in note.summary and "more than 15 GiB and at most 16 GiB" in note.cause
    assert note.fix == "run `df -B1 /dev/shm` for the exact size"
    assert [i.severity for i in explain_df.explain(text.replace("16G", "17G"), "df.txt", profile("h100-sxm")).findings] == ["info"]


def test_a_tmpfs_without_a_size_limit_is_not_judged_by_size():
    text = "Filesystem     1K-blocks  Used Available Use% Mounted on\ntmpfs                  0     0         0    - /dev/shm\n"
    e = explain_df.explain(text, "df.txt", None)
    assert not e.failed and e.findings[0].summary.startswith("/dev/shm: not limited (size=0)")


def test_no_dev_shm_row_is_one_line_usage_error():
    text = "Filesystem      Size  Used Avail Use% Mounted on\noverlay         3.9T   34G  3.9T   1% /\n"
    with pytest.raises(UsageError) as e:
        explain_df.explain(text, "df.txt", None)
    assert str(e.value) == "df.txt: the df output has no /dev/shm row; run `df -h /dev/shm`"
    with pytest.raises(UsageError) as e:
        explain_df.explain("hello\n", "notes.txt", None)
    assert str(e.value).startswith("notes.txt: holds no df output") and "\n" not in str(e.value)
