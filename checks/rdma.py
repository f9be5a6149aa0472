"""RDMA NICs: GPUDirect RDMA possible, every port up at its rate, no error
counter growing.

A node can pass a port-state check and still cut multi-node training short:
without nvidia-peermem or dma-buf NCCL stages every inter-node byte through
host memory (a 2-node all_reduce fell from ~180 to ~10 GB/s, NVIDIA/nccl#1676);
a port that trained at HDR instead of NDR halves its rail; a link that counts
symbol errors or goes down and up again stalls or kills the job's collectives.
preflight/readers/machine/ibports.py reads sysfs twice, a few seconds apart (the first
read as the run begins, so the wait runs beside the checks before this one); the
judges here are pure.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from preflight.base.findings import Finding, Measurement, Status, worst
from preflight.base.host import Host
from preflight.pipeline.check import Check, Context, Result
from preflight.pipeline.expectations import RdmaExpect
from preflight.pipeline.shape import pci_nvidia
from preflight.readers.machine import ibports
from preflight.readers.machine.ibports import ERROR_COUNTERS, FirstRead, Port, RdmaFacts

FAIL, WARN = Status.FAIL, Status.WARN
NO_DEVICE = "no InfiniBand/RoCE device in /sys/class/infiniband"
LINK_FIX = ("check the cable and transceiver and the switch port (`ibstat`, `mlxlink -d <dev> -m` for the module's "
            "temperature and power); reseat or replace the cable, then clear the counters (`perfquery -x`) and run again")
# Where no profile says more: every port judged for state and counters, no rate, no GPUDirect.
GENERIC = RdmaExpect(link_layer="any", interval_source="default: 3 s between the two reads of the counters")


def hca_names(spec: str) -> Callable[[str, int], bool]:
    """NCCL_IB_HCA as NCCL reads it: a comma list of dev[:port], each a prefix of the
    device name unless the list starts with "="; a leading "^" excludes those listed
    (NCCL env docs, NCCL_IB_HCA)."""
    text = spec.strip()
    exclude = text.startswith("^")
    text = text[1:] if exclude else text
    exact = text.startswith("=")
    text = text[1:] if exact else text
    items = []
    for item in filter(None, (i.strip() for i in text.split(","))):
        dev, _, port = item.partition(":")
        items.append((dev, int(port) if port.isdigit() else None))

    def listed(dev: str, port: int) -> bool:
        return any((dev == d if exact else dev.startswith(d)) and p in (None, port) for d, p in items)
    return lambda dev, port: listed(dev, port) != exclude


UNCABLED = ("Polling", "Disabled")


def _card(p: Port) -> str:
    """The adapter a port is on: its PCI address without the function (a dual-port card
    shows as two functions, or as one device with two ports)."""
    return p.pci.rsplit(".", 1)[0] if p.pci else p.device


def spare(port: Port, facts: RdmaFacts) -> bool:
    """An uncabled or disabled port on a card whose other port runs: the dual-port
    card's unused port, which no job uses unless NCCL_IB_HCA names it."""
    return port.phys_state in UNCABLED and any(o is not port and _card(o) == _card(port) and o.state_now == "ACTIVE" for o in facts.ports)


def compute(port: Port, expect: RdmaExpect, facts: RdmaFacts | None = None) -> bool:
    """Whether the port carries the job's traffic: named in NCCL_IB_HCA where that is set;
    else of the profile's link layer, not a card's spare port and, where sysfs tells,
    beside a GPU (a storage port sits elsewhere)."""
    if facts is not None and facts.ib_hca is not None:
        return hca_names(facts.ib_hca[0])(port.device, port.port)
    if expect.link_layer != "any" and port.link_layer != expect.link_layer:
        return False
    if facts is not None and spare(port, facts):
        return False
    return port.near_gpu is not False


def chosen_by(facts: RdmaFacts) -> str:
    if facts.ib_hca is not None:
        return f"NCCL_IB_HCA={facts.ib_hca[0]} ({facts.ib_hca[1]})"
    if any(p.near_gpu is not None for p in facts.ports):
        return "the profile's link_layer and a PCIe switch shared with a GPU"
    return "the profile's link_layer (sysfs does not show which NICs sit beside the GPUs)"


def judge_gpudirect(facts: RdmaFacts, expect: RdmaExpect, gpus: int) -> list[Finding]:
    """GPUDirect RDMA needs nvidia-peermem (or MLNX_OFED's nv_peer_mem) or dma-buf
    (the open GPU kernel modules on Linux >= 5.12, NCCL_DMABUF_ENABLE not 0)."""
    if not expect.gpudirect or not gpus or not any(compute(p, expect, facts) for p in facts.ports):
        return []
    if facts.peermem or facts.memory_peers:
        return []
    dmabuf = facts.dmabuf_capable()
    setting = facts.dmabuf_setting
    if dmabuf and not (setting and setting[0].strip() == "0"):
        return []
    fix = ("load the peer-memory module: `modprobe nvidia-peermem` (and add it to /etc/modules-load.d so it loads at boot; "
           "the GPU Operator: driver.rdma.enabled=true), or use dma-buf: the NVIDIA open GPU kernel modules on Linux >= 5.12 "
           "with NCCL_DMABUF_ENABLE unset or 1")
    if dmabuf:
        return [Finding(FAIL, "GPUDirect RDMA off: NCCL_DMABUF_ENABLE=0",
                        f"NCCL_DMABUF_ENABLE=0 ({setting[1] if setting else ''}) turns off dma-buf, the only GPUDirect RDMA path on "
                        "this node (nvidia-peermem is not loaded): NCCL stages inter-node traffic through host memory",
                        "unset NCCL_DMABUF_ENABLE (or set it to 1), or `modprobe nvidia-peermem`")]
    why = []
    if facts.nvidia_open is None:
        why.append("no /proc/driver/nvidia/version: which NVIDIA kernel module is loaded is unknown")
    elif not facts.nvidia_open:
        why.append(f"the NVIDIA driver{' ' + facts.driver if facts.driver else ''} is the proprietary flavour, not the open kernel modules that dma-buf needs")
    if facts.kernel is None:
        why.append("the kernel version is unknown")
    elif dmabuf is False and facts.nvidia_open:
        why.append(f"kernel {facts.kernel} is older than 5.12, the first with dma-buf for RDMA")
    return [Finding(FAIL, "GPUDirect RDMA not possible: no nvidia-peermem, no dma-buf",
                    "nvidia_peermem is not loaded (/sys/module, /proc/modules) and dma-buf is not usable (" + "; ".join(why) +
                    "): NCCL stages every inter-node byte through host memory, a 2-node all_reduce falls from ~180 to ~10 GB/s",
                    fix)]


def judge_ports(facts: RdmaFacts, expect: RdmaExpect) -> list[Finding]:
    """State and rate as the second read found them: a port the subnet manager brings up while
    the node settles is judged once it is up, not by how it stood as the run began."""
    out = []
    for p in facts.ports:
        if not compute(p, expect, facts):
            continue  # an uncabled spare or storage port says nothing about the job: other_ports() reports it
        if p.state_now != "ACTIVE":
            if p.state_now in ("INIT", "ARMED"):
                cause = (f"{p.where} ({p.link_layer}) is {p.state_now} with the link {p.phys_state or 'up'}: the cable is fine but no "
                         "subnet manager has configured the port, so it carries no traffic")
                fix = "check that a subnet manager (opensm, UFM, the switch's SM) runs and reaches this port (`sminfo`, `ibstat`)"
            else:
                cause = f"{p.where} ({p.link_layer}) is {p.state_now or 'unreadable'} (physical state {p.phys_state or 'unknown'})"
                fix = ("the port is administratively disabled: enable it (`ibportstate`, `ip link set ... up`)" if p.phys_state == "Disabled"
                       else LINK_FIX)
            out.append(Finding(FAIL, f"{p.where} {p.state_now or 'unreadable'}", cause, fix))
        elif expect.rate_gbps and p.gbps is not None and p.gbps < expect.rate_gbps:
            out.append(Finding(FAIL, f"{p.where} at {p.rate_now}, {expect.rate_gbps:g} Gb/sec expected",
                               f"{p.where} trained at {p.rate_now}, below the {expect.rate_gbps:g} Gb/sec this SKU's compute NICs run at: "
                               "a degraded cable or transceiver, lanes down, or a slower switch port; this rail carries less than its share",
                               LINK_FIX))
    return out


def other_ports(facts: RdmaFacts, expect: RdmaExpect) -> list[str]:
    """Ports that are no compute port and are down or below the compute rate: reported only."""
    out = []
    for p in facts.ports:
        if compute(p, expect, facts):
            continue
        if p.state_now != "ACTIVE":
            out.append(f"{p.where} ({p.link_layer}) {p.state_now or 'unreadable'} (physical state {p.phys_state or 'unknown'})")
        elif expect.rate_gbps and p.gbps is not None and p.gbps < expect.rate_gbps:
            out.append(f"{p.where} ({p.link_layer}) at {p.rate_now}")
    return out


def slow_symbol_errors(p: Port, expect: RdmaExpect, interval: float) -> float | None:
    """symbol_error's growth per second where it grew no faster than the profile allows, else None."""
    grew = p.counters_later.get("symbol_error", 0) - p.counters.get("symbol_error", 0)
    rate = grew / max(interval, 1e-3)
    return rate if 0 < grew and rate <= expect.symbol_errors_per_second else None


UNJUDGED_AT_CEILING = ("port_xmit_discards", "symbol_error")


def at_ceiling(p: Port) -> list[str]:
    """The port's error counters that have stopped at their ceiling: growth there cannot be seen."""
    return [n for n, v in p.counters.items() if n in ERROR_COUNTERS and v >= (1 << ERROR_COUNTERS[n]) - 1]


def states(p: Port) -> list[str]:
    """The states the port was seen in, in order: the run's early read (where it was dropped), the two reads."""
    seen = [s or "unreadable" for s in (p.state_early, p.state, p.state_later) if s is not None]
    return [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]]


def flapped(p: Port) -> bool:
    """The port left ACTIVE while watched: ACTIVE, then anything lower, at any step (the run's
    early read included). A port climbing DOWN -> INIT -> ARMED -> ACTIVE is coming up (at boot
    the link trains while DOWN, phys Polling, then the subnet manager configures it, and
    network-online.target waits for none of it), and INIT <-> ARMED while the subnet manager
    works is no flap either: judge_ports judges the state it ends in, and a link that went down
    and came back while up is link_downed growing, judged below."""
    return "ACTIVE" in states(p)[:-1]


RISE = {"DOWN": 0, "INIT": 1, "ARMED": 1, "ACTIVE": 2}  # how far up a port is; INIT and ARMED alike (the subnet manager's steps)


def came_up(p: Port) -> str | None:
    """The states of a port that climbed while watched (never down a step), or None."""
    seen = states(p)
    steps = [RISE.get(s) for s in seen]
    rose = (len(seen) > 1 and None not in steps and all(a <= b for a, b in zip(steps, steps[1:]))  # type: ignore[operator]
            and steps[-1] > steps[0])  # type: ignore[operator]
    return " -> ".join(seen) if rose and not flapped(p) else None


def changed(p: Port) -> str | None:
    """The states of a port that moved while watched, neither coming up nor leaving ACTIVE (INIT -> DOWN
    as the subnet manager retrains a link at boot): said, not judged a flap; judged by where it ends."""
    seen = states(p)
    return " -> ".join(seen) if len(seen) > 1 and not flapped(p) and not came_up(p) else None


def seconds(p: Port, facts: RdmaFacts) -> float:
    """How long the port was watched: its own interval, where its early read stood while another's was taken again."""
    return p.interval_seconds if p.interval_seconds is not None else facts.interval_seconds


def judge_counters(facts: RdmaFacts, expect: RdmaExpect) -> list[Finding]:
    """Growth between the two reads: FAIL (WARN for discards, which congestion causes too;
    symbol errors only past the profile's rate). Counts since boot that did not grow are
    no finding, unless a counter sits at its ceiling, where growth could not be seen."""
    out = []
    for p in facts.ports:
        watched = seconds(p, facts)
        secs = f"{watched:g} s"
        if flapped(p):
            seen = " -> ".join(states(p))
            out.append(Finding(FAIL, f"{p.where} flapping: {seen}",
                               f"{p.where} went {seen} within {secs}" + (" and since the run began" if p.state_early is not None else ""), LINK_FIX))
        grew = {n: p.counters_later[n] - v for n, v in p.counters.items() if n in p.counters_later and p.counters_later[n] > v}
        if grew.get("link_downed"):
            out.append(Finding(FAIL, f"{p.where} flapping: link_downed +{grew.pop('link_downed')} in {secs}",
                               f"{p.where}'s link went down and came back while it was watched (link_downed grew from "
                               f"{p.counters['link_downed']} to {p.counters_later['link_downed']} in {secs}): every flap drops the job's connections",
                               LINK_FIX))
        discards = grew.pop("port_xmit_discards", 0)
        if slow_symbol_errors(p, expect, watched) is not None:
            grew.pop("symbol_error")  # raw bit errors at a rate FEC corrects: details.slow_symbol_errors
        if grew:
            said = ", ".join(f"{n} +{d}" for n, d in grew.items())
            rate = (f"; symbol_error at {grew['symbol_error'] / max(watched, 1e-3):.3g}/s, past {expect.symbol_errors_per_second:g}/s "
                    f"({expect.symbol_source})") if "symbol_error" in grew else ""
            out.append(Finding(FAIL, f"{p.where}: {said} in {secs}",
                               f"error counters of {p.where} grew while it was watched ({said} in {secs}{rate}): the link is corrupting "
                               "traffic now, and NCCL's retries stall or time out", LINK_FIX))
        if discards:
            out.append(Finding(WARN, f"{p.where}: port_xmit_discards +{discards} in {secs}",
                               f"{p.where} dropped {discards} packets on send in {secs}: congestion, or a peer that stopped taking traffic",
                               "check the fabric's congestion and the peer port (`perfquery` on the switch side)"))
        # Discards count congestion, not the cable, and symbol_error the raw bit errors FEC corrects
        # (a healthy PAM4 link at the profile's rate fills 16 bits in hours or days): a full
        # counter of either says nothing about the link (details.at_ceiling).
        stuck = [n for n in at_ceiling(p) if n not in grew and n not in UNJUDGED_AT_CEILING]
        if stuck:
            out.append(Finding(WARN, f"{p.where}: {', '.join(stuck)} at the counter's ceiling",
                               f"{', '.join(f'{n} = {p.counters[n]}' for n in stuck)} on {p.where}: the counter stops at its ceiling, "
                               "so growth cannot be seen", "clear the port's counters (`perfquery -x`) and run again"))
    return out


def judge(facts: RdmaFacts, expect: RdmaExpect, gpus: int) -> dict[str, list[Finding]]:
    return {"gpudirect": judge_gpudirect(facts, expect, gpus), "ports": judge_ports(facts, expect), "counters": judge_counters(facts, expect)}


def measurements(facts: RdmaFacts, expect: RdmaExpect) -> list[Measurement]:
    out = []
    for p in facts.ports:
        labels = {"device": p.device, "port": str(p.port)}
        if p.gbps is not None:
            out.append(Measurement(name="rdma_port_rate", unit="gbit_per_second", value=p.gbps, labels=labels,
                                   floor=expect.rate_gbps if compute(p, expect, facts) else None))
        for n, v in p.counters.items():
            out.append(Measurement(name=f"rdma_{n}", unit="count", value=p.counters_later.get(n, v), labels=labels))
    return out


def since_boot(facts: RdmaFacts) -> list[str]:
    """Error counts that did not grow while watched: reported, not judged."""
    return [f"{p.where} {n} {v}" for p in facts.ports for n, v in p.counters.items() if v and p.counters_later.get(n, v) == v]


class EarlyRead:
    """The counters' first read, taken in a thread of its own as the run begins: a counter read
    goes to the adapter's firmware (a PMA query), and a wedged adapter answers only at the
    driver's command timeout, which must hold neither the run's start nor this check past its deadline."""

    def __init__(self, host: Host) -> None:
        self.first: FirstRead | None = None
        self.thread = threading.Thread(target=self._read, args=(host,), name="rdma-first-read", daemon=True)
        self.thread.start()

    def _read(self, host: Host) -> None:
        try:
            self.first = ibports.first_read(host)
        except Exception:  # the check takes its own first read at its turn, and meets the trouble there
            pass

    def wait(self, until: float) -> FirstRead | None:
        """The first read, once done by ``until`` (time.monotonic()); else None."""
        self.thread.join(max(0.0, min(until - time.monotonic(), MAX_JOIN)))
        return self.first


MAX_JOIN = 3600.0


def has_devices(host: Host) -> bool:
    """Whether /sys/class/infiniband lists a device: one listdir of the class directory (its
    entries are links the driver made), no attribute of an adapter read."""
    try:
        return bool(os.listdir(host.path("/sys/class/infiniband")))
    except OSError:
        return False  # a run with no deadline still waits no longer than this for the first read


class Rdma(Check):
    name = "rdma"
    description = "RDMA NICs: GPUDirect RDMA possible (nvidia-peermem or dma-buf), ports ACTIVE at the SKU's rate, no error counter growing"
    timeout_seconds = 30.0
    order = 23
    beside_ranks = True  # reads the node: runs while the ranks import torch
    # Between the two reads of the counters; a test passes one that edits the tree instead of sleeping.
    wait: Callable[[float], None] = staticmethod(time.sleep)

    def applies(self, ctx: Context) -> str | None:
        ports, unread = ibports.scan(ctx.host)
        if not ports and unread:
            return f"RDMA ports not judged: {'; '.join(unread)}"
        if not ports:
            return NO_DEVICE
        return None

    def begin(self, ctx: Context) -> None:
        # The first read of the counters as the run begins: by this check's turn the interval
        # has run (or most of it) beside the checks before it, and only what is left is waited.
        # Only where there are ports to read: a run that will SKIP rdma starts no thread that
        # could sit in a wedged adapter's sysfs read for the rest of the run.
        if has_devices(ctx.host):
            ctx.readings[self.name] = EarlyRead(ctx.host)

    def run(self, ctx: Context) -> Result:
        expect = ctx.profile.rdma or GENERIC
        early = ctx.readings.pop(self.name, None)  # one run of the check per first read
        first = early.wait(ctx.deadline - 1) if isinstance(early, EarlyRead) else None
        gpus_at = list(ctx.shape.slots) if ctx.shape and ctx.shape.slots else (pci_nvidia(ctx.host).gpus or [])
        # The wait stays inside the check's deadline, with a second left to read and judge.
        facts = ibports.gather(ctx.host, expect.interval_seconds, self.wait, gpus_at, first, latest=ctx.deadline - 1)
        gpus = ctx.shape.gpus if ctx.shape and ctx.profile.has_gpus else 0
        parts = judge(facts, expect, gpus)
        details = facts.model_dump(mode="json")
        details["parts"] = {name: worst(found) for name, found in parts.items()}
        details["since_boot"] = since_boot(facts)
        details["slow_symbol_errors"] = {p.where: f"{r:.3g}/s, within {expect.symbol_errors_per_second:g}/s" for p in facts.ports
                                         if (r := slow_symbol_errors(p, expect, seconds(p, facts))) is not None}
        details["at_ceiling"] = {p.where: full for p in facts.ports if (full := at_ceiling(p))}  # growth unseen there
        details["compute_ports"] = {"chosen_by": chosen_by(facts), "ports": [p.where for p in facts.ports if compute(p, expect, facts)]}
        details["other_ports"] = other_ports(facts, expect)  # down or slower, but no compute port: not judged
        if not gpus or not expect.gpudirect:
            details["gpudirect"] = "not judged: " + ("no GPU on this node" if not gpus else f"profile {ctx.profile.name} does not expect GPUDirect RDMA")
        findings = [f for found in parts.values() for f in found]
        up = sum(p.state_now == "ACTIVE" for p in facts.ports)
        ok = f"{up}/{len(facts.ports)} RDMA ports ACTIVE, no error counter grew in {facts.interval_seconds:g} s"
        if gpus and expect.gpudirect:
            ok += "; GPUDirect RDMA by " + ("nvidia-peermem" if facts.peermem or facts.memory_peers else "dma-buf")
        if details["slow_symbol_errors"]:
            ok += f"; symbol_error grew on {len(details['slow_symbol_errors'])} port(s) within {expect.symbol_errors_per_second:g}/s (details.slow_symbol_errors)"
        if details["since_boot"]:
            ok += f"; {len(details['since_boot'])} counts since boot, not growing (details.since_boot)"
        lines = []
        if rising := {p.where: seen for p in facts.ports if (seen := came_up(p))}:
            details["came_up"] = rising  # ports brought up while watched: no flap, judged by the state they ended in
            lines.append("came up while watched, not a flap: " + "; ".join(f"{where} {seen}" for where, seen in rising.items()))
        if moved := {p.where: seen for p in facts.ports if (seen := changed(p))}:
            details["changed"] = moved  # moved below ACTIVE while watched: judged by the state they ended in
            lines.append("changed while watched, judged by where it ended: " + "; ".join(f"{where} {seen}" for where, seen in moved.items()))
        if facts.unread:
            details["unjudged"] = {"ports": "; ".join(facts.unread)}
            unjudged = [f"not judged: the ports under {u}" for u in facts.unread]
            lines += unjudged
            ok += "; " + "; ".join(unjudged)
        return self.conclude(findings, ok, measurements=measurements(facts, expect), details=details, lines=lines)
