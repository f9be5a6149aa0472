"""RDMA NICs: GPUDirect RDMA possible, every port up at its rate, no error
counter growing.

A node can pass a port-state check and still cut multi-node training short:
without nvidia-peermem or dma-buf NCCL stages every inter-node byte through
host memory (a 2-node all_reduce fell from ~180 to ~10 GB/s, NVIDIA/nccl#1676);
a port that trained at HDR instead of NDR halves its rail; a link that counts
symbol errors or goes down and up again stalls or kills the job's collectives.
preflight/readers/machine/ibports.py reads sysfs twice, a few seconds apart (the first
read as the run begins, so the wait runs beside the checks before this one); the
judges, pure, are in preflight/checkkit/rdma_judges.py, and which ports are the
job's in preflight/checkkit/rdma_ports.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from preflight.base.findings import Finding, Measurement, worst
from preflight.base.host import Host
from preflight.checkkit.rdma_judges import (at_ceiling, came_up, changed, judge_counters, judge_gpudirect, judge_ports, other_ports,
                                            rate_basis, rate_floor, seconds, slow_symbol_errors)
from preflight.checkkit.rdma_ports import chosen_by, compute, held
from preflight.pipeline.check import Check, Context, Result
from preflight.pipeline.expectations import RdmaExpect
from preflight.pipeline.shape import pci_nvidia
from preflight.readers.machine import ibports
from preflight.readers.machine.ibports import FirstRead, RdmaFacts

NO_DEVICE = "no InfiniBand/RoCE device in /sys/class/infiniband"
# Where no profile says more: every port judged for state and counters, no rate, no GPUDirect.
ANY_SKU = RdmaExpect(link_layer="any", interval_source="default: 3 s between the two reads of the counters")


def judge(facts: RdmaFacts, expect: RdmaExpect, gpus: int) -> dict[str, list[Finding]]:
    return {"gpudirect": judge_gpudirect(facts, expect, gpus), "ports": judge_ports(facts, expect), "counters": judge_counters(facts, expect)}


def measurements(facts: RdmaFacts, expect: RdmaExpect) -> list[Measurement]:
    out = []
    for p in facts.ports:
        labels = {"device": p.device, "port": str(p.port)}
        if p.gbps is not None:
            out.append(Measurement(name="rdma_port_rate", unit="gbit_per_second", value=p.gbps, labels=labels,
                                   floor=rate_floor(p, facts, expect) if compute(p, expect, facts) and held(p, facts) else None))
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
    description = ("RDMA NICs: GPUDirect RDMA possible (nvidia-peermem or dma-buf), compute ports ACTIVE and none slower than its peers "
                   "(or the site's rate), no error counter growing")
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
        expect = ctx.profile.rdma or ANY_SKU
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
        details["rate"] = rate_basis(facts, expect)  # what the compute ports' rate was held to
        judged = bool(gpus and expect.gpudirect and details["compute_ports"]["ports"])
        if not gpus or not expect.gpudirect:
            details["gpudirect"] = "not judged: " + ("no GPU on this node" if not gpus else f"profile {ctx.profile.name} does not expect GPUDirect RDMA")
        elif not judged:  # judge_gpudirect looked at nothing: the summary must not vouch for it
            details["gpudirect"] = f"not judged: no port carries the job's traffic (chosen by {details['compute_ports']['chosen_by']})"
        findings = [f for found in parts.values() for f in found]
        up = sum(p.state_now == "ACTIVE" for p in facts.ports)
        ok = f"{up}/{len(facts.ports)} RDMA ports ACTIVE, no error counter grew in {facts.interval_seconds:g} s"
        if judged:
            ok += "; GPUDirect RDMA by " + ("nvidia-peermem" if facts.peermem or facts.memory_peers else "dma-buf")
        elif gpus and expect.gpudirect:
            ok += "; no port carries the job's traffic (details.compute_ports): GPUDirect RDMA not judged"
        if details["slow_symbol_errors"]:
            ok += f"; symbol_error grew on {len(details['slow_symbol_errors'])} port(s) within {expect.symbol_errors_per_second:g}/s (details.slow_symbol_errors)"
        if details["since_boot"]:
            ok += f"; {len(details['since_boot'])} counts since boot, not growing (details.since_boot)"
        lines = []
        if details["rate"]["below_reference"] and not expect.rate_gbps:
            # The site's fabric, not a fault: said where a person reads it, never a WARN. Where the
            # site set its own rate the ports were judged by it, and details.rate says the rest.
            lines.append(details["rate"]["below_reference"])
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
