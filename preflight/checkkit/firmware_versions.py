"""One firmware version across the members of each board, judged: the firmware check's
VBIOS, InfoROM and NVSwitch BIOS parts (checks/firmware.py).

GPUs of one board on different VBIOS or InfoROM versions are the odd-one-out
faults: a GPU left behind by a partial firmware update clocks, throttles or
fails differently from its peers. One board is one PCI subsystem (vendor and
device id, from sysfs: ``boards``): two board partners' cards of one GPU model,
or PCIe cards from two OEM lots, ship their own builds, so ``judge_uniform``
compares versions within a board, never across boards (``across_boards`` says
those), and only WARNs where the boards cannot be read.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from preflight.base.findings import Finding, Status
from preflight.base.host import Host, read_stripped
from preflight.base.units import format_cpulist
from preflight.readers.nvidia.nvml_facts import Inventory, short_pci

FAIL, WARN = Status.FAIL, Status.WARN
FLASH = ("update the odd GPUs' firmware to the node's version with the vendor's firmware package (nvfwupd on HGX/DGX, "
         "or the OEM's bundle), then cold-reboot; until then drain the node")


PCI_DEVICES = "/sys/bus/pci/devices"
_PCI_ID = re.compile(r"0x[0-9a-f]{4}")


def boards(host: Host, inventory: Inventory) -> tuple[dict[int, str | None], dict[int, str]]:
    """Each GPU's board: the PCI subsystem vendor and device ids of its function in sysfs
    (what NVML calls pciSubSystemId and `nvidia-smi -q` prints as Sub System Id), as
    "vendor:device"; None with why where they cannot be read. Trusted only where the function's
    own ids are NVIDIA's and NVML's device id for that GPU: an address that names another device
    (facts recorded elsewhere, --nvml-fake) says nothing about the GPU's board."""
    out: dict[int, str | None] = {}
    why: dict[int, str] = {}
    for g in inventory.gpus:
        # The kernel caches these ids at enumeration: reading them never reaches a wedged GPU.
        at = f"{PCI_DEVICES}/{short_pci(g.pci_bus_id)}"
        ids = {n: (read_stripped(host.path(f"{at}/{n}")) or "").lower() for n in ("vendor", "device", "subsystem_vendor", "subsystem_device")}
        out[g.index] = None
        bad = [n for n, v in ids.items() if not _PCI_ID.fullmatch(v)]
        if bad:
            why[g.index] = f"{at}/{bad[0]} " + ("unreadable" if not ids[bad[0]] else f"holds {ids[bad[0]][:20]!r}")
        elif ids["vendor"] != "0x10de" or (g.pci_device_id and ids["device"] != g.pci_device_id):
            why[g.index] = f"{at} is {ids['vendor']}:{ids['device']}, not NVML's GPU 0x10de:{g.pci_device_id or '?'}"
        else:
            out[g.index] = f"{ids['subsystem_vendor'][2:]}:{ids['subsystem_device'][2:]}"
    return out, why


def gpus(keys) -> str:
    return f"GPU {format_cpulist(sorted(keys))}"


def switches(keys) -> str:
    return f"NVSwitch {', '.join(sorted(keys))}"


def _split(what: str, said: dict, name: Callable, noun: str, status: Status, fix: str, board: str | None = None,
           why: str = "") -> Finding:
    """The finding for members on more than one version: the odd ones named against the
    majority's version, or every group where there is no majority. ``board`` names the board
    they share where the node has more than one; ``why`` is added to the cause."""
    counts = Counter(said.values()).most_common()
    top, n = counts[0]
    of = f" of board {board}" if board else ""
    if n == counts[1][1]:  # no majority: name every group
        groups = "; ".join(f"{name([i for i, v in said.items() if v == ver])} on {ver}" for ver, _ in counts)
        return Finding(status, f"{noun}{of} on {len(counts)} {what} versions",
                       f"the node's {noun}{of} run different {what} versions with no majority: {groups}{why}", fix)
    odd = sorted(i for i, v in said.items() if v != top)
    found = ", ".join(f"{name([i])} {said[i]}" for i in odd)
    return Finding(status, f"{name(odd)} on another {what} than the other {n}{of}",
                   f"{found}; the other {n} {noun}{of} run {what} {top}: a part left behind by a partial firmware update "
                   f"behaves differently from its peers (the odd-one-out faults){why}", fix)


def judge_uniform(what: str, values: dict, pin: str | None, pin_key: str | None, name: Callable = gpus, noun: str = "GPUs",
                  one: str = "GPU", source: str = "NVML", boards: dict | None = None, boards_why: str | None = None,
                  one_board: bool = False) -> tuple[list[Finding], str | None]:
    """One version across the members of each board (GPUs by index, or NVSwitches by PCI
    address) and the pin: findings, and why not judged (or None). ``name`` names a set of
    members, ``noun`` and ``one`` say what they are, ``source`` where the versions come from.
    ``boards`` maps each member to its board (the PCI subsystem ids; None where unread, and
    ``boards_why`` says why); ``one_board``: the members share one board by construction
    (the NVSwitches of an HGX baseboard)."""
    said = {i: v for i, v in values.items() if v is not None}
    if not said:
        return [], f"{source} gives no {what} version for any {one}"
    out = []
    silent = sorted(set(values) - set(said))
    if silent:
        out.append(Finding(WARN, f"{name(silent)}: {what} version unknown",
                           f"{source} gives no {what} version for {name(silent)} while it does for the others",
                           "compare `nvidia-smi -q` across the GPUs; look for Xid errors (`preflight xid`)"))
    if pin is not None:
        # Hex digits: the site's "96.00.a5.00.01" (settings accept either case) is NVML's "96.00.A5.00.01".
        odd = {i: v for i, v in said.items() if v.upper() != pin.upper()}
        if odd:
            found = ", ".join(f"{name([i for i in odd if odd[i] == v])} {v}" for v in sorted(set(odd.values())))
            out.append(Finding(FAIL, f"{what} not the site's {pin} on {name(odd)}",
                               f"the site config pins {what} {pin} ({pin_key}); found {found}",
                               f"{FLASH}; or change {pin_key} in the config"))
        return out, None
    if len(set(said.values())) == 1:
        return out, None
    if one_board:
        out.append(_split(what, said, name, noun, FAIL, FLASH))
        return out, None
    known = boards or {}
    if all(known.get(i) for i in said):
        # Within a board only: each maker (or OEM lot) ships its own build for its board, so
        # versions that differ between boards are how the cards were sold (judge notes them).
        by_board: dict[str, dict] = {}
        for i, v in said.items():
            by_board.setdefault(known[i], {})[i] = v
        for board, members in sorted(by_board.items()):
            if len(set(members.values())) > 1:
                out.append(_split(what, members, name, noun, FAIL, FLASH, board if len(by_board) > 1 else None))
        return out, None
    # Which board each GPU is could not be read: a partial update and two boards' own builds look
    # alike here. A FAIL would drain a healthy node of two board partners' cards, silence would
    # pass a GPU left behind: WARN, naming the GPUs and how to tell the two apart.
    unread = sorted(i for i in said if not known.get(i))
    why = (f"; which board each {one} is could not be read ({boards_why or f'no PCI subsystem ids for {name(unread)}'}), and boards "
           f"from different makers or OEM lots ship their own {what} builds, so a {one} left behind and two boards look alike here")
    fix = (f"compare the boards (`lspci -nn -v -s <bus id>`, its Subsystem line): {noun} of one board on different {what} versions "
           "were left behind by a partial firmware update (update them with the vendor's firmware package, nvfwupd on HGX/DGX, "
           "or the OEM's bundle, then cold-reboot); different boards' builds are no fault")
    out.append(_split(what, said, name, noun, WARN, fix, why=why))
    return out, None


def across_boards(what: str, values: dict, boards: dict) -> str | None:
    """Where the GPUs run several versions of ``what`` and each board one: said, not judged."""
    said = {i: v for i, v in values.items() if v is not None}
    if len(set(said.values())) < 2 or not all(boards.get(i) for i in said):
        return None
    groups = {}
    for i, v in said.items():
        groups.setdefault((boards[i], v), []).append(i)
    if len({b for b, _ in groups}) != len(groups):
        return None  # a board on two versions: judge_uniform's finding
    each = "; ".join(f"{gpus(members)} (board {b}) on {v}" for (b, v), members in sorted(groups.items(), key=lambda kv: min(kv[1])))
    return (f"{each}: compared within a board (PCI subsystem ids, sysfs), since each board's maker ships its own {what} build "
            "for it; no board runs two")
