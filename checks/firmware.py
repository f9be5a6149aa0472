"""Firmware and driver versions: one VBIOS and one InfoROM image across the
node's GPUs (and the site's pin), the driver NVML answers for the one the
kernel loaded, and a driver new enough for the CUDA runtime the job's torch
was built with.

GPUs of one board on different VBIOS or InfoROM versions are the odd-one-out
faults: a GPU left behind by a partial firmware update clocks, throttles or
fails differently from its peers. One board is one PCI subsystem (vendor and
device id, from sysfs): two board partners' cards of one GPU model (an ASUS
and an MSI RTX 4090), or PCIe cards from two OEM lots, ship their own VBIOS
builds, so versions are compared within a board, never across boards. A torch built for a newer CUDA major than
the driver supports fails at init ("driver version is insufficient"); within
one major version it runs under minor-version compatibility, which is how
PyTorch's own wheels are meant to run (a cu128 wheel on a 12.4 driver).
"""

from __future__ import annotations

import re
import sys
import time

from pydantic import BaseModel

from preflight.base.findings import Finding, Status, worst
from preflight.base.host import Host, read_stripped
from preflight.checkkit.firmware_versions import PCI_DEVICES, across_boards, boards, judge_uniform, switches
from preflight.checkkit.sources import Sources
from preflight.pipeline.check import Check, Context, Result, Waiting
from preflight.readers.nvidia import nvml
from preflight.readers.nvidia.nvml import MISMATCH
from preflight.readers.nvidia.nvml_facts import Inventory
from preflight.readers.torch_build import ASK_TORCH, TORCH_TIMEOUT, TorchCuda, ask_torch, torch_version_file  # noqa: F401 (the check's names)

FAIL, WARN = Status.FAIL, Status.WARN
QUICK = "the quick level starts no torch (standard and full do)"
FALLBACK_SECONDS = 10.0  # where torch's import could not answer, for finding torch/version.py
COMPAT = "https://docs.nvidia.com/deploy/cuda-compatibility/"


class FirmwareFacts(BaseModel):
    inventory: Inventory
    kernel_driver: str | None = None  # the loaded module's version, from /proc/driver/nvidia/version or /sys/module/nvidia/version
    kernel_driver_error: str | None = None
    torch: TorchCuda | None = None  # None: not asked
    torch_skipped: str | None = None
    sources: dict[str, str] = {}  # fact -> the source that answered it
    unread: dict[str, str] = {}  # source -> why it could not be read (another answered in its place where sources says so)
    # NVSwitch PCI address -> its BIOS (firmware) version, None where the driver says N/A;
    # empty with nvswitch_absent saying why on a node without NVSwitch.
    nvswitch_bios: dict[str, str | None] = {}
    nvswitch_absent: str | None = None
    # GPU index -> its board, the PCI subsystem "vendor:device" sysfs gives ("1043:889d"); None
    # where it could not be read, and boards_unread says why.
    boards: dict[int, str | None] = {}
    boards_unread: dict[int, str] = {}


# ---- gathering -------------------------------------------------------------


PROC_VERSION = "/proc/driver/nvidia/version"
SYS_VERSION = "/sys/module/nvidia/version"  # the module's MODULE_VERSION: the same number, without the banner around it
_MODULE = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)")
_VERSION = re.compile(r"[0-9]+(?:\.[0-9]+)+")


def kernel_driver(host: Host) -> tuple[str | None, str | None]:
    """The loaded nvidia module's version, or why it is unknown."""
    version, why, _, _ = kernel_driver_sources(host)
    return version, why


def kernel_driver_sources(host: Host) -> tuple[str | None, str | None, str | None, dict[str, str]]:
    """(the loaded module's version, why it is unknown, the file that gave it, each file that
    could not and why): the driver's banner in /proc, else the module's own version in sysfs."""
    unread: dict[str, str] = {}
    try:
        m = _MODULE.search(host.read_text(PROC_VERSION))
        if m:
            return m.group(1), None, PROC_VERSION, unread
        unread[PROC_VERSION] = "names no kernel module version"
    except OSError as e:
        unread[PROC_VERSION] = f"unreadable ({e.strerror})"
    text = read_stripped(host.path(SYS_VERSION))
    if text is not None and _VERSION.fullmatch(text):
        return text, None, SYS_VERSION, unread
    unread[SYS_VERSION] = "unreadable" if text is None else f"holds {text[:40]!r}, not a version"
    return None, "; ".join(f"{path} {why}" for path, why in unread.items()), None, unread


NVSWITCH_PROC = "/proc/driver/nvidia-nvswitch/devices"


def nvswitch_bios(host: Host) -> tuple[dict[str, str | None], str | None]:
    """Each NVSwitch's BIOS version, as the nvidia-nvswitch driver prints it in
    <address>/information ("BIOS Version: 96.10.6d.00.01", or "N/A" where it read
    none: kernel-open/nvidia/procfs_nvswitch.c). NVML does not expose it."""
    try:
        found = sorted(host.path(NVSWITCH_PROC).iterdir())
    except OSError:
        return {}, f"no NVSwitch on this node ({NVSWITCH_PROC} absent)"
    if not found:
        return {}, f"no NVSwitch on this node ({NVSWITCH_PROC} empty)"
    out: dict[str, str | None] = {}
    for dev in found:
        m = re.search(r"^BIOS Version:\s*(\S+)", read_stripped(dev / "information") or "", re.M)
        out[dev.name] = m.group(1).upper() if m and m.group(1) != "N/A" else None
    return out, None


def gather(ctx: Context) -> FirmwareFacts:
    """Raises NvmlUnavailable when NVML cannot answer at all."""
    inventory = ctx.inventory(timeout=20.0)
    driver, why, source, unread = kernel_driver_sources(ctx.host)
    facts = FirmwareFacts(inventory=inventory, kernel_driver=driver, kernel_driver_error=why, unread=unread)
    if source:
        facts.sources["kernel module version"] = source
    facts.boards, facts.boards_unread = boards(ctx.host, inventory)
    if any(facts.boards.values()):
        facts.sources["GPU boards"] = f"{PCI_DEVICES}/<bus id>/subsystem_vendor, subsystem_device"
    facts.nvswitch_bios, facts.nvswitch_absent = nvswitch_bios(ctx.host)
    if ctx.settings.level == "quick":
        facts.torch_skipped = QUICK
    return facts


def torch_facts(ctx: Context, facts: FirmwareFacts) -> FirmwareFacts:
    """torch.version.cuda of the job's interpreter: what the run's ranks said once they had
    imported it (the same interpreter: no second import, seconds on a GPU node), else a child
    that imports it, else its version file."""
    python = str(ctx.settings.python) if ctx.settings.python else sys.executable
    # Resumed before the ranks were up (a check that needs them comes next): wait for them, but
    # leave an import that fails at once (its error in words) and the version file their time.
    ranks_by = ctx.deadline - FALLBACK_SECONDS - 7.0
    said = ctx.worlds.torch_said(python, ranks_by) if ctx.worlds is not None else None
    if said and not any(r.get("error") for r in said.values()):
        builds = {(r.get("torch"), r.get("cuda")) for r in said.values()}
        if len(builds) == 1:
            (version, cuda), = builds
            facts.torch = TorchCuda(torch=version, cuda=cuda)
            facts.sources["torch.version.cuda"] = f"{python} (the ranks' own import, {len(said)} of {len(said)})"
            return facts
    # The import gets what is left but a few seconds, so the version file can still answer after a hang.
    left = ctx.deadline - time.monotonic() - 2.0
    facts.torch = ask_torch(ctx.host, python, max(1.0, min(TORCH_TIMEOUT, left - FALLBACK_SECONDS)))
    if facts.torch.error is None:
        facts.sources["torch.version.cuda"] = f"{python} (import torch)"
        return facts
    facts.unread[f"{python} (import torch)"] = facts.torch.error
    read, path = torch_version_file(ctx.host, python, max(1.0, min(FALLBACK_SECONDS, ctx.deadline - time.monotonic() - 1.0)))
    if path:
        facts.torch, facts.sources["torch.version.cuda"] = read, path
    else:
        facts.torch = TorchCuda(error=f"{facts.torch.error}; {read.error}")
    return facts


# ---- judging ---------------------------------------------------------------


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"[0-9]+", v))


def judge_driver(facts: FirmwareFacts) -> tuple[list[Finding], str | None]:
    if facts.kernel_driver is None:
        return [], facts.kernel_driver_error
    nvml_says = facts.inventory.driver_version
    if facts.kernel_driver != nvml_says:
        return [Finding(FAIL, f"driver library {nvml_says}, kernel module {facts.kernel_driver}",
                        f"NVML's library is driver {nvml_says} but the loaded kernel module is {facts.kernel_driver} "
                        "(/proc/driver/nvidia/version): the driver was upgraded without a reboot", MISMATCH)], None
    return [], None


def judge_cuda(inv: Inventory, torch: TorchCuda | None, skipped: str | None) -> tuple[list[Finding], str | None]:
    """The driver's CUDA version against the one torch was built with."""
    if torch is None:
        return [], skipped
    if torch.error:
        return [], torch.error
    if torch.cuda is None:
        return [], f"torch {torch.torch} is a CPU build (torch.version.cuda is None): no CUDA runtime to match (the cuda check judges it)"
    if inv.cuda_driver_version is None:
        return [], "NVML does not say which CUDA version the driver supports"
    driver, runtime = _version(inv.cuda_driver_version)[:2], _version(torch.cuda)[:2]
    if driver[0] >= runtime[0]:  # a newer minor of the same major: minor-version compatibility (compat_note)
        return [], None
    fix = f"install a driver that supports CUDA {torch.cuda} or newer, or a torch built for CUDA {inv.cuda_driver_version} or older"
    return [Finding(FAIL, f"torch needs CUDA {torch.cuda}, the driver supports {inv.cuda_driver_version}",
                        f"torch {torch.torch} was built with CUDA {torch.cuda}; driver {inv.driver_version} supports CUDA up to "
                        f"{inv.cuda_driver_version}: CUDA init fails with 'driver version is insufficient for CUDA runtime version' "
                        f"(a CUDA major version needs a driver of its own branch, {COMPAT})", fix)], None


def compat_note(inv: Inventory, torch: TorchCuda | None) -> str | None:
    """Why a torch of a newer CUDA minor than the driver's passes, for details; None where it does not apply."""
    if torch is None or torch.cuda is None or inv.cuda_driver_version is None:
        return None
    driver, runtime = _version(inv.cuda_driver_version)[:2], _version(torch.cuda)[:2]
    if driver >= runtime or driver[0] != runtime[0]:
        return None
    # PyTorch's wheels bundle their CUDA runtime and rely on this; only PTX JIT of newer code and
    # the newest APIs need the newer driver, which the cuda and train checks would meet.
    return (f"torch {torch.torch} built for CUDA {torch.cuda} runs on driver {inv.driver_version} (CUDA {inv.cuda_driver_version}) "
            f"under minor-version compatibility ({COMPAT})")


def judge(facts: FirmwareFacts, vbios_pin: str | None = None, inforom_pin: str | None = None) -> tuple[dict[str, list[Finding]], dict[str, str], dict[str, str]]:
    """Findings by part, each part not judged with its reason, and notes on parts that passed by a rule worth saying."""
    gpus = facts.inventory.gpus
    parts: dict[str, list[Finding]] = {}
    unjudged: dict[str, str] = {}
    first = sorted(facts.boards_unread.items())[:1]
    more = len(facts.boards_unread) - 1
    unread = (f"GPU {first[0][0]}: {first[0][1]}" + (f", and {more} more GPUs (details.boards_unread)" if more > 0 else "")) if first else None
    versions = {"vbios": ("VBIOS", {g.index: g.vbios for g in gpus}, vbios_pin, "vbios_version"),
                "inforom": ("InfoROM image", {g.index: g.inforom_image for g in gpus}, inforom_pin, "inforom_version")}
    for part, found in (
        ("driver", judge_driver(facts)),
        *((part, judge_uniform(*args, boards=facts.boards, boards_why=unread)) for part, args in versions.items()),
        ("cuda", judge_cuda(facts.inventory, facts.torch, facts.torch_skipped)),
        # No NVSwitch is not applicable, not unjudged: the fabric check counts the switches a profile expects (where one names its board).
        # The NVSwitches all sit on the one HGX baseboard: one BIOS across them, whoever made it.
        ("nvswitch", judge_uniform("NVSwitch BIOS", facts.nvswitch_bios, None, None, switches, "NVSwitches", "NVSwitch", NVSWITCH_PROC,
                                   one_board=True)),
    ):
        if part == "nvswitch" and not facts.nvswitch_bios:
            continue
        parts[part], why = found
        if why:
            unjudged[part] = why
    notes = {part: note for part, (what, values, pin, _) in versions.items()
             if pin is None and (note := across_boards(what, values, facts.boards))}
    if (note := compat_note(facts.inventory, facts.torch) if "cuda" not in unjudged else None):
        notes["cuda"] = note
    return parts, unjudged, notes


# ---- the check ---------------------------------------------------------------


class Firmware(Check):
    name = "firmware"
    description = "one VBIOS and InfoROM version across the GPUs of each board (and the site's pin), one BIOS across the NVSwitches, the driver loaded, torch's CUDA runtime within the driver's"
    timeout_seconds = 90.0
    order = 26
    beside_ranks = True  # reads the node: runs while the ranks import torch

    def applies(self, ctx: Context) -> str | None:
        if not ctx.profile.has_gpus:
            return f"profile {ctx.profile.name} has no GPUs: no GPU firmware to compare"
        return None

    def run(self, ctx: Context) -> Result | Waiting:
        try:
            facts = gather(ctx)
        except nvml.NvmlUnavailable as e:
            return self.result(FAIL, e.cause, cause=e.cause, remedy=e.remedy)
        if not facts.inventory.gpus:
            return self.result(Status.SKIP, "NVML lists no GPU: no firmware to compare")
        if facts.torch_skipped:
            return self.judged(ctx, facts)
        if ctx.worlds is not None and ctx.worlds.starting() is not None:
            # The run's ranks are importing the job's torch: they will say which it is.
            worlds = ctx.worlds
            return Waiting(ready=lambda: worlds.starting() is None, rest=lambda: self.judged(ctx, torch_facts(ctx, facts)),
                           doing="waiting for the ranks to say which torch they imported")
        return self.judged(ctx, torch_facts(ctx, facts))

    def judged(self, ctx: Context, facts: FirmwareFacts) -> Result:
        parts, unjudged, notes = judge(facts, ctx.settings.vbios_version, ctx.settings.inforom_version)
        if ctx.settings.nvml_fake is not None:  # fail closed, as the cuda check does
            parts["source"] = [nvml.fake_finding(str(ctx.settings.nvml_fake))]
        inv = facts.inventory
        details = {"driver": inv.driver_version, "kernel_driver": facts.kernel_driver, "cuda_driver": inv.cuda_driver_version,
                   "torch": facts.torch.model_dump() if facts.torch else None,
                   "gpus": {str(g.index): {"vbios": g.vbios, "inforom_image": g.inforom_image, "board": facts.boards.get(g.index)}
                            for g in inv.gpus},
                   **({"boards_unread": {str(i): why for i, why in facts.boards_unread.items()}} if facts.boards_unread else {}),
                   "nvswitch_bios": facts.nvswitch_bios or facts.nvswitch_absent,
                   "parts": {name: worst(found) for name, found in parts.items()}, "not_judged": unjudged, "notes": notes}
        sources = Sources()
        for fact, source in facts.sources.items():
            sources.took(fact, source)
        for tool, why in facts.unread.items():
            fact = "kernel module version" if tool in (PROC_VERSION, SYS_VERSION) else "torch.version.cuda"
            sources.failed(tool, why, facts.sources.get(fact))
        details.update(sources.details())
        lines = [f"{part}: not judged: {why}" for part, why in unjudged.items()] + [f"{part}: {note}" for part, note in notes.items()]
        lines += [line] if (line := sources.line()) else []
        vbios = sorted({g.vbios for g in inv.gpus if g.vbios})
        inforom = sorted({g.inforom_image for g in inv.gpus if g.inforom_image})
        ok = (f"driver {inv.driver_version} (CUDA {inv.cuda_driver_version}) on {len(inv.gpus)} GPUs"
              + (f", VBIOS {' and '.join(vbios)}" if "vbios" not in unjudged and vbios else "")
              + (f", InfoROM {' and '.join(inforom)}" if "inforom" not in unjudged and inforom else "")
              + (f", {len(facts.nvswitch_bios)} NVSwitches on BIOS {sorted({v for v in facts.nvswitch_bios.values() if v})[0]}"
                 if "nvswitch" not in unjudged and any(facts.nvswitch_bios.values()) else "")
              + (f"; torch {facts.torch.torch} built for CUDA {facts.torch.cuda}" if "cuda" not in unjudged and facts.torch else ""))
        return self.conclude([f for found in parts.values() for f in found], ok, details=details, lines=lines,
                             measurements=sources.measurements())
