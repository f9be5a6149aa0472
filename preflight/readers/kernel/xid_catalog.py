"""NVIDIA's Xid catalog as data: each code's "Resolution Bucket (Immediate Action)" and
"Resolution Bucket (Investigatory Action)", and what each immediate bucket asks of
preflight's ladder (base/actions.py).

The rows are the catalog's "Xids" sheet, https://docs.nvidia.com/deploy/xid-errors/
analyzing-xid-catalog.html, retrieved 2026-11-22 (DATE), copied bucket for bucket: the
names are the catalog's own (CHECK_APP/CUDA, "IGNORE (sympathetic)", "N/A; Unused" and
the rest). A code the catalog gives no bucket (162-172: prose or nothing where the
bucket goes) or does not list is "unknown", never a guess.

The catalog says what the immediate bucket is for: "an automatable action that
administrators can perform to recover the system from Xid error, and ready the system
for new applications". So the immediate bucket decides the action; the investigatory
one is for a person when the Xid comes back, and is kept beside it.
"""

from __future__ import annotations

import re

from preflight.base.actions import LADDER, Action, Domain, Next

DATE = "2026-11-22"
URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
UNKNOWN = "unknown"

# code(s) | immediate | investigatory ("" where the row leaves it empty)
_ROWS = """
1-7 | CONTACT_SUPPORT | N/A; Unused
8 | RESTART_APP | CONTACT_SUPPORT
9-10 | CONTACT_SUPPORT | N/A; Unused
11 | RESTART_APP | CHECK_APP/CUDA
12 | CONTACT_SUPPORT | N/A; Unused
13 | RESTART_APP | WORKFLOW_XID_13
14 | IGNORE | CONTACT_SUPPORT
15 | CONTACT_SUPPORT | N/A; Unused
16 | CONTACT_SUPPORT | CONTACT_SUPPORT
17-24 | CONTACT_SUPPORT | N/A; Unused
25 | RESTART_APP | CHECK_APP/CUDA
26-30 | CONTACT_SUPPORT | N/A; Unused
31 | RESTART_APP | WORKFLOW_XID_31
32 | RESTART_APP | CHECK_APP/CUDA
33-36 | CONTACT_SUPPORT | N/A; Unused
37 | IGNORE | CHECK_APP/CUDA
38 | IGNORE | CONTACT_SUPPORT
39-41 | RESTART_APP | CONTACT_SUPPORT
42 | CONTACT_SUPPORT | N/A; Unused
43-44 | IGNORE | CONTACT_SUPPORT
45 | WORKFLOW_XID_45 | Solo: RESTART_FM Not Solo: IGNORE (follow other Xid)
46 | RESET_GPU | CONTACT_SUPPORT
47 | CONTACT_SUPPORT | N/A; Unused
48 | WORKFLOW_XID_48 | WORKFLOW_XID_48
49-53 | CONTACT_SUPPORT | N/A; Unused
54 | CHECK_MECHANICALS | CONTACT_SUPPORT
55-59 | CONTACT_SUPPORT | N/A; Unused
60 | RESTART_APP | INVESTIGATE_SW
61 | CONTACT_SUPPORT | N/A; Unused
62 | RESET_GPU | CONTACT_SUPPORT
63 | IGNORE | IGNORE
64 | RESET_GPU | CONTACT_SUPPORT
65 | CONTACT_SUPPORT | N/A; Unused
66 | IGNORE | INVESTIGATE_SW
67 | IGNORE | CONTACT_SUPPORT
68 | RESTART_APP | CONTACT_SUPPORT
69 | RESTART_APP | CHECK_APP/CUDA
70-72 | RESTART_APP | CONTACT_SUPPORT
73 | CONTACT_SUPPORT | N/A; Unused
74 | WORKFLOW_NVLINK_ERR | CONTACT_SUPPORT
75-77 | RESTART_APP | CONTACT_SUPPORT
78 | UPDATE_SWFW | UPDATE_SWFW
79 | RESTART_BM | CONTACT_SUPPORT
80 | RESTART_APP | CHECK_APP/CUDA
81 | CONTACT_SUPPORT | N/A; Unused
82-86 | RESTART_APP | CONTACT_SUPPORT
87 | CONTACT_SUPPORT | N/A; Unused
88-89 | RESTART_APP | CONTACT_SUPPORT
90-91 | CONTACT_SUPPORT | N/A; Unused
92-93 | IGNORE | CONTACT_SUPPORT
94 | RESTART_APP | IGNORE (sympathetic)
95 | RESET_GPU | IGNORE (sympathetic)
96-105 | RESTART_APP | CONTACT_SUPPORT
106-107 | IGNORE | IGNORE
108 | IGNORE | XID_137_FLOW
109 | RESET_GPU | CONTACT_SUPPORT
110 | RESET_GPU | INVESTIGATE_SW
111-118 | CONTACT_SUPPORT | N/A; Unused
119-120 | RESET_GPU | INVESTIGATE_SW
121 | IGNORE | CONTACT_SUPPORT
122-125 | CONTACT_SUPPORT | N/A; Unused
126-135 | RESTART_APP | CONTACT_SUPPORT
136 | RESET_GPU | INVESTIGATE_LINK_SI
137 | IGNORE | XID_137_FLOW
138 | CONTACT_SUPPORT | N/A; Unused
139 | RESTART_APP | CONTACT_SUPPORT
140 | RESET_GPU | CONTACT_SUPPORT
141 | IGNORE | CONTACT_SUPPORT
142 | CONTACT_SUPPORT |
143 | RESET_GPU | CONTACT_SUPPORT
144-150 | WORKFLOW_NVLINK5_ERR | WORKFLOW_NVLINK5_ERR
151 | RESTART_VM | CONTACT_SUPPORT
152-153 | IGNORE | CONTACT_SUPPORT
154 | XID_154 | N/A Informational only regarding another Xid
155 | RESET_GPU | INVESTIGATE_SW_USER
156 | RESET_GPU | IGNORE
157 | IGNORE | CONTACT_SUPPORT
158 | RESET_GPU | CONTACT_SUPPORT
159 | CHECK_UVM | SYMPATHETIC_REPORT_SOLO
160-161 | IGNORE | INVESTIGATE_SW
162-172 | unknown | unknown
"""


def _table() -> dict[int, tuple[str, str | None]]:
    out: dict[int, tuple[str, str | None]] = {}
    for row in filter(None, (r.strip() for r in _ROWS.splitlines())):
        codes, immediate, investigate = (p.strip() for p in row.split("|"))
        first, _, last = codes.partition("-")
        for code in range(int(first), int(last or first) + 1):
            out[code] = (immediate, investigate or None)
    return out


BUCKETS = _table()


def buckets(code: int | None) -> tuple[str, str | None]:
    """(immediate, investigatory) as the catalog names them; "unknown" where it names none."""
    return BUCKETS.get(code, (UNKNOWN, UNKNOWN)) if code is not None else (UNKNOWN, UNKNOWN)


def cite(code: int | None, bucket: str, more: str = "") -> str:
    """How a Next names its source: the catalog, its date, the code and the bucket."""
    return f"NVIDIA Xid catalog ({DATE}): Xid {code} {bucket}" + (f"; {more}" if more else "")


# Each immediate bucket on preflight's ladder, and why, from the catalog's own "Fault
# Resolution Buckets" wording (quoted). A bucket that needs the event's text or its
# neighbours (the workflows, XID_154) is decided in ``act``.
_LADDER: dict[str, tuple[Action, Domain, str]] = {
    # "The application should be restarted; RESET_GPU or RESTART_BM is not deemed necessary":
    # what acts is the job's owner, and the node is fine, so the job's domain; fix-job rather
    # than watch because the job that hit it failed and has to be dealt with (its investigatory
    # buckets, CHECK_APP/CUDA and WORKFLOW_XID_13/31, look at the application first).
    "RESTART_APP": (Action.FIX_JOB, Domain.JOB, "the application restarts; the GPU needs no reset"),
    # "No Action required": nothing to do now; a note in case it recurs.
    "IGNORE": (Action.WATCH, Domain.NODE, "no action required"),
    "RESET_GPU": (Action.RESET_GPU, Domain.NODE, "reset the GPU"),
    # "Restart bare metal, system should be restarted."
    "RESTART_BM": (Action.REBOOT, Domain.NODE, "restart the machine"),
    # "VM owning the affected GPU must be restarted": on a VM that is the node's reboot.
    "RESTART_VM": (Action.REBOOT, Domain.NODE, "restart the VM that owns the GPU"),
    # "Check to ensure that device seating and all applicable connections to it are secure":
    # hands on the hardware.
    "CHECK_MECHANICALS": (Action.SERVICE, Domain.NODE, "check the GPU's seating and connections"),
    # "Please contact your support organization for further investigation."
    "CONTACT_SUPPORT": (Action.SERVICE, Domain.NODE, "contact support"),
    # "Update Firmware and Software to latest versions": the node takes no job until a person
    # has, and the fault is the driver stack's.
    "UPDATE_SWFW": (Action.DRAIN, Domain.SOFTWARE, "update the driver and firmware"),
    # Xid 74's own row: "A GPU reset or node reboot is needed to clear this error"; the
    # workflow's register decode refines the investigation, not the recovery.
    "WORKFLOW_NVLINK_ERR": (Action.RESET_GPU, Domain.NODE, "its row: a GPU reset or node reboot is needed to clear it"),
    # The workflow's Data Center Recovery Action: "Solo: RESET_GPU; w/ 63 or 64: DRAIN_AND_RESET":
    # a reset either way.
    "WORKFLOW_XID_48": (Action.RESET_GPU, Domain.NODE, "solo: RESET_GPU, with Xid 63 or 64: DRAIN_AND_RESET"),
    # "Solo: RESTART_FM; Not Solo: IGNORE (follow guidance in other Xid)". Its trigger text says
    # the event is mostly an application aborted by a user or the system (Control-C, SIGKILL,
    # a GPU reset), and beside another Xid that one decides: watched, never more on its own.
    "WORKFLOW_XID_45": (Action.WATCH, Domain.NODE, "solo: RESTART_FM (restart nvidia-fabricmanager), "
                        "not solo: IGNORE (follow the other Xid)"),
    # "If UVM/vGPU is being utilized, RESET_GPU; otherwise IGNORE": every CUDA job loads
    # nvidia-uvm, so a training node uses UVM.
    "CHECK_UVM": (Action.RESET_GPU, Domain.NODE, "UVM is in use on a CUDA node: RESET_GPU"),
}

# Xid 154 names the driver's own recovery action (the same words as NVML's
# nvmlDeviceGpuRecoveryAction): the action is the one it names.
RECOVERY: dict[str, tuple[Action, str]] = {
    "none": (Action.NONE, "the recovery is complete"),
    "gpu reset required": (Action.RESET_GPU, "the driver asks for a GPU reset"),
    "node reboot required": (Action.REBOOT, "the driver asks for a node reboot"),
    # NVML: quiesce peer-to-peer traffic, then read the recovery action again, "which will
    # return one of the other actions": a step on the way, watched until the next one is known.
    "drain p2p": (Action.WATCH, "the driver asks that peer-to-peer traffic drain; the next recovery action follows"),
    "drain and reset": (Action.RESET_GPU, "the driver asks that peer-to-peer traffic drain, then a GPU reset"),
}

_NONFATAL = re.compile(r"\bnon-?fatal\b", re.IGNORECASE)
# The ceiling a warning may ask and the floor a failure must: a WARN never takes the node
# out of service, a FAIL always does.
_WARN_CEILING, _FAIL_FLOOR = Action.FIX_JOB, Action.DRAIN


def act(code: int | None, bucket: str, severity: str, message: str = "", target: str | None = None) -> Next:
    """What the catalog's immediate ``bucket`` for Xid ``code`` asks, for an event preflight
    judges of ``severity``. ``target``: Xid 154's printed recovery action, lowercased."""
    if bucket == "XID_154":
        action, why = RECOVERY.get(target or "", (Action.DRAIN, f"the recovery action it names ({target or 'not printed'}) is not one the catalog lists"))
        n = Next(action, Domain.NODE, cite(code, bucket, why))
    elif bucket == "WORKFLOW_NVLINK5_ERR":
        # The workflow decodes the message's registers with the "XID 144-150 Decode" sheet, whose
        # fatal rows are RESET_GPU and whose non-fatal rows IGNORE (or follow a Xid 154); the
        # driver prints which it is.
        fatal = not _NONFATAL.search(message)
        n = Next(Action.RESET_GPU if fatal else Action.WATCH, Domain.NODE,
                 cite(code, bucket, "its decode: a fatal error is RESET_GPU" if fatal else "its decode: a non-fatal error is IGNORE"))
    elif code == 63:
        # The one departure: the catalog says IGNORE, but the driver's own line says "reset gpu
        # to activate", and a gate does not hand out a GPU with a remap pending.
        n = Next(Action.RESET_GPU, Domain.NODE, cite(code, bucket, 'preflight resets: the driver says "reset gpu to activate" the remap'))
    elif bucket in _LADDER:
        action, domain, why = _LADDER[bucket]
        n = Next(action, domain, cite(code, bucket, why))
    else:
        n = Next(Action.WATCH, Domain.NODE, cite(code, UNKNOWN, "the catalog names no bucket for it: watched"))
    return within(n, severity)


def within(n: Next, severity: str) -> Next:
    """``n`` kept within what preflight's severity for the event allows, saying so where it is
    not: a code preflight cannot explain (one the catalog lists as unused on Ampere and newer,
    an older GPU's) only warns, and its CONTACT_SUPPORT is then no reason to take the node out."""
    rank = LADDER.index(n.action)
    if severity == "app" and rank > LADDER.index(_WARN_CEILING):
        return Next(Action.WATCH, n.domain, f"{n.source}; preflight only warns of this event, so it is watched")
    if severity == "fatal" and rank < LADDER.index(_FAIL_FLOOR):
        return Next(_FAIL_FLOOR, n.domain, f"{n.source}; preflight fails the node on this event, so it is drained")
    if severity == "info" and n.action != Action.NONE:
        return Next(Action.NONE, n.domain, n.source)
    return n
