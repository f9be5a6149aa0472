"""A real node, replayed: the machine a capture folder recorded, rebuilt as a
root tree the checks read through their Host, with the node's own tool output
served by stand-ins on PATH, byte for byte.

    python tests/recorded_node.py NODE TREE --level quick [--only a,b] [--shm-size BYTES] [--config FILE] [--profile NAME]

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


def _stand_in(bin_dir: Path, name: str, answers: dict[str, Path | tuple[Path, int]]) -> None:
    """``name`` on PATH answering each recorded argument string with its capture, bytes untouched;
    a (capture, status) answer is a tool that failed there: the capture on stderr, that exit status."""
    cases = "".join(f'  "{args}") exec cat "{capture}";;\n' if isinstance(capture, Path) else
                    f'  "{args}") cat "{capture[0]}" >&2; exit {capture[1]};;\n' for args, capture in answers.items())
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


def _cpu_set(text: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def _cpu_list(cpus: set[int]) -> str:
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in runs)


def cut_topo(capture: str, gpus: list[int], nics: list[int], cpuset: str) -> str:
    """A `topo -m` capture as a process given some of the node's GPUs and NICs sees it: the rows
    and columns of those GPUs and NICs kept (numbered from 0 again, in order, the NIC Legend too),
    every other cell as it was, tabs and empty cells included; and each GPU's CPU Affinity cut to
    ``cpuset``, the caller's, as nvidia-smi prints it inside one (rapidsai/dask-cuda#1381: inside
    `srun -c32` on a two-socket node GPUs 0-3 read "0-15,56-71", the job's CPUs, and GPUs 4-7,
    on the socket the job has no CPU of, an empty cell)."""
    lines = capture.split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("GPU0"))
    head = lines[at]
    lead = head[: len(head) - len(head.lstrip("\t "))]
    names = head[len(lead):].split("\t")
    devices = [n for n in names if n[:3] in ("GPU", "NIC") and n[3:].isdigit()]
    keep = [devices.index(f"GPU{g}") for g in gpus] + [devices.index(f"NIC{n}") for n in nics]
    rename = {devices[k]: f"{devices[k][:3]}{i if devices[k].startswith('GPU') else i - len(gpus)}" for i, k in enumerate(keep)}
    allowed = _cpu_set(cpuset)
    out = lines[:at] + [lead + "\t".join([rename[devices[k]] for k in keep] + names[len(devices):])]
    for line in lines[at + 1:]:
        cells = line.split("\t")
        if cells[0] in devices:  # a row of the matrix: its label, a cell per device, then the affinity columns
            if cells[0] not in rename:
                continue
            tail = cells[1 + len(devices):]
            if cells[0].startswith("GPU") and tail and tail[0]:
                tail[0] = _cpu_list(_cpu_set(tail[0]) & allowed)
            out.append("\t".join([rename[cells[0]]] + [cells[1 + k] for k in keep] + tail))
            continue
        legend = line.strip().split(":", 1)[0]
        if legend.startswith("NIC") and legend[3:].isdigit() and legend in devices:  # "  NIC0: mlx5_0"
            if legend in rename:
                out.append(line.replace(legend + ":", rename[legend] + ":", 1))
            continue
        out.append(line)
    return "\n".join(out)


def build(node: Path, tree: Path, facts: dict) -> Path:
    """The recorded node as a root tree; returns the PATH directory of its stand-ins."""
    if facts.get("tree"):
        shutil.copytree(HERE / "fixtures" / facts["tree"], tree, symlinks=True, dirs_exist_ok=True)
    for rel, text in facts["files"].items():
        _write(tree / rel, text)
    for rel, target in facts.get("links", {}).items():  # sysfs's links (an RDMA device's `device`)
        link = tree / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    bin_dir = tree / "recorded-bin"
    for tool, answers in facts["tools"].items():
        _stand_in(bin_dir, tool, {args: node / capture if isinstance(capture, str) else (node / capture[0], capture[1])
                                  for args, capture in answers.items()})
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


# ---- node shapes built around a real `nvidia-smi topo -m` capture ------------------------------
#
# Each of the nodes below is a healthy node of the shape one capture of tests/fixtures/topo shows
# (its INDEX.md and SOURCE.md say which machine printed it): that capture served byte for byte by the
# `nvidia-smi topo -m` stand-in, the NVML facts a healthy node of that model and driver gives
# (tests/fixtures/nvml/<name>.json), and the few files of /proc and /sys the checks read, written
# here in the kernel's formats. tests/fixtures/node-shapes/SOURCE.md says where every value comes
# from: the capture, the profile, a cited public capture, or "made for this test". The PCI entries
# are flat directories, as in the two nodes above: the pcie check finds no bridge above them and
# SKIPs, as it does for those.

TOPO = HERE / "fixtures" / "topo"
GEN4, GEN5 = "16.0 GT/s PCIe", "32.0 GT/s PCIe"
# A port's PMA counters after some traffic: data moved, no error (as tests/fixtures/sysfs/make_hgx_h100.py writes them).
PORT_COUNTERS = {"symbol_error": 0, "link_error_recovery": 0, "link_downed": 0, "port_rcv_errors": 0,
                 "port_rcv_remote_physical_errors": 0, "local_link_integrity_errors": 0,
                 "excessive_buffer_overrun_errors": 0, "port_xmit_discards": 0,
                 "port_rcv_data": 1843392910, "port_xmit_data": 1843385322, "port_rcv_packets": 5512306, "port_xmit_packets": 5512290}
ACTIVE, DOWN = ("4: ACTIVE", "5: LinkUp"), ("1: DOWN", "3: Disabled")  # sysfs `state`, `phys_state`


def pci_device(addr: str, vendor: str, device: str, klass: str, node: int, cpus: str,
               speed: str | None = None, width: int | None = None) -> dict[str, str]:
    """A PCI device's sysfs entry, as the checks read it: ids, class, NUMA node (-1: the firmware
    names none), local CPUs, and its link (current at the max) where it has one."""
    d = f"sys/bus/pci/devices/{addr}"
    out = {f"{d}/vendor": f"{vendor}\n", f"{d}/device": f"{device}\n", f"{d}/class": f"{klass}\n",
           f"{d}/numa_node": f"{node}\n", f"{d}/local_cpulist": f"{cpus}\n"}
    if speed and width:
        out |= {f"{d}/current_link_speed": f"{speed}\n", f"{d}/max_link_speed": f"{speed}\n",
                f"{d}/current_link_width": f"{width}\n", f"{d}/max_link_width": f"{width}\n"}
    return out


def rdma_device(name: str, addr: str, netdev: str, state: tuple[str, str], rate: str, layer: str) -> tuple[dict[str, str], dict[str, str]]:
    """An RDMA device with one port (/sys/class/infiniband/NAME, Linux
    Documentation/ABI/stable/sysfs-class-infiniband) and its netdev under the PCI device:
    (files, links)."""
    ib = f"sys/class/infiniband/{name}/ports/1"
    files = {f"{ib}/state": f"{state[0]}\n", f"{ib}/phys_state": f"{state[1]}\n", f"{ib}/rate": f"{rate}\n",
             f"{ib}/link_layer": f"{layer}\n", f"sys/bus/pci/devices/{addr}/net/{netdev}/operstate": "up\n" if state == ACTIVE else "down\n"}
    files |= {f"{ib}/counters/{counter}": f"{value}\n" for counter, value in PORT_COUNTERS.items()}
    return files, {f"sys/class/infiniband/{name}/device": f"../../../bus/pci/devices/{addr}"}


def host_files(cpus: str, nodes: dict[int, str], mem_kib: tuple[int, int, int], shm_line: str, driver_line: str,
               kernel: str, boot: str, gpus: list[str], model: str) -> dict[str, str]:
    """What every node here shares the shape of: its CPUs and NUMA nodes (sysfs), this process's
    cpuset and cgroup, /proc/meminfo (MemTotal, MemFree, MemAvailable in kB), its /dev/shm mount,
    the driver's version banner and device nodes (a minor per GPU, in PCI order), the kernel's
    release, and a clean boot's kernel log in /dev/kmsg's record format (kernel
    Documentation/ABI/testing/dev-kmsg): the kernel's banner and the driver's load line."""
    total, free, available = mem_kib
    out = {
        "sys/devices/system/cpu/online": f"{cpus}\n",
        **{f"sys/devices/system/node/node{n}/cpulist": f"{c}\n" for n, c in nodes.items()},
        "proc/self/status": f"Name:\tpreflight\nCpus_allowed_list:\t{cpus}\n",
        "proc/self/cgroup": "0::/\n",
        "proc/meminfo": f"MemTotal:       {total} kB\nMemFree:        {free} kB\nMemAvailable:   {available} kB\n",
        "proc/self/mountinfo": ("22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw\n"
                                "23 1 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:6 - sysfs sysfs rw\n" + shm_line),
        "proc/driver/nvidia/version": driver_line,
        "proc/sys/kernel/osrelease": f"{kernel}\n",
        "dev/nvidiactl": "",
    }
    boot_log = [(6, 0, f"Linux version {kernel} {boot}")]
    if "Open Kernel Module" not in driver_line:  # the proprietary module taints the kernel; the open one (Dual MIT/GPL) does not
        boot_log.append((4, 4210511, "nvidia: module license 'NVIDIA' taints kernel."))
    boot_log.append((6, 4387120, f"NVRM: loading {driver_line.split(': ', 1)[1].splitlines()[0].strip()}"))
    out["dev/kmsg"] = "".join(f"{level},{seq},{usec},-;{text}\n" for seq, (level, usec, text) in enumerate(boot_log))
    for minor, addr in enumerate(gpus):
        out[f"dev/nvidia{minor}"] = ""
        out[f"proc/driver/nvidia/gpus/{addr}/information"] = (f"Model: \t\t {model}\nBus Location: \t {addr}\n"
                                                              f"Device Minor: \t {minor}\nGPU Excluded:\t No\n")
    return out


def joined(parts: list[tuple[dict[str, str], dict[str, str]] | dict[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """Files and links of several parts, joined."""
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    for part in parts:
        more_files, more_links = part if isinstance(part, tuple) else (part, {})
        files |= more_files
        links |= more_links
    return files, links


# 2 x A100 PCIe 40GB on a two-socket host, one GPU and one InfiniBand NIC per NUMA node: Princeton
# Della's della-i14g20 (tests/fixtures/topo/08), bare metal. CPUs 0-63 and 64-127 as the capture's
# CPU Affinity column; PCI addresses made for this test, each NIC on its GPU's NUMA node behind
# another host bridge (the capture's NODE). Driver R525: the capture's header has no GPU NUMA ID
# column, which drivers from ~545 print.
_A100_GPUS = ["0000:21:00.0", "0000:a1:00.0"]
_A100_FILES, _A100_LINKS = joined([
    host_files("0-127", {0: "0-63", 1: "64-127"}, (528012424, 519874120, 521305868),
               "24 21 0:23 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,seclabel\n",
               "NVRM version: NVIDIA UNIX x86_64 Kernel Module  525.85.12  Sat Jan 28 02:10:06 UTC 2023\n"
               "GCC version:  gcc version 8.5.0 20210514 (Red Hat 8.5.0-10) (GCC) \n",
               "4.18.0-425.3.1.el8.x86_64", "(mockbuild@x86-vm-07.build.eng.bos.redhat.com) #1 SMP",
               _A100_GPUS, "NVIDIA A100-PCIE-40GB"),
    pci_device("0000:21:00.0", "0x10de", "0x20f1", "0x030200", 0, "0-63", GEN4, 16),
    pci_device("0000:a1:00.0", "0x10de", "0x20f1", "0x030200", 1, "64-127", GEN4, 16),
    pci_device("0000:41:00.0", "0x15b3", "0x101b", "0x020700", 0, "0-63", GEN4, 16),
    pci_device("0000:c1:00.0", "0x15b3", "0x101b", "0x020700", 1, "64-127", GEN4, 16),
    rdma_device("mlx5_0", "0000:41:00.0", "ibp65s0", ACTIVE, "100 Gb/sec (2X HDR)", "InfiniBand"),
    rdma_device("mlx5_1", "0000:c1:00.0", "ibp193s0", ACTIVE, "100 Gb/sec (2X HDR)", "InfiniBand"),
])
A100_PCIE_2X = {
    "nvml": "a100-pcie-2x.json",
    "profile": "a100-pcie",
    "shm_size": 264006212 * 1024,  # the kernel's default tmpfs: half of MemTotal
    "files": _A100_FILES,
    "links": _A100_LINKS,
    "tools": {"nvidia-smi": {"topo -m": "topo-m.txt"}},
    "captures": {"topo-m.txt": lambda: (TOPO / "08_a100-pcie-2x_no-nvlink_SYS_split-numa-0-1_2mlx5.txt").read_text()},
}

# DGX Spark: one GB10 (000F:01:00.0, the bus id every public `nvidia-smi` of a Spark prints), 20
# CPUs on one NUMA node, and the ConnectX-7's four RDMA devices of tests/fixtures/topo/24 (each
# QSFP port is two PCIe functions, one in domain 0000, one in domain 0002: the udev names say
# where), RoCE, with one QSFP port cabled (both its halves ACTIVE at 200 Gb/s) and the other
# unplugged (DOWN, Disabled), as `ibstat` printed them on a Dell Pro Max GB10
# (geerlingguy/sbc-reviews#92). Driver 580: its `topo -m` header as driver 580 prints it.
_GB10_GPU = "000f:01:00.0"
_GB10_FILES, _GB10_LINKS = joined([
    host_files("0-19", {0: "0-19"}, (125489508, 117236012, 119008644),
               "27 23 0:26 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,inode64\n",
               "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.126.09  Release Build  (dvs-builder@U22-I3-AM04-20-1)  Thu Jan 15 21:06:41 UTC 2026\n"
               "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04) \n",
               "6.17.0-1008-nvidia", "(buildd@bos03-arm64-041) #8-Ubuntu SMP PREEMPT_DYNAMIC",
               [_GB10_GPU], "NVIDIA GB10"),
    pci_device(_GB10_GPU, "0x10de", "0x2e12", "0x030000", 0, "0-19"),
    *(pci_device(addr, "0x15b3", "0x1021", "0x020000", 0, "0-19", GEN5, 4)
      for addr in ("0000:01:00.0", "0000:01:00.1", "0002:01:00.0", "0002:01:00.1")),
    rdma_device("rocep1s0f0", "0000:01:00.0", "enp1s0f0np0", ACTIVE, "200 Gb/sec (4X HDR)", "Ethernet"),
    rdma_device("rocep1s0f1", "0000:01:00.1", "enp1s0f1np1", DOWN, "40 Gb/sec (4X QDR)", "Ethernet"),
    rdma_device("roceP2p1s0f0", "0002:01:00.0", "enP2p1s0f0np0", ACTIVE, "200 Gb/sec (4X HDR)", "Ethernet"),
    rdma_device("roceP2p1s0f1", "0002:01:00.1", "enP2p1s0f1np1", DOWN, "40 Gb/sec (4X QDR)", "Ethernet"),
])
GB10_1X = {
    "nvml": "gb10-1x.json",
    "profile": "gb10",
    "shm_size": 62744752 * 1024,  # the kernel's default tmpfs: half of MemTotal's pages
    "files": _GB10_FILES,
    "links": _GB10_LINKS,
    "tools": {"nvidia-smi": {"topo -m": "topo-m-580.txt"}},
    "captures": {"topo-m-580.txt": lambda: header_as_580((TOPO / "24_dgx-spark-gb10_1gpu_4-roce-nics_rocep-names_gpu-numa-id.txt").read_text())},
}

# 8 x H100 SXM on one NUMA node: the host of tests/fixtures/topo/02 boots with numa=off (its
# /etc/default/grub, printed beside the matrix in the same notes), so the kernel keeps one node for
# CPUs 0-191 and the devices' numa_node reads -1 (no firmware proximity is parsed). Twelve
# ConnectX NICs named as the capture's NIC Legend, eight beside a GPU (PIX) and two dual-port cards
# (mlx5_3/4, mlx5_9/10: the capture's NIC pairs at PIX); RoCE (the same notes run NCCL with
# NCCL_IB_GID_INDEX=3, a RoCE v2 GID), every port ACTIVE. The GPUs, NVSwitches and NIC addresses
# are made for this test (the DGX H100's GPU bus ids, NICs in PCI order so the kernel's names come
# out as the capture's); the hgx-h100 sysfs tree is not reused: its two NUMA nodes and its NIC
# layout are tests/fixtures/topo/03's, not this capture's. NVML: the healthy HGX node on driver 570,
# fabric registered; systemd says the fabric manager is active.
_H100_GPUS = ["0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0", "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0"]
# RDMA device -> (PCI address, netdev, rate): the capture's NIC order is PCI order
_H100_NICS = {
    "mlx5_0": ("0000:18:00.0", "enp24s0np0", "400 Gb/sec (4X NDR)"),  # PIX to GPU0
    "mlx5_1": ("0000:40:00.0", "enp64s0np0", "400 Gb/sec (4X NDR)"),  # GPU1
    "mlx5_2": ("0000:4f:00.0", "enp79s0np0", "400 Gb/sec (4X NDR)"),  # GPU2
    "mlx5_3": ("0000:54:00.0", "enp84s0f0np0", "200 Gb/sec (4X HDR)"),  # dual-port card
    "mlx5_4": ("0000:54:00.1", "enp84s0f1np1", "200 Gb/sec (4X HDR)"),
    "mlx5_5": ("0000:5e:00.0", "enp94s0np0", "400 Gb/sec (4X NDR)"),  # GPU3
    "mlx5_6": ("0000:9a:00.0", "enp154s0np0", "400 Gb/sec (4X NDR)"),  # GPU4
    "mlx5_7": ("0000:c0:00.0", "enp192s0np0", "400 Gb/sec (4X NDR)"),  # GPU5
    "mlx5_8": ("0000:ce:00.0", "enp206s0np0", "400 Gb/sec (4X NDR)"),  # GPU6
    "mlx5_9": ("0000:d5:00.0", "enp213s0f0np0", "200 Gb/sec (4X HDR)"),  # dual-port card
    "mlx5_10": ("0000:d5:00.1", "enp213s0f1np1", "200 Gb/sec (4X HDR)"),
    "mlx5_11": ("0000:dc:00.0", "enp220s0np0", "400 Gb/sec (4X NDR)"),  # GPU7
}
_H100_1NUMA_FILES, _H100_1NUMA_LINKS = joined([
    host_files("0-191", {0: "0-191"}, (2113362216, 2090000000, 2095000000),
               "24 98 0:23 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,seclabel,inode64\n",
               "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 13:22:30 UTC 2025\n"
               "GCC version:  gcc version 11.5.0 20240719 (Red Hat 11.5.0-2) (GCC) \n",
               "5.14.0-503.14.1.el9_5.x86_64", "(mockbuild@x64-builder02.almalinux.org) #1 SMP PREEMPT_DYNAMIC",
               _H100_GPUS, "NVIDIA H100 80GB HBM3"),
    {"proc/cmdline": "BOOT_IMAGE=(hd0,gpt2)/vmlinuz-5.14.0-503.14.1.el9_5.x86_64 root=/dev/mapper/rootvg-lvroot ro "
                     "ipv6.disable=1 selinux=0 audit=1 tsx=auto slab_nomerge numa=off rd.driver.blacklist=nouveau\n"},
    *(pci_device(addr, "0x10de", "0x2330", "0x030200", -1, "0-191", GEN5, 16) for addr in _H100_GPUS),
    # the board's four NVSwitches, NVIDIA bridges (class 0x0680): the only facts of theirs the fabric check reads
    *(pci_device(f"0000:0{bus}:00.0", "0x10de", "0x22a3", "0x068000", -1, "0-191") for bus in (5, 6, 7, 8)),
    *(pci_device(addr, "0x15b3", "0x1021", "0x020000", -1, "0-191", GEN5, 16) for addr, _, _ in _H100_NICS.values()),
    *(rdma_device(name, addr, netdev, ACTIVE, rate, "Ethernet") for name, (addr, netdev, rate) in _H100_NICS.items()),
])
H100_SXM_8X_1NUMA = {
    "nvml": "h100-sxm-8x-1numa.json",
    "profile": "h100-sxm",
    "shm_size": 1056681108 * 1024,  # the kernel's default tmpfs: half of MemTotal
    "files": _H100_1NUMA_FILES,
    "links": _H100_1NUMA_LINKS,
    "tools": {"nvidia-smi": {"topo -m": "topo-m.txt"}, "systemctl": {"is-active nvidia-fabricmanager": "fm-active.txt"}},
    "captures": {"topo-m.txt": lambda: (TOPO / "02_h100-sxm-8x_nv18_12nic_single-numa-0-191_gpu-numa-id.txt").read_text(),
                 "fm-active.txt": lambda: "active\n"},
}

# A Kubernetes pod given 2 of an HGX H100 8-GPU board's GPUs by the NVIDIA device plugin, as the pod
# sees it: containerd with the NVIDIA Container Toolkit's hook (libnvidia-container), cgroup v2 in its
# own cgroup namespace. The board is tests/fixtures/topo/03's, laid out as the hgx-h100 sysfs tree
# writes it (make_hgx_h100.py: two NUMA nodes, GPUs 1b/43/52/61 on node 0, twelve ConnectX-7); the
# pod holds its GPU 0 and 1 (1b, 43: device minors 0 and 1) and their NICs mlx5_0 and mlx5_1 (PIX to
# them), 24 CPUs of node 0 (the static CPU manager's whole cores) and a 16Gi memory-backed emptyDir
# at /dev/shm. What a pod sees of the host: sysfs's whole PCI bus (every GPU, NVSwitch and NIC of
# the board), the NUMA nodes, /proc/meminfo and /proc/modules; of the rest only its own: /dev holds
# its two GPUs' nodes, /proc/driver/nvidia a tmpfs with the driver's version and its two GPUs'
# entries (libnvidia-container's mount_procfs, mount_procfs_gpu), /sys/class/infiniband the RDMA
# devices moved into its network namespace (RDMA netns exclusive mode), /sys/fs/cgroup its own
# cgroup. No /dev/kmsg (not among a container's devices) and no CAP_SYSLOG: dmesg is refused, the
# Xid scan is not judged. No systemd, and the fabric manager runs on the host: every GPU's fabric
# registration completed says it did its work. tests/fixtures/node-shapes/SOURCE.md cites each fact.
_HGX_NODE_CPUS = {0: "0-55,112-167", 1: "56-111,168-223"}
_HGX_GPUS = {"0000:1b:00.0": 0, "0000:43:00.0": 0, "0000:52:00.0": 0, "0000:61:00.0": 0,
             "0000:9d:00.0": 1, "0000:c3:00.0": 1, "0000:d1:00.0": 1, "0000:df:00.0": 1}
# RDMA device -> (PCI address, NUMA node, PCI class): the hgx-h100 tree's (make_hgx_h100.py NICS)
_HGX_NICS = {
    "mlx5_0": ("0000:18:00.0", 0, "0x020700"), "mlx5_1": ("0000:40:00.0", 0, "0x020700"),
    "mlx5_2": ("0000:4f:00.0", 0, "0x020700"), "mlx5_3": ("0000:5e:00.0", 0, "0x020700"),
    "mlx5_4": ("0000:29:00.0", 0, "0x020000"), "mlx5_5": ("0000:29:00.1", 0, "0x020000"),
    "mlx5_6": ("0000:9a:00.0", 1, "0x020700"), "mlx5_7": ("0000:c0:00.0", 1, "0x020700"),
    "mlx5_8": ("0000:ce:00.0", 1, "0x020700"), "mlx5_9": ("0000:dc:00.0", 1, "0x020700"),
    "mlx5_10": ("0000:aa:00.0", 1, "0x020000"), "mlx5_11": ("0000:aa:00.1", 1, "0x020000"),
}
_POD_GPUS = ["0000:1b:00.0", "0000:43:00.0"]
_POD_CPUSET = "1-12,113-124"  # 12 cores of node 0 and their hyperthread siblings (CPU n and n+112)
_POD_UID = "6b0f6c7e-3d2a-4c55-9a0e-5f2d8c41a7b3"
_POD_SANDBOX = "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/3f9d0e6b8a4c"
_SNAPSHOTS = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots"
_POD_MOUNTINFO = (
    f"1813 1602 0:412 / / rw,relatime master:981 - overlay overlay rw,lowerdir={_SNAPSHOTS}/4127/fs:{_SNAPSHOTS}/4126/fs:"
    f"{_SNAPSHOTS}/4125/fs,upperdir={_SNAPSHOTS}/4391/fs,workdir={_SNAPSHOTS}/4391/work\n"
    "1814 1813 0:415 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "1815 1813 0:416 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755,inode64\n"
    "1816 1815 0:417 / /dev/pts rw,nosuid,noexec,relatime - devpts devpts rw,gid=5,mode=620,ptmxmode=666\n"
    "1817 1815 0:401 / /dev/mqueue rw,nosuid,nodev,noexec,relatime - mqueue mqueue rw\n"
    "1818 1813 0:404 / /sys ro,nosuid,nodev,noexec,relatime - sysfs sysfs ro\n"
    "1819 1818 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate,memory_recursiveprot\n"
    "1820 1815 0:398 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=16777216k,inode64\n"
    f"1821 1813 259:2 /var/lib/kubelet/pods/{_POD_UID}/etc-hosts /etc/hosts rw,relatime - ext4 /dev/nvme0n1p2 rw\n"
    f"1822 1815 259:2 /var/lib/kubelet/pods/{_POD_UID}/containers/trainer/5c2e91d0 /dev/termination-log rw,relatime - ext4 /dev/nvme0n1p2 rw\n"
    f"1823 1813 259:2 {_POD_SANDBOX}/hostname /etc/hostname rw,relatime - ext4 /dev/nvme0n1p2 rw\n"
    f"1824 1813 259:2 {_POD_SANDBOX}/resolv.conf /etc/resolv.conf rw,relatime - ext4 /dev/nvme0n1p2 rw\n"
    "1825 1813 0:397 / /run/secrets/kubernetes.io/serviceaccount ro,relatime - tmpfs tmpfs rw,size=419430400k,inode64\n"
    "1826 1814 0:418 / /proc/driver/nvidia rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=555,inode64\n"
    "1827 1815 0:5 /nvidiactl /dev/nvidiactl ro,nosuid,noexec,relatime - devtmpfs udev rw,size=1056681108k,nr_inodes=264170277,mode=755,inode64\n"
    "1828 1815 0:5 /nvidia-uvm /dev/nvidia-uvm ro,nosuid,noexec,relatime - devtmpfs udev rw,size=1056681108k,nr_inodes=264170277,mode=755,inode64\n"
    "1829 1815 0:5 /nvidia0 /dev/nvidia0 ro,nosuid,noexec,relatime - devtmpfs udev rw,size=1056681108k,nr_inodes=264170277,mode=755,inode64\n"
    "1830 1826 0:22 /driver/nvidia/gpus/0000:1b:00.0 /proc/driver/nvidia/gpus/0000:1b:00.0 ro,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "1831 1815 0:5 /nvidia1 /dev/nvidia1 ro,nosuid,noexec,relatime - devtmpfs udev rw,size=1056681108k,nr_inodes=264170277,mode=755,inode64\n"
    "1832 1826 0:22 /driver/nvidia/gpus/0000:43:00.0 /proc/driver/nvidia/gpus/0000:43:00.0 ro,nosuid,nodev,noexec,relatime - proc proc rw\n"
)
_POD_FILES, _POD_LINKS = joined([
    # the host's share: its CPUs and NUMA nodes, meminfo, the driver, the kernel; the pod's two GPUs' device nodes and entries
    host_files("0-223", _HGX_NODE_CPUS, (2113362216, 2031847204, 2072950112),
               "", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 13:22:30 UTC 2025\n"
               "GCC version:  gcc version 11.4.0 (Ubuntu 11.4.0-1ubuntu1~22.04) \n",
               "5.15.0-105-generic", "(buildd@lcy02-amd64-007) #115-Ubuntu SMP", _POD_GPUS, "NVIDIA H100 80GB HBM3"),
    {   # the pod's own: its cpuset, its mounts, its cgroup (the namespace's root: its container's cgroup)
        "proc/self/status": f"Name:\tpreflight\nCpus_allowed_list:\t{_POD_CPUSET}\nMems_allowed_list:\t0-1\n",
        "proc/self/mountinfo": _POD_MOUNTINFO,
        "dev/nvidia-uvm": "",
        "sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma misc\n",
        "sys/fs/cgroup/cpu.max": "2400000 100000\n",
        "sys/fs/cgroup/cpuset.cpus.effective": f"{_POD_CPUSET}\n",
        "sys/fs/cgroup/cpuset.mems.effective": "0-1\n",
        "sys/fs/cgroup/memory.max": f"{400 << 30}\n",
        "sys/fs/cgroup/memory.current": f"{3 << 30}\n",
        "sys/fs/cgroup/memory.stat": (f"anon {1 << 30}\nfile {2 << 30}\nkernel {64 << 20}\nshmem 0\n"
                                      f"active_anon {1 << 30}\ninactive_anon 0\nactive_file {512 << 20}\ninactive_file {1536 << 20}\n"),
        # the host's modules (/proc/modules is not namespaced): the open driver, no peer-memory module: GPUDirect RDMA by dma-buf
        "proc/modules": ("nvidia_uvm 2076672 4 - Live 0x0000000000000000 (OE)\n"
                         "nvidia 11718656 310 nvidia_uvm, Live 0x0000000000000000 (OE)\n"
                         "mlx5_ib 483328 0 - Live 0x0000000000000000 (OE)\n"
                         "ib_core 499712 9 mlx5_ib, Live 0x0000000000000000 (OE)\n"),
        "sys/module/nvidia/version": "570.133.20\n",
        # the board's four NVSwitches (class 0x0680): the only facts of theirs the fabric check reads
        **{f"sys/bus/pci/devices/0000:0{bus}:00.0/{name}": value
           for bus in (5, 6, 7, 8) for name, value in (("vendor", "0x10de\n"), ("class", "0x068000\n"))},
    },
    *(pci_device(addr, "0x10de", "0x2330", "0x030200", node, _HGX_NODE_CPUS[node], GEN5, 16) for addr, node in _HGX_GPUS.items()),
    *(pci_device(addr, "0x15b3", "0x1021", klass, node, _HGX_NODE_CPUS[node], GEN5, 16) for addr, node, klass in _HGX_NICS.values()),
    rdma_device("mlx5_0", "0000:18:00.0", "ibp24s0", ACTIVE, "400 Gb/sec (4X NDR)", "InfiniBand"),
    rdma_device("mlx5_1", "0000:40:00.0", "ibp64s0", ACTIVE, "400 Gb/sec (4X NDR)", "InfiniBand"),
])
del _POD_FILES["dev/kmsg"]  # a container's /dev has no kmsg (containerd's default devices)
H100_SXM_POD_2OF8 = {
    "nvml": "h100-sxm-pod-2of8.json",
    "profile": "h100-sxm",
    "shm_size": 16 << 30,  # the emptyDir's sizeLimit: 16Gi
    "files": _POD_FILES,
    "links": _POD_LINKS,
    "environ": {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "HOSTNAME": "trainer-0",
                "NVIDIA_VISIBLE_DEVICES": "GPU-5c1b0c7e-8f2a-4d3b-9e6a-000000000000,GPU-5c1b0c7e-8f2a-4d3b-9e6a-000000000001"},
    "tools": {"nvidia-smi": {"topo -m": "topo-m-580.txt"}, "dmesg": {"": ("dmesg-denied.txt", 1)}},
    "captures": {"topo-m-580.txt": lambda: header_as_580(cut_topo((TOPO / "03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt").read_text(),
                                                                  gpus=[0, 1], nics=[0, 1], cpuset=_POD_CPUSET)),
                 "dmesg-denied.txt": lambda: "dmesg: read kernel buffer failed: Operation not permitted\n"},
}

NODES = {"h200-1x-vm": H200_VM, "hgx-h100-8x": HGX_H100, "a100-pcie-2x": A100_PCIE_2X, "gb10-1x": GB10_1X,
         "h100-sxm-8x-1numa": H100_SXM_8X_1NUMA, "h100-sxm-pod-2of8": H100_SXM_POD_2OF8}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("node", choices=sorted(NODES))
    p.add_argument("tree", type=Path)
    p.add_argument("--level", default="quick")
    p.add_argument("--only", default="")
    p.add_argument("--config", type=Path)
    p.add_argument("--shm-size", type=int)
    p.add_argument("--profile", help="judge by this profile, not the node's own (generic: as `auto` where no profile names the model)")
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

    flags = {"profile": args.profile or facts["profile"], "level": args.level, "keep_going": True,
             "nvml_fake": HERE / "fixtures" / "nvml" / facts["nvml"]}
    if args.only:
        flags["only"] = args.only
    environ = {"PATH": str(bin_dir), **facts.get("environ", {})}  # a pod's: what the kubelet and the device plugin set
    settings = settings_mod.load(flags, args.config, environ={})
    planned = plan_mod.plan(settings)
    report = plan_mod.execute(planned, settings, Console(quiet=True, stream=sys.stderr), Host(args.tree, environ=environ))
    print(report.model_dump_json())
    return 0


if __name__ == "__main__":
    os.environ.pop("PREFLIGHT_CONFIG", None)
    sys.exit(main())
