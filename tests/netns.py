"""Hosts for multi-node tests: network namespaces on one bridge.

A "switch" namespace holds a bridge; each host is a namespace with one veth
renamed eth0, address 10.77.X.N/24 (X differs per test run, so leftovers of a
killed run never collide). Every name carries a per-run tag, and ``cleanup``
deletes the namespaces, which removes their veths and kills nothing else; the
processes a test started it must stop itself (``run_in`` gives them sessions).
Needs root and `ip netns` (iproute2); tests skip where either is missing.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field

import pytest


def usable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "`ip` (iproute2) is not installed"
    return None


needs_netns = pytest.mark.skipif(usable() is not None, reason=usable() or "")


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=check)


@dataclass
class Host:
    ns: str  # namespace name
    addr: str  # its eth0 address
    veth: str  # the switch end of its link: set it down or rate-limit it there

    def argv(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *cmd]


@dataclass
class Net:
    tag: str
    switch: str
    hosts: list[Host] = field(default_factory=list)

    def link_down(self, host: Host) -> None:
        """Cut the host off the switch: packets to and from it vanish, no RST."""
        sh("ip", "-n", self.switch, "link", "set", host.veth, "down")

    def limit(self, host: Host, rate: str = "10mbit") -> None:
        """tbf on the switch side: traffic towards the host is slow (netem is not available here)."""
        sh("ip", "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", host.veth, "root", "tbf", "rate", rate, "burst", "32kbit", "latency", "50ms")

    def cleanup(self) -> None:
        for h in self.hosts:
            sh("ip", "netns", "del", h.ns, check=False)
        sh("ip", "netns", "del", self.switch, check=False)


def make(n: int) -> Net:
    """``n`` hosts on one bridge, loopback up in each."""
    tag = secrets.token_hex(3)
    net = Net(tag, f"pfsw-{tag}")
    subnet = 10 + secrets.randbelow(240)
    try:
        sh("ip", "netns", "add", net.switch)
        sh("ip", "-n", net.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", net.switch, "link", "set", "br0", "up")
        for i in range(n):
            h = Host(f"pf{i}-{tag}", f"10.77.{subnet}.{i + 1}", f"v{i}-{tag}")
            net.hosts.append(h)
            sh("ip", "netns", "add", h.ns)
            sh("ip", "link", "add", h.veth, "netns", net.switch, "type", "veth", "peer", "name", f"p{i}-{tag}", "netns", h.ns)
            sh("ip", "-n", h.ns, "link", "set", f"p{i}-{tag}", "name", "eth0")
            sh("ip", "-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
            sh("ip", "-n", h.ns, "link", "set", "eth0", "up")
            sh("ip", "-n", h.ns, "link", "set", "lo", "up")
            sh("ip", "-n", net.switch, "link", "set", h.veth, "master", "br0")
            sh("ip", "-n", net.switch, "link", "set", h.veth, "up")
    except BaseException:
        net.cleanup()
        raise
    return net
