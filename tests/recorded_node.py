"""A real node, replayed: the machine a capture folder recorded, rebuilt as a
root tree the checks read through their Host, with the node's own tool output
served by stand-ins on PATH, byte for byte.

    python tests/recorded_node.py NODE TREE --level quick [--only a,b] [--shm-size BYTES] [--config FILE]

builds TREE from what NODE recorded (NODES below: tests/fixtures/node/<name>/'s
captures, a recorded sysfs tree, the node's NVML facts in tests/fixtures/nvml/), mounts a real tmpfs of the
recorded size at TREE/dev/shm (run it under `unshare -m`: the mount is private
and goes with the process), runs the level's checks in-process and prints the
report as JSON on stdout. What the tree holds is what the node printed: its
CPUs (lscpu), its memory (the kernel's MemTotal, as the shm check reported
it), its GPU's sysfs entry (as the topology check read it), its /dev/shm
mount. No fact of this machine reaches a check, except the tmpfs's own
accounting, which is the point.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _stand_in(bin_dir: Path, name: str, answers: dict[str, Path]) -> None:
    """``name`` on PATH answering each recorded argument string with its capture, bytes untouched."""
    cases = "".join(f'  "{args}") exec cat "{capture}";;\n' for args, capture in answers.items())
    _write(bin_dir / name, f'#!/bin/sh\ncase "$*" in\n{cases}  *) echo "recorded {name}: \'$*\' was not recorded" >&2; exit 64;;\nesac\n')
    (bin_dir / name).chmod(0o755)


def header_as_580(capture: str) -> str:
    """A `topo -m` capture with its header row as driver 580 prints it to a pipe:
    wrapped in ANSI underline (ESC[4m ... ESC[0m), its leading tab outside the escape."""
    lines = capture.split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("GPU0"))
    head = lines[at]
    lead = head[: len(head) - len(head.lstrip("\t "))]
    lines[at] = f"{lead}\x1b[4m{head[len(lead):]}\x1b[0m"
    return "\n".join(lines)


def build(node: Path, tree: Path, facts: dict) -> Path:
    """The recorded node as a root tree; returns the PATH directory of its stand-ins."""
    if facts.get("tree"):
        shutil.copytree(HERE / "fixtures" / facts["tree"], tree, symlinks=True, dirs_exist_ok=True)
    for rel, text in facts["files"].items():
        _write(tree / rel, text)
    bin_dir = tree / "recorded-bin"
    for tool, answers in facts["tools"].items():
        _stand_in(bin_dir, tool, {args: node / capture for args, capture in answers.items()})
    (tree / "dev" / "shm").mkdir(parents=True, exist_ok=True)
    return bin_dir


# What the H200 VM printed (tests/fixtures/node/h200-1x-vm/): node-facts.txt's lscpu and
# mounts, the standard report's topology facts (the GPU's sysfs entry as read) and shm
# facts (MemTotal 135148564480 bytes: the lower tmpfs's size=131981020k, RAM's size).
H200_VM = {
    "nvml": "h200-1x-vm.json",
    "profile": "h200-sxm",
    "shm_size": 134217728 * 1024,  # the upper tmpfs: size=134217728k, 128 GiB
    "files": {
        "sys/devices/system/cpu/online": "0-15\n",
        "sys/devices/system/node/node0/cpulist": "0-15\n",
        "proc/self/status": "Name:\tpython3\nCpus_allowed_list:\t0-15\n",
        "proc/self/cgroup": "0::/\n",
        "proc/meminfo": "MemTotal:       131981020 kB\nMemFree:        130611336 kB\nMemAvailable:   130402212 kB\n",
        "proc/self/mountinfo": ("22 1 0:21 / /proc rw,relatime shared:5 - proc proc rw\n"
                                "23 1 0:22 / /sys rw,relatime shared:6 - sysfs sysfs rw\n"
                                "24 1 0:23 / /dev/shm rw,relatime shared:7 - tmpfs tmpfs rw,size=131981020k\n"
                                "25 24 0:24 / /dev/shm rw,relatime shared:8 - tmpfs tmpfs rw,size=134217728k\n"),
        "sys/bus/pci/devices/0000:00:06.0/numa_node": "-1\n",
        "sys/bus/pci/devices/0000:00:06.0/local_cpulist": "0-15\n",
        "sys/bus/pci/devices/0000:00:06.0/vendor": "0x10de\n",
        "sys/bus/pci/devices/0000:00:06.0/device": "0x2335\n",
        "sys/bus/pci/devices/0000:00:06.0/class": "0x030200\n",
        "sys/bus/pci/devices/0000:00:06.0/current_link_speed": "32.0 GT/s PCIe\n",
        "sys/bus/pci/devices/0000:00:06.0/max_link_speed": "32.0 GT/s PCIe\n",
        "sys/bus/pci/devices/0000:00:06.0/current_link_width": "16\n",
        "sys/bus/pci/devices/0000:00:06.0/max_link_width": "16\n",
        "dev/nvidia0": "",
        "dev/nvidiactl": "",
        "proc/driver/nvidia/version": ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
                                       "GCC version:  gcc version 15.3.0 (GCC) \n"),
    },
    "tools": {
        "nvidia-smi": {"topo -m": "nvidia-smi-topo-m.txt", "-q": "nvidia-smi-q.txt",
                       "-q -d PERFORMANCE,CLOCK,POWER": "nvidia-smi-q-d-performance-clock-power.txt"},
        "dmesg": {"": "dmesg-tail.txt"},
    },
}


# The 8 x H100 HGX of tests/fixtures/sysfs/hgx-h100 (two NUMA nodes, twelve RDMA
# devices) with the DGX H100 matrix of tests/fixtures/topo/03 that tree
# describes, its header as driver 580 prints it, and a /dev/shm of half its 2 TiB
# of RAM (the kernel's default). The tree was reduced to one NVSwitch; the
# board's other three (an HGX H100 8-GPU has four: the fabric check's source)
# are added at the bus numbers after it, the only facts of theirs the check
# reads being vendor and class. NVML: the healthy node with its fabric
# registered (h100-sxm-8x-fabric-completed.json); systemd says the fabric
# manager is active.
HGX_H100 = {
    "nvml": "h100-sxm-8x-fabric-completed.json",
    "profile": "h100-sxm",
    "tree": "sysfs/hgx-h100",
    "shm_size": 1 << 40,
    "files": {
        "proc/meminfo": "MemTotal:       2113362216 kB\nMemFree:        2090000000 kB\nMemAvailable:   2095000000 kB\n",
        "proc/self/mountinfo": "24 1 0:23 / /dev/shm rw,nosuid,nodev shared:7 - tmpfs tmpfs rw,size=1056681108k\n",
        **{f"sys/bus/pci/devices/0000:0{bus}:00.0/{name}": value
           for bus in (6, 7, 8) for name, value in (("vendor", "0x10de\n"), ("class", "0x068000\n"))},
        # The tree holds no kernel log: a clean boot's, in /dev/kmsg's record format from the
        # ring's first record (kernel Documentation/ABI/testing/dev-kmsg), the driver's load
        # line with the tree's driver version (its proc/driver/nvidia/version).
        "dev/kmsg": ("6,0,0,-;Linux version 5.15.0-105-generic (buildd@lcy02-amd64-007) #115-Ubuntu SMP\n"
                     "4,1,4210511,-;nvidia: module license 'NVIDIA' taints kernel.\n"
                     "6,2,4387120,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"),
    },
    "tools": {"nvidia-smi": {"topo -m": "topo-m-580.txt"}, "systemctl": {"is-active nvidia-fabricmanager": "fm-active.txt"}},
    "captures": {"topo-m-580.txt": lambda: header_as_580((HERE / "fixtures" / "topo" /
                                                        "03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt").read_text()),
                 "fm-active.txt": lambda: "active\n"},
}

NODES = {"h200-1x-vm": H200_VM, "hgx-h100-8x": HGX_H100}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("node", choices=sorted(NODES))
    p.add_argument("tree", type=Path)
    p.add_argument("--level", default="quick")
    p.add_argument("--only", default="")
    p.add_argument("--config", type=Path)
    p.add_argument("--shm-size", type=int)
    args = p.parse_args()
    facts = NODES[args.node]
    captures = HERE / "fixtures" / "node" / args.node
    if facts.get("captures"):  # made from a capture kept elsewhere, written beside the tree
        captures = args.tree.parent / f"{args.node}-captures"
        for name, make in facts["captures"].items():
            _write(captures / name, make())
    bin_dir = build(captures, args.tree, facts)
    size = args.shm_size or facts["shm_size"]
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", str(args.tree / "dev" / "shm")], check=True)

    from preflight.base.host import Host
    from preflight.outputs.exporters.console import Console
    from preflight.pipeline import plan as plan_mod
    from preflight.pipeline import settings as settings_mod

    flags = {"profile": facts["profile"], "level": args.level, "keep_going": True,
             "nvml_fake": HERE / "fixtures" / "nvml" / facts["nvml"]}
    if args.only:
        flags["only"] = args.only
    environ = {"PATH": str(bin_dir)}
    settings = settings_mod.load(flags, args.config, environ={})
    planned = plan_mod.plan(settings)
    report = plan_mod.execute(planned, settings, Console(quiet=True, stream=sys.stderr), Host(args.tree, environ=environ))
    print(report.model_dump_json())
    return 0


if __name__ == "__main__":
    os.environ.pop("PREFLIGHT_CONFIG", None)
    sys.exit(main())
