"""What each Xid / SXid event means: the code table, and the catalog's buckets with the
action each asks (readers/kernel/xid_meaning.py)."""

import pytest
from conftest import FIXTURES

from preflight.base.actions import LADDER, Action, Domain, Next
from preflight.readers.kernel import xid_catalog, xid_meaning
from preflight.readers.kernel.xid import XidEvent, parse
from preflight.readers.kernel.xid_meaning import explain

XID = FIXTURES / "xid"


def events(name: str) -> list[XidEvent]:
    (path,) = XID.glob(name + "*")
    return parse(path.read_text(encoding="utf-8"))


# --- the code table -------------------------------------------------------------

@pytest.mark.parametrize("code, severity", [
    (13, "app"), (31, "app"), (43, "app"), (45, "app"), (69, "app"), (92, "app"), (94, "app"),
    (46, "fatal"), (48, "fatal"), (63, "fatal"), (64, "fatal"), (74, "fatal"), (79, "fatal"), (95, "fatal"),
    (109, "fatal"), (110, "fatal"), (119, "fatal"), (120, "fatal"), (140, "fatal"), (143, "fatal"),
    (144, "fatal"), (150, "fatal"), (158, "fatal"),
])
def test_severity_follows_the_catalog(code, severity):
    info = explain("xid", code)
    assert info.severity == severity and info.meaning and info.action


def test_fatal_actions_say_reset_reboot_or_drain():
    for code in (46, 48, 63, 64, 74, 79, 95, 109, 119, 140, 143, 145):
        assert explain("xid", code).action.startswith(("reset the GPU", "reboot the node", "drain the node"))


def test_unknown_codes_warn_and_point_at_the_catalog():
    info = explain("xid", 999)
    assert info.severity == "app"
    assert info.meaning.startswith("unknown Xid 999: look it up in NVIDIA's Xid catalog")


@pytest.mark.parametrize("target, severity", [
    ("0x0 (None)", "info"), ("0x3 (Drain P2P)", "app"), ("0x1 (GPU Reset Required)", "fatal"),
    ("0x2 (Node Reboot Required)", "fatal"), ("0x4 (Drain and Reset)", "fatal"), ("", "fatal"),
])
def test_xid_154_is_judged_by_the_action_it_names(target, severity):
    message = f"GPU recovery action changed from 0x1 (GPU Reset Required) to {target}" if target else "garbled"
    assert explain("xid", 154, message).severity == severity


def test_init_failure_is_fatal():
    assert explain("init_failed", None).severity == "fatal"


# --- the catalog's buckets and the action each asks --------------------------------

CITED = "NVIDIA Xid catalog (2026-11-22): Xid "
# Every immediate bucket the catalog's "Xids" sheet names, as it spells them.
IMMEDIATE = {"RESTART_APP", "RESET_GPU", "RESTART_BM", "RESTART_VM", "CHECK_MECHANICALS", "CONTACT_SUPPORT", "IGNORE",
             "UPDATE_SWFW", "CHECK_UVM", "XID_154", "WORKFLOW_XID_45", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
             "WORKFLOW_NVLINK5_ERR"}


@pytest.mark.parametrize("name", sorted(p.name for p in XID.glob("*.txt")))
def test_every_event_in_the_fixtures_gets_its_catalog_bucket_and_an_action(name):
    for e in events(name):
        info = e.info
        assert info.act.source and info.act.source != "not judged", (name, e.line)
        if e.kind in ("xid", "fell_off_bus"):
            code = 79 if e.kind == "fell_off_bus" else e.code
            assert info.bucket in IMMEDIATE, (name, e.line, code, info.bucket)  # never "unknown" for a fixture's code
            assert info.investigate and info.investigate != xid_catalog.UNKNOWN
            assert info.act.source.startswith(f"{CITED}{code} {info.bucket}")
        else:  # an SXid or a failed initialisation is no Xid: no bucket, and the action says where it comes from
            assert info.bucket is None and info.act.source


def test_the_catalog_rows_cover_every_code_it_lists_and_name_only_its_buckets():
    assert sorted(xid_catalog.BUCKETS) == list(range(1, 173))
    named = {b for b, _ in xid_catalog.BUCKETS.values()}
    assert named == IMMEDIATE | {"unknown"}
    assert xid_catalog.buckets(162) == ("unknown", "unknown") == xid_catalog.buckets(999) == xid_catalog.buckets(None)
    assert xid_catalog.buckets(45) == ("WORKFLOW_XID_45", "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)")
    assert xid_catalog.buckets(142) == ("CONTACT_SUPPORT", None)  # the row leaves the investigatory bucket empty


def test_every_code_preflight_explains_has_its_catalog_bucket():
    for code in xid_meaning._TABLE:
        assert explain("xid", code).bucket in IMMEDIATE, code


@pytest.mark.parametrize("code, bucket, investigate, action, domain", [
    (79, "RESTART_BM", "CONTACT_SUPPORT", Action.REBOOT, Domain.NODE),
    (48, "WORKFLOW_XID_48", "WORKFLOW_XID_48", Action.RESET_GPU, Domain.NODE),
    (54, "CHECK_MECHANICALS", "CONTACT_SUPPORT", Action.SERVICE, Domain.NODE),
    (74, "WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT", Action.RESET_GPU, Domain.NODE),
    (109, "RESET_GPU", "CONTACT_SUPPORT", Action.RESET_GPU, Domain.NODE),
    (151, "RESTART_VM", "CONTACT_SUPPORT", Action.REBOOT, Domain.NODE),
    (13, "RESTART_APP", "WORKFLOW_XID_13", Action.FIX_JOB, Domain.JOB),
    (31, "RESTART_APP", "WORKFLOW_XID_31", Action.FIX_JOB, Domain.JOB),
    (94, "RESTART_APP", "IGNORE (sympathetic)", Action.FIX_JOB, Domain.JOB),
    (43, "IGNORE", "CONTACT_SUPPORT", Action.WATCH, Domain.NODE),
    (45, "WORKFLOW_XID_45", "Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)", Action.WATCH, Domain.NODE),
    (63, "IGNORE", "IGNORE", Action.RESET_GPU, Domain.NODE),  # the departure: "reset gpu to activate"
])
def test_each_code_takes_its_buckets_action_citing_code_bucket_and_date(code, bucket, investigate, action, domain):
    info = explain("xid", code)
    assert (info.bucket, info.investigate, info.act.action, info.act.domain) == (bucket, investigate, action, domain)
    assert info.act.source.startswith(f"NVIDIA Xid catalog (2026-11-22): Xid {code} {bucket}")


@pytest.mark.parametrize("target, action", [
    ("0x0 (None)", Action.NONE), ("0x3 (Drain P2P)", Action.WATCH), ("0x1 (GPU Reset Required)", Action.RESET_GPU),
    ("0x2 (Node Reboot Required)", Action.REBOOT), ("0x4 (Drain and Reset)", Action.RESET_GPU), ("", Action.DRAIN),
])
def test_xid_154_acts_on_the_recovery_action_it_prints(target, action):
    message = f"GPU recovery action changed from 0x1 (GPU Reset Required) to {target}" if target else "garbled"
    info = explain("xid", 154, message)
    assert (info.bucket, info.act.action, info.act.domain) == ("XID_154", action, Domain.NODE)
    assert info.act.source.startswith("NVIDIA Xid catalog (2026-11-22): Xid 154 XID_154")


def test_nvlink5_xids_act_on_the_fatal_or_non_fatal_they_print():
    fatal = explain("xid", 144, "SAW_MVB Fatal XC0 i0 Link -1 (0x00000021 0x00000002 ...)")
    nonfatal = explain("xid", 145, "RLW_REMAP Nonfatal XC0 i0 Link 02")
    assert (fatal.act.action, nonfatal.act.action) == (Action.RESET_GPU, Action.WATCH)


def test_a_code_the_catalog_lists_unused_is_watched_not_serviced_as_preflight_only_warns():
    info = explain("xid", 3)  # an older driver's code: "Unused" on Ampere and newer, CONTACT_SUPPORT
    assert (info.severity, info.bucket, info.investigate) == ("app", "CONTACT_SUPPORT", "N/A; Unused")
    assert info.act.action == Action.WATCH and "only warns" in info.act.source
    unknown = explain("xid", 165)  # listed, with prose where the bucket goes
    assert (unknown.bucket, unknown.act.action) == ("unknown", Action.WATCH)
    assert unknown.act.source.startswith("NVIDIA Xid catalog (2026-11-22): Xid 165 unknown")


def test_the_action_never_contradicts_the_severity():
    """A warning never takes the node out of service; a failure always does; information asks nothing."""
    fix_job, drain = LADDER.index(Action.FIX_JOB), LADDER.index(Action.DRAIN)
    messages = ["", "Nonfatal", "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)"]
    for code in [*range(1, 200), None]:
        for message in messages:
            info = explain("xid", code, message)
            rank = LADDER.index(info.act.action)
            assert {"app": rank <= fix_job, "fatal": rank >= drain, "info": info.act.action == Action.NONE}[info.severity], (code, message)


def test_sxids_and_failed_initialisation_act_on_what_they_print():
    assert explain("sxid", 24007, "Fatal, Link 10 ...").act.action == Action.REBOOT
    assert explain("sxid", 20009, "Non-fatal, Link 04 ...").act.action == Action.WATCH
    assert explain("sxid", 26006, "SOE HALTED").act.action == Action.WATCH
    assert explain("init_failed", None).act == Next(Action.REBOOT, Domain.NODE, explain("init_failed", None).act.source)
