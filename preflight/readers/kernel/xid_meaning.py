"""What each NVIDIA Xid / SXid event means: its severity, the action for a person, and the catalog buckets.

Meanings, severities and actions follow NVIDIA's Xid catalog, its "Description"
and "Resolution Bucket (Immediate Action)" columns:
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
(retrieved 2026-11-22). Each event carries its code's catalog buckets and the action
they ask on preflight's ladder (``XidInfo.act``, readers/kernel/xid_catalog.py). The bucket decides the severity: RESET_GPU,
RESTART_BM, RESTART_VM, CHECK_MECHANICALS, CONTACT_SUPPORT and the WORKFLOW_XID_48 /
NVLINK workflows are "fatal" (the node must not take a job); RESTART_APP, IGNORE
and WORKFLOW_XID_45 are "app" (a warning). Two deliberate departures: Xid 63
(catalog: IGNORE) is fatal because the driver's own line says "reset gpu to
activate" and a gate should not hand out a GPU with a pending remap; Xid 154
and 144-150 are judged from the text they print. SXid lines print "Fatal" or
"Non-fatal" themselves (NVIDIA Fabric Manager user guide, SXid tables).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_serializer

from preflight.base.actions import Action, Domain, Next
from preflight.readers.kernel import xid_catalog

Severity = Literal["fatal", "app", "info"]
CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


class XidInfo(BaseModel):
    model_config = ConfigDict(frozen=True)
    meaning: str
    severity: Severity
    action: str  # what to do, for a person
    # The catalog's "Resolution Bucket (Immediate Action)" and "(Investigatory Action)": "unknown"
    # where it names none, None for an event that is no Xid (an SXid, a failed initialisation).
    bucket: str | None = None
    investigate: str | None = None
    act: Next  # what automation does, whose fault it is, and where that comes from

    @field_serializer("act")
    def _act(self, n: Next) -> dict[str, str]:
        """By name, as the report says an action (a NamedTuple would dump as a bare list)."""
        return {"action": n.action.value, "domain": n.domain.value, "source": n.source}

# --- what each code means ------------------------------------------------------

RESET = ("reset the GPU (nvidia-smi -r) before the next job; reboot the node if the reset fails, "
         "and drain it for hardware inspection (RMA) if the error comes back")
REBOOT = "reboot the node (power cycle it); drain it for hardware inspection (RMA) if the error comes back"
RMA = "drain the node for hardware inspection (RMA)"
APP = "restart the application; if a known-good application hits it again, treat the GPU as suspect"
FOLLOW = "a consequence of another error: act on the Xid logged just before it"

_TABLE: dict[int, tuple[str, Severity, str]] = {
    8: ("GPU stopped processing", "app", APP),
    11: ("invalid or corrupted push buffer stream", "app", APP),
    13: ("graphics engine exception", "app", APP),
    31: ("GPU memory page fault (MMU fault)", "app", APP),
    32: ("invalid or corrupted push buffer stream", "app", APP),
    43: ("GPU stopped processing (reset channel verification error)", "app", FOLLOW),
    45: ("preemptive cleanup, due to previous errors", "app", FOLLOW),
    46: ("GPU stopped processing (timeout)", "fatal", RESET),
    48: ("double-bit ECC error (DBE)", "fatal", RESET + "; check the SRAM DBE threshold (nvidia-smi -q -d ECC)"),
    54: ("auxiliary power is not connected to the GPU board", "fatal", RMA + ": check its power connectors"),
    62: ("internal micro-controller halt", "fatal", RESET),
    63: ("GPU memory row remapping / page retirement pending: active only after a GPU reset", "fatal", RESET),
    64: ("GPU memory remapping or page retirement failed", "fatal", RMA + ": failing memory could not be retired"),
    69: ("graphics engine class error", "app", APP),
    74: ("NVLink error", "fatal", RESET + "; nvidia-smi nvlink -e shows the link errors"),
    79: ("GPU has fallen off the bus", "fatal", REBOOT),
    92: ("high single-bit ECC error rate (a precursor of double-bit errors)", "app",
         "keep running; drain for hardware inspection (RMA) if double-bit errors follow"),
    94: ("contained memory error: only the application that hit it was stopped", "app", APP),
    95: ("uncontained memory error", "fatal", RESET),
    109: ("context switch timeout", "fatal", RESET),
    110: ("security fault", "fatal", RESET),
    119: ("GSP RPC timeout", "fatal", RESET + "; if many nodes see it after a driver change, suspect the driver"),
    120: ("GSP error", "fatal", RESET + "; if many nodes see it after a driver change, suspect the driver"),
    121: ("C2C (chip-to-chip) link error", "app", "watch for repeats; drain for hardware inspection if they continue"),
    136: ("NVLink link training failed", "fatal", RESET),
    137: ("NVLink privilege error (an illegal peer-to-peer access by an application)", "app", APP),
    140: ("unrecovered ECC error", "fatal", RESET),
    143: ("GPU initialization error", "fatal", RESET),
    151: ("key rotation error (confidential computing)", "fatal", REBOOT),
    155: ("NVLink software-defined error", "fatal", RESET),
    156: ("resource retirement event", "fatal", RESET),
    157: ("resource retirement failure: no spare resources left", "app", RMA + " when convenient"),
    158: ("GPU fatal timeout", "fatal", RESET),
}
for _code, _unit in zip(range(144, 151), ("SAW", "RLW", "TLW", "TREX", "NVLPW_CTRL", "NETIR", "MSE")):
    _TABLE[_code] = (f"NVLink 5 {_unit} error", "fatal", RESET)

_RECOVERY = re.compile(r"to 0x[0-9a-f]+ \(([^)]*)\)", re.IGNORECASE)  # Xid 154's target action
_NONFATAL = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)


def explain(kind: str, code: int | None, message: str = "") -> XidInfo:
    """Meaning, severity, action and catalog buckets of one event; never raises."""
    if kind == "fell_off_bus":
        kind, code = "xid", 79
    if kind == "init_failed":
        return XidInfo(meaning="the GPU failed to initialise (RmInitAdapter failed)", severity="fatal", action=REBOOT,
                       act=Next(Action.REBOOT, Domain.NODE, "the driver could not initialise the GPU (RmInitAdapter "
                                "failed), which no reset of a GPU it never attached can clear: reboot"))
    if kind == "sxid":
        return _sxid(code, message)
    bucket, investigate = xid_catalog.buckets(code)
    if code == 154:  # "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
        target = (m.group(1) if (m := _RECOVERY.search(message)) else "").lower()
        meaning = f"the driver asks for a recovery action: {target or 'not printed'}"
        if target == "none":
            severity, action = "info", "nothing: the recovery is complete"
        elif target == "drain p2p":
            severity, action = "app", "let peer-to-peer work drain, then reset the GPU"
        else:
            severity, action = "fatal", REBOOT if "reboot" in target else RESET
        return XidInfo(meaning=meaning, severity=severity, action=action, bucket=bucket, investigate=investigate,
                       act=xid_catalog.act(code, bucket, severity, message, target))
    if code is None or code not in _TABLE:
        # A gate warns on what it cannot explain, rather than letting it pass unseen.
        return XidInfo(meaning=f"unknown Xid {code}: look it up in NVIDIA's Xid catalog ({CATALOG})",
                       severity="app", action="look the code up before the next job", bucket=bucket,
                       investigate=investigate, act=xid_catalog.act(code, bucket, "app", message))
    meaning, severity, action = _TABLE[code]
    if 144 <= code <= 150 and _NONFATAL.search(message):  # "145, RLW_REMAP Nonfatal XC0 i0 Link 02"
        severity, action = "app", "watch for repeats on the same link (nvidia-smi nvlink -e)"
    return XidInfo(meaning=meaning, severity=severity, action=action, bucket=bucket, investigate=investigate,
                   act=xid_catalog.act(code, bucket, severity, message))


_FM_GUIDE = "NVIDIA Fabric Manager user guide, SXid tables"


def _sxid(code: int | None, message: str) -> XidInfo:
    """An NVSwitch SXid: not in the Xid catalog; the line says itself whether it is fatal."""
    if _NONFATAL.search(message):
        return XidInfo(meaning=f"NVSwitch SXid {code}, non-fatal: the switch recovered", severity="app",
                       action="watch for repeats on the same link (nvidia-smi nvlink -e)",
                       act=Next(Action.WATCH, Domain.NODE, f"{_FM_GUIDE}: SXid {code} printed Non-fatal, the switch recovered"))
    if re.match(r"\s*Fatal\b", message):
        return XidInfo(meaning=f"NVSwitch SXid {code}, fatal", severity="fatal",
                       action="reboot the node (it resets the NVSwitches and GPUs); " + RMA + " if it comes back",
                       act=Next(Action.REBOOT, Domain.NODE, f"{_FM_GUIDE}: SXid {code} printed Fatal; a reboot resets the NVSwitches and GPUs"))
    return XidInfo(meaning=f"NVSwitch SXid {code} (fatal or not is not printed): look it up in the "
                   "SXid tables of NVIDIA's Fabric Manager user guide", severity="app",
                   action="look up the SXid before the next job",
                   act=Next(Action.WATCH, Domain.NODE, f"{_FM_GUIDE}: SXid {code} printed neither Fatal nor Non-fatal: watched until looked up"))
