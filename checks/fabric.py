"""The NVSwitch fabric: the fabric manager running, every GPU registered with
the fabric, every NVSwitch of the board on the PCI bus.

On an HGX/DGX baseboard the GPUs are wired to NVSwitches, not to each other,
and nothing crosses them until nvidia-fabricmanager has programmed the
switches. With it stopped (or of another version than the driver: it exits at
start), CUDA init fails with "system not yet initialized" (cudaErrorSystemNotReady)
or the GPUs come up without NVLink peers. Hopper and newer GPUs tell NVML how
their registration went (nvmlDeviceGetGpuFabricInfo); a switch that fell off
the bus shows as a missing NVIDIA bridge in sysfs.
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from preflight.base.findings import Finding, Status, worst
from preflight.base.host import Host, tool_time
from preflight.base.units import format_cpulist
from preflight.checkkit import settle
from preflight.checkkit.sources import Sources
from preflight.pipeline.check import Check, Context, Result
from preflight.pipeline.expectations import FabricExpect
from preflight.pipeline.shape import FABRIC_WORDS, NodeShape
from preflight.readers.nvidia import nvml, nvml_facts
from preflight.readers.nvidia.nvml_facts import Gpu, Inventory

FAIL, WARN = Status.FAIL, Status.WARN
UNIT = "nvidia-fabricmanager"
DAEMON = "nv-fabricmanager"
COMM = DAEMON[:15]  # its /proc/PID/comm: the kernel keeps 15 characters of a name
SYSTEMCTL_TIMEOUT = 5.0
START_FM = ("start the fabric manager: `systemctl enable --now nvidia-fabricmanager`; its version must equal the driver's "
            "({driver}) or it exits at start (`journalctl -u nvidia-fabricmanager`, /var/log/fabricmanager.log)")


class Manager(BaseModel):
    state: Literal["running", "stopped", "unknown"]
    how: str  # how that was learnt, or why it could not be
    systemd: str | None = None  # `systemctl is-active`'s word where it gave one ("activating": still starting)
    unread: str | None = None  # why `systemctl is-active`'s answer could not be used, where it ran and gave none


class FabricFacts(BaseModel):
    manager: Manager
    inventory: Inventory


# ---- gathering -------------------------------------------------------------


SYSTEMCTL = f"systemctl is-active {UNIT}"
STATES = ("active", "inactive", "failed", "activating", "deactivating", "reloading")  # systemctl is-active's words


def manager_state(host: Host, timeout: float = SYSTEMCTL_TIMEOUT, skip: str | None = None) -> Manager:
    """Whether nv-fabricmanager runs: systemd's word, else its process. Where systemctl
    ran and gave no word (nothing, garbage, an error, a hang), or was not run (``skip``:
    why), ``unread`` says so: the process, and the GPUs' own fabric registration, answer
    in its place."""
    why, unread = "systemctl is not installed", None
    exe = shutil.which("systemctl", path=host.environ.get("PATH", os.defpath))
    if exe and skip:
        why, unread = f"`{SYSTEMCTL}` {skip}", skip
    elif exe:
        try:
            done = host.run([exe, "is-active", UNIT], timeout, cwd="/")
        except OSError as e:  # vanished, or not executable here: systemd's word is unknown, not an error of the check
            done, why = None, f"systemctl could not run ({e.strerror or e})"
            unread = why
        word = (done.stdout.strip().splitlines() or [""])[0].strip() if done else ""
        if done is not None and done.timed_out:
            why = f"`{SYSTEMCTL}` did not answer within {timeout:g} s"
            unread = f"did not answer within {timeout:g} s"
        elif word == "active":
            return Manager(state="running", how=f"systemd unit {UNIT} active", systemd=word)
        elif word in STATES:
            # systemd answers for its own units only: a daemon started by hand (or by a
            # container's entrypoint) runs beside an inactive unit, or beside one that failed at
            # boot and was then started by hand. Only root's daemon counts (is_daemon: uid 0, an
            # executable no one else may write), never a process another user named so.
            pid = process(host)
            if pid is not None:
                return Manager(state="running", how=f"process {DAEMON} (pid {pid}), systemd unit {UNIT} {word}", systemd=word)
            return Manager(state="stopped", how=f"systemd unit {UNIT} is {word}", systemd=word)
        elif word == "unknown":  # older systemd's word for a unit it has not loaded: an answer, not garbage
            why = f"systemd does not know the unit {UNIT}"
        elif done is not None and (err := done.stderr.strip().splitlines()):
            why = "systemctl cannot tell: " + err[-1]  # "System has not been booted with systemd", no D-Bus in a container
            unread = f"exit {done.returncode}: {err[-1]}"
        elif done is not None:
            said = f"printed {word[:40]!r}, not a unit state" if word else "printed nothing"
            why = f"`{SYSTEMCTL}` {said} (exit {done.returncode})"
            unread = f"{said} (exit {done.returncode})"
    pid = process(host)
    if pid is not None:
        return Manager(state="running", how=f"process {DAEMON} (pid {pid})", unread=unread)
    # Without systemd (a container) /proc shows this container's processes only: absence proves nothing.
    return Manager(state="unknown", how=f"{why}, and no {DAEMON} process is visible here", unread=unread)


def process(host: Host) -> int | None:
    """The pid of the first fabric manager daemon in /proc (``is_daemon``), or None."""
    try:
        entries = [p for p in host.path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return None
    for entry in sorted(entries, key=lambda p: int(p.name)):
        if is_daemon(entry):
            return int(entry.name)
    return None


def is_daemon(proc: Path) -> bool:
    """Whether /proc/PID ``proc`` is a fabric manager only root could have started. Its name
    proves nothing: any user can run a copy of sleep called nv-fabricmanager, or rename a
    process (PR_SET_NAME), and so hide a stopped manager where nothing else answers (A100
    has no NVML fabric state; a Kubernetes DaemonSet has no systemctl). Root's daemon runs
    with real uid 0 (status's Uid: real effective saved fs, which no process can change)
    from a file owned by root that no one else may write (else anyone could have put
    their program there)."""
    try:
        if (proc / "comm").read_text().strip() != COMM:
            return False
        with open(proc / "status", "rb") as f:
            uid = next((line.split()[1:2] for line in f.read(4096).splitlines() if line.startswith(b"Uid:")), None)
        exe = os.stat(proc / "exe")  # the file it runs, even where it was replaced on disk since
    except OSError:
        return False  # gone meanwhile, or not ours to read: nothing vouches for it
    return uid == [b"0"] and exe.st_uid == 0 and not exe.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def gather(host: Host, inventory: Inventory, deadline: float = math.inf) -> FabricFacts:
    """The manager's state beside ``inventory``, the run's NVML facts (Context.inventory);
    systemctl is given what is left before ``deadline`` (a settle wait may have used most of
    the check's time), less what the process scan and the judges need."""
    timeout = tool_time(deadline, SYSTEMCTL_TIMEOUT)
    if timeout is None:
        return FabricFacts(manager=manager_state(host, skip=f"not run: {max(0.0, deadline - time.monotonic()):.1f} s were left "
                                                            "before the check's deadline"), inventory=inventory)
    return FabricFacts(manager=manager_state(host, timeout), inventory=inventory)


# ---- judging ---------------------------------------------------------------


CUDA_CATCHES = ("the cuda check catches a stopped manager: CUDA init then fails with 'system not yet initialized' "
                "(cudaErrorSystemNotReady)")


def judge_manager(m: Manager, inv: Inventory, registered: bool, gpus_judged: bool, no_switch: str | None) -> tuple[list[Finding], str | None, str | None]:
    """The fabric manager: findings, why the part was not judged (or None), and a note for a pass on the GPUs' word (or None).

    ``registered``: every GPU reports its fabric registration COMPLETED with success.
    ``no_switch``: why no NVSwitch shows on this bus (a VM whose host keeps the switches), or None.
    """
    if m.state == "running":
        return [], None, None
    if registered:
        # A completed registration proves a manager programmed the switches; in a shared-NVSwitch
        # VM it runs on the host, so not seeing it here is no fault.
        return [], None, (f"nvidia-fabricmanager not seen here ({m.how}), but every GPU's fabric registration completed: "
                          "a fabric manager (on the host, where this is a VM or a container) did its work")
    if no_switch:
        return [], f"{no_switch}; the fabric manager runs where the switches are", None
    fix = START_FM.format(driver=inv.driver_version)
    if m.state == "stopped":
        if m.systemd == "activating":
            return [Finding(FAIL, "nvidia-fabricmanager is still starting",
                            f"{m.how}: the fabric manager is still starting (right after boot it takes a while to program the switches); "
                            "until it has, CUDA init fails with 'system not yet initialized' (cudaErrorSystemNotReady)",
                            "wait for `systemctl is-active nvidia-fabricmanager` to say active and run again; if it stays activating, "
                            "read `journalctl -u nvidia-fabricmanager` and /var/log/fabricmanager.log")], None, None
        return [Finding(FAIL, "nvidia-fabricmanager is not running",
                        f"{m.how}: on an NVSwitch board nothing crosses the switches until the fabric manager has programmed them, "
                        "so CUDA init fails with 'system not yet initialized' (cudaErrorSystemNotReady) or the GPUs have no NVLink peers",
                        fix)], None, None
    if not gpus_judged:
        # Nothing here can say (A100 has no NVML fabric state, a container hides the host's systemd and
        # processes): a WARN would sound on every healthy such node.
        return [], f"whether nvidia-fabricmanager runs is unknown ({m.how}) and the GPUs report no fabric state; {CUDA_CATCHES}", None
    # The GPUs report a state, not every one completed: the gpus part names them; say why the manager cannot be vouched for.
    return [Finding(WARN, "fabric manager state unknown", f"whether nvidia-fabricmanager runs is unknown ({m.how}), "
                    "and not every GPU reports a completed fabric registration that would show it did its work",
                    "run preflight on the host (or with the host's /proc and systemd), or check `systemctl status nvidia-fabricmanager` there")], None, None


def _gpus(gpus: list[Gpu]) -> str:
    return "GPU " + format_cpulist([g.index for g in gpus])


def judge_gpus(inv: Inventory) -> tuple[list[Finding], str | None]:
    """Every GPU's fabric registration: findings, and why the part was not judged (or None)."""
    known = [g for g in inv.gpus if g.fabric is not None and g.fabric.state != "not_supported"]
    if not known:
        return [], "NVML reports no GPU fabric state here (a driver or nvidia-ml-py without nvmlDeviceGetGpuFabricInfo)"
    out = []
    for state, words in (("not_started", "not started"), ("in_progress", "still in progress")):
        stuck = [g for g in known if g.fabric and g.fabric.state == state]
        if stuck:
            out.append(Finding(FAIL, f"{_gpus(stuck)}: fabric registration {words}",
                               f"NVML reports the fabric state of {_gpus(stuck)} ({', '.join(nvml_facts.short_pci(g.pci_bus_id) for g in stuck)}) "
                               f"{state.upper()}, not COMPLETED: CUDA on {'them' if len(stuck) > 1 else 'it'} fails with "
                               "'system not yet initialized' until the fabric manager registers it",
                               START_FM.format(driver=inv.driver_version) + ("; right after boot, wait for it and run again" if state == "in_progress" else "")))
    failed = [g for g in known if g.fabric and g.fabric.state == "completed" and g.fabric.status != "success"]
    for g in failed:
        assert g.fabric is not None
        out.append(Finding(FAIL, f"GPU {g.index}: fabric registration failed ({g.fabric.status})",
                           f"NVML reports GPU {g.index} ({nvml_facts.short_pci(g.pci_bus_id)}) fabric state COMPLETED with status "
                           f"'{g.fabric.status}': it has no NVLink peer access",
                           "read the fabric manager's log (/var/log/fabricmanager.log); stop GPU clients, reset the GPUs and NVSwitches "
                           "(`nvidia-smi -r`) and restart nvidia-fabricmanager; if it fails again, drain the node"))
    unknown = [g for g in inv.gpus if g not in known]
    if unknown:
        out.append(Finding(WARN, f"{_gpus(unknown)}: fabric state unknown",
                           f"NVML gives no fabric state for {_gpus(unknown)} while the node's other GPUs report one",
                           "look for Xid errors (`preflight xid`) and compare `nvidia-smi -q` (Fabric section) across the GPUs"))
    return out, None


def judge_switches(shape: NodeShape, expect: FabricExpect) -> tuple[list[Finding], str | None]:
    """NVSwitch chips on the PCI bus against the board's count, where the bus shows the whole board."""
    if expect.nvswitches is None or expect.board_gpus is None:
        return [], f"no board count of NVSwitches for this GPU model ({expect.nvswitch_source})"
    if shape.pci_gpus is None:
        return [], "sysfs lists no PCI device here (a sandbox that hides the bus)"
    if len(shape.pci_gpus) != expect.board_gpus:
        return [], f"the count of {expect.nvswitches} is for the {expect.board_gpus}-GPU board; this PCI bus shows {len(shape.pci_gpus)} GPUs"
    if shape.nvswitches == 0:
        return [], ("no NVSwitch on this PCI bus: a VM whose switches the host keeps (shared NVSwitch virtualization), or a board "
                    "whose switches are managed off the host's bus; "
                    "the GPUs' own fabric state stands for them")
    if shape.nvswitches < expect.nvswitches:
        return [Finding(FAIL, f"{shape.nvswitches} of {expect.nvswitches} NVSwitches on the PCI bus",
                        f"sysfs shows {shape.nvswitches} NVIDIA NVSwitch bridges (class 0x0680), the {expect.board_gpus}-GPU board has "
                        f"{expect.nvswitches} ({expect.nvswitch_source}): every GPU has links to every switch, so each lost switch "
                        "cuts every GPU's NVLink bandwidth",
                        "look for SXid errors in the kernel log and for the switches in `lspci -d 10de:`; a switch that is off the bus "
                        "needs a cold power cycle of the node, and if it stays gone an RMA of the baseboard")], None
    if shape.nvswitches > expect.nvswitches:
        return [Finding(WARN, f"{shape.nvswitches} NVSwitches on the PCI bus, the board has {expect.nvswitches}",
                        f"sysfs shows {shape.nvswitches} NVIDIA NVSwitch bridges where this SKU's board has {expect.nvswitches} "
                        f"({expect.nvswitch_source}): this node may not be the board the profile describes",
                        "check the profile (`preflight detect`) and `lspci -d 10de:`")], None
    return [], None


def judge(facts: FabricFacts, shape: NodeShape, expect: FabricExpect) -> tuple[dict[str, list[Finding]], dict[str, str], dict[str, str]]:
    """Findings by part, each part not judged with its reason, and notes on parts that passed on indirect evidence."""
    parts: dict[str, list[Finding]] = {}
    unjudged: dict[str, str] = {}
    notes: dict[str, str] = {}
    if expect.gpu_fabric_state:
        parts["gpus"], why = judge_gpus(facts.inventory)
        if why:
            unjudged["gpus"] = why
    else:
        unjudged["gpus"] = f"this GPU predates NVML's GPU fabric state ({expect.state_source})"
    gpus = facts.inventory.gpus
    registered = "gpus" not in unjudged and bool(gpus) and all(
        g.fabric is not None and g.fabric.state == "completed" and g.fabric.status == "success" for g in gpus)
    parts["nvswitches"], why = judge_switches(shape, expect)
    if why:
        unjudged["nvswitches"] = why
    no_switch = ("no NVSwitch on this PCI bus: a VM whose host keeps the switches (shared NVSwitch virtualization), or a board "
                 "whose switches are managed off the host's bus"
                 if shape.pci_gpus is not None and shape.nvswitches == 0 else None)
    parts["manager"], why, note = judge_manager(facts.manager, facts.inventory, registered, "gpus" not in unjudged, no_switch)
    if why:
        unjudged["manager"] = why
    if note:
        notes["manager"] = note
    return parts, unjudged, notes


def manager_sources(m: Manager, registered: bool) -> Sources:
    """Which source answered whether the fabric manager runs, and whether systemctl's output could not be read."""
    sources = Sources()
    answered = ("systemctl" if m.systemd else f"/proc ({DAEMON} process)") if m.state != "unknown" else None
    if answered is None and registered:
        answered = "NVML (every GPU's fabric registration completed)"
    if answered:
        sources.took("fabric manager", answered)
    if m.unread:
        sources.failed(SYSTEMCTL, m.unread, answered)
    return sources


# ---- the check ---------------------------------------------------------------


class Fabric(Check):
    name = "fabric"
    description = "NVSwitch boards: nvidia-fabricmanager running, every GPU's fabric registration completed, every NVSwitch on the bus"
    timeout_seconds = 30.0
    order = 25
    beside_ranks = True  # reads the node: runs while the ranks import torch

    def applies(self, ctx: Context) -> str | None:
        if not ctx.profile.has_gpus:
            return f"profile {ctx.profile.name} has no GPUs: no NVSwitch fabric"
        if ctx.profile.fabric is None:
            return f"profile {ctx.profile.name}: this GPU is not built on an NVSwitch board (PCIe card or NVLink bridges): no fabric manager"
        if ctx.shape is None:
            return "the node's shape was not read: whether its GPUs sit on an NVSwitch is unknown"
        if not ctx.shape.gpus:
            return f"this node gives the run no GPU ({ctx.shape.gpus_from}): no NVSwitch, no fabric manager"
        if ctx.shape.fabric != "nvswitch":
            return f"this node's GPUs are {FABRIC_WORDS[ctx.shape.fabric]} ({ctx.shape.fabric_from}): no NVSwitch, no fabric manager"
        return None

    def run(self, ctx: Context) -> Result:
        assert ctx.profile.fabric is not None and ctx.shape is not None
        try:
            # A boot gate can start while the fabric manager still registers the GPUs: wait for it, bounded.
            waited = settle.settled_inventory(ctx, timeout=min(20.0, max(1.0, ctx.deadline - time.monotonic())))
            facts = gather(ctx.host, waited.inventory, ctx.deadline)
        except nvml.NvmlUnavailable as e:
            return self.result(FAIL, e.cause, cause=e.cause, remedy=e.remedy)
        parts, unjudged, notes = judge(facts, ctx.shape, ctx.profile.fabric)
        if ctx.settings.nvml_fake is not None:  # fail closed, as the cuda check does
            parts["source"] = [nvml.fake_finding(str(ctx.settings.nvml_fake))]
        details = {"manager": facts.manager.model_dump(), "nvswitches": ctx.shape.nvswitches,
                   "gpus": {str(g.index): g.fabric.model_dump() if g.fabric else None for g in facts.inventory.gpus},
                   "parts": {name: "SKIP" if name in unjudged else worst(found) for name, found in parts.items()},
                   "not_judged": unjudged, "notes": notes}
        if said := waited.describe():
            details["settle"] = said  # how long it waited for the registration to complete
        sources = manager_sources(facts.manager, "manager" in notes)
        details.update(sources.details())
        lines = [f"{part}: not judged: {why}" for part, why in unjudged.items()] + [f"{part}: {note}" for part, note in notes.items()]
        lines += [f"gpus: {said}"] if said else []
        lines += [line] if (line := sources.line()) else []
        n = len(facts.inventory.gpus)
        m = facts.manager
        ok = (("fabric manager not judged" if "manager" in unjudged else
               f"fabric manager {m.state} ({m.how})" if "manager" not in notes else f"fabric manager not seen here ({m.how})")
              + ("" if "gpus" in unjudged else f"; fabric registration completed on all {n} GPUs")
              + ("" if "nvswitches" in unjudged else f"; {ctx.shape.nvswitches} of {ctx.profile.fabric.nvswitches} NVSwitches on the bus"))
        return self.conclude([f for found in parts.values() for f in found], ok, details=details, lines=lines,
                             measurements=sources.measurements())
