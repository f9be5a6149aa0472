"""The rdma check's judges, pure functions of readers/machine/ibports.py's
facts against the profile's `[rdma]`: GPUDirect RDMA possible
(`judge_gpudirect`), the compute ports ACTIVE, none slower than the node's
fastest compute port of its link layer nor than a site's rate (`judge_ports`;
the rate they were held to, and whether they run below the reference design's,
`rate_basis`; the other ports reported only, `other_ports`), and error
counters that grew between the two reads or sit at their ceiling, and ports
that flapped (`judge_counters`), beside what a port's states while watched
say (`states`, `flapped`, `came_up`, `changed`). Which ports are compute
ports: checkkit/rdma_ports.py; checks/rdma.py gathers and joins the parts.
"""

from __future__ import annotations

from dataclasses import replace

from preflight.base.findings import Finding, Status
from preflight.checkkit.rdma_ports import compute, held
from preflight.pipeline.expectations import RdmaExpect
from preflight.readers.machine.ibports import ERROR_COUNTERS, Port, RdmaFacts

FAIL, WARN = Status.FAIL, Status.WARN
LINK_FIX = ("check the cable and transceiver and the switch port (`ibstat`, `mlxlink -d <dev> -m` for the module's "
            "temperature and power); reseat or replace the cable, then clear the counters (`perfquery -x`) and run again")


def judge_gpudirect(facts: RdmaFacts, expect: RdmaExpect, gpus: int) -> list[Finding]:
    """GPUDirect RDMA needs nvidia-peermem (or MLNX_OFED's nv_peer_mem) or dma-buf
    (the open GPU kernel modules on Linux >= 5.12, NCCL_DMABUF_ENABLE not 0). Where no compute
    port is surely a rail (rdma_ports.held), its absence WARNs: the ports may all be storage."""
    rails = [p for p in facts.ports if compute(p, expect, facts)]
    if not expect.gpudirect or not gpus or not rails:
        return []
    found = _gpudirect(facts)
    return found if any(held(p, facts) for p in rails) else unsure(found, None, facts)


def _gpudirect(facts: RdmaFacts) -> list[Finding]:
    """What keeps GPUDirect RDMA from the compute ports, if anything."""
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


def fastest(facts: RdmaFacts, expect: RdmaExpect) -> dict[str | None, Port]:
    """The node's fastest ACTIVE compute port of each link layer. One node's compute ports are
    cabled alike (a rail each), so the fastest says what the fabric gives this node, whatever
    the site chose (NDR, NDR200 on split cables, HDR100); a port not ACTIVE has no rate to go by."""
    out: dict[str | None, Port] = {}
    ours = [p for p in facts.ports if compute(p, expect, facts)]
    # Where some are surely rails (rdma_ports.held), a port that may be storage sets no pace for them.
    pacers = [p for p in ours if held(p, facts)] or ours
    for p in pacers:
        if p.state_now == "ACTIVE" and p.gbps is not None:
            top = out.get(p.link_layer)
            if top is None or p.gbps > top.gbps:  # type: ignore[operator]
                out[p.link_layer] = p
    return out


def judge_ports(facts: RdmaFacts, expect: RdmaExpect) -> list[Finding]:
    """State and rate as the second read found them: a port the subnet manager brings up while
    the node settles is judged once it is up, not by how it stood as the run began. A compute
    port's rate is held to the site's (rate_gbps, where a site profile sets it) and to the node's
    fastest compute port of its link layer: a port that trained at 2X of 4X is a fault on any fabric,
    while every port at 200 Gb/sec on a board whose reference design runs 400 is the site's cabling."""
    out = []
    tops = fastest(facts, expect)
    for p in facts.ports:
        if not compute(p, expect, facts):
            continue  # an uncabled spare or storage port says nothing about the job: other_ports() reports it
        cleared = p.model_copy(update={"counters": {**p.counters, "link_downed": 0}})
        clearable = p.counters.get("link_downed", 0) > 0 and not compute(cleared, expect, facts)
        out += unsure(_port_findings(p, tops.get(p.link_layer), expect, clearable), p, facts)
    return out


def unsure(found: list[Finding], p: Port | None, facts: RdmaFacts) -> list[Finding]:
    """``found`` on port ``p`` (None: on all the compute ports), its FAILs WARNs where the tree cannot
    say the port is a rail (rdma_ports.held)."""
    if p is not None and held(p, facts):
        return found
    which = f"{p.where} carries" if p is not None else "any of these ports carries"
    note = (f"; whether {which} the job's traffic is not known here ({facts.roles_unknown}): it may be storage, "
            "so this warns; name the rails in NCCL_IB_HCA to hold them to it")
    return [replace(f, status=WARN, cause=f.cause + note) if f.status == FAIL else f for f in found]


def _port_findings(p: Port, top: Port | None, expect: RdmaExpect, clearable: bool = False) -> list[Finding]:
    """A compute port's state and rate against the site's rate and ``top``, its link layer's fastest.
    ``clearable``: the port would be its card's unused spare but for a fall its counters keep."""
    out = []
    if p.state_now != "ACTIVE":
        if p.state_now in ("INIT", "ARMED"):
            cause = (f"{p.where} ({p.link_layer}) is {p.state_now} with the link {p.phys_state or 'up'}: the cable is fine but no "
                     "subnet manager has configured the port, so it carries no traffic")
            fix = "check that a subnet manager (opensm, UFM, the switch's SM) runs and reaches this port (`sminfo`, `ibstat`)"
        else:
            cause = f"{p.where} ({p.link_layer}) is {p.state_now or 'unreadable'} (physical state {p.phys_state or 'unknown'})"
            fix = ("the port is administratively disabled: enable it (`ibportstate`, `ip link set ... up`)" if p.phys_state == "Disabled"
                   else LINK_FIX)
            if clearable:  # went down since its counters were cleared: not read as its card's unused port (rdma_ports.spare)
                fix += ("; a port left unused on purpose reads as its card's spare once its counters are cleared "
                        "(`perfquery -x` on the port, or a driver reload)")
        out.append(Finding(FAIL, f"{p.where} {p.state_now or 'unreadable'}", cause, fix))
    elif expect.rate_gbps and p.gbps is not None and p.gbps < expect.rate_gbps:
        out.append(Finding(FAIL, f"{p.where} at {p.rate_now}, {expect.rate_gbps:g} Gb/sec expected",
                           f"{p.where} trained at {p.rate_now}, below the {expect.rate_gbps:g} Gb/sec the site's profile holds its compute "
                           f"ports to ({expect.rate_source}): a degraded cable or transceiver, lanes down, or a slower switch port; "
                           "this rail carries less than its share", LINK_FIX))
    elif top is not None and p.gbps is not None and p.gbps < top.gbps:  # type: ignore[operator]
        out.append(Finding(FAIL, f"{p.where} at {p.rate_now}, below {top.where}'s {top.rate_now}",
                           f"{p.where} trained at {p.rate_now}, slower than {top.where} at {top.rate_now}, the node's fastest "
                           f"{p.link_layer} compute port: one node's rails are cabled alike, so this one trained down (a degraded cable "
                           "or transceiver, lanes down) or sits on a slower switch port, and carries less than its share while "
                           "NCCL's rings run at the slowest rail's pace", LINK_FIX))
    return out


def rate_floor(p: Port, facts: RdmaFacts, expect: RdmaExpect) -> float | None:
    """The rate a compute port was held to: the site's and its link layer's fastest port's, the higher."""
    top = fastest(facts, expect).get(p.link_layer)
    bounds = [b for b in (expect.rate_gbps, top.gbps if top is not None else None) if b]
    return max(bounds) if bounds else None


def rate_basis(facts: RdmaFacts, expect: RdmaExpect) -> dict[str, str | None]:
    """What the compute ports' rate was held to, for details; ``below_reference`` where the node's
    fastest compute ports run below the reference design's rate: said, never judged (a site on
    NDR200 or HDR100 cabled it so; a port slower than its peers is judge_ports' FAIL)."""
    tops = fastest(facts, expect)
    peers = "; ".join(f"{layer}: {t.where} at {t.rate_now}" for layer, t in sorted(tops.items(), key=lambda kv: str(kv[0])))
    out: dict[str, str | None] = {
        "floor": (f"{expect.rate_gbps:g} Gb/sec, the site's ({expect.rate_source})" if expect.rate_gbps
                  else "none: how fast the fabric runs is the site's choice (a site profile's [rdma] rate_gbps sets one)"),
        "peers": f"each compute port held to the node's fastest of its link layer ({peers})" if peers else None,
        "reference": (f"{expect.reference_rate_gbps:g} Gb/sec, not a floor ({expect.reference_rate_source})"
                      if expect.reference_rate_gbps else None),
        "below_reference": None,
    }
    ref = expect.reference_rate_gbps
    if ref and tops and all(t.gbps is not None and t.gbps < ref for t in tops.values()):
        rates = " and ".join(sorted({str(t.rate_now) for t in tops.values()}))
        out["below_reference"] = (f"compute ports at {rates}, below the reference design's {ref:g} Gb/sec: the site's fabric "
                                  "(NDR200, HDR100 or the like), not a fault; the ports are held to each other"
                                  + (f" and to the site's {expect.rate_gbps:g} Gb/sec" if expect.rate_gbps else
                                     " (a site profile's [rdma] rate_gbps holds them to a rate)"))
    return out


def other_ports(facts: RdmaFacts, expect: RdmaExpect) -> list[str]:
    """Ports that are no compute port and are down or below the compute rate (the site's, else
    the node's fastest compute port's), or whose counters a compute port's would be judged by:
    reported only."""
    out = []
    tops = [t.gbps for t in fastest(facts, expect).values() if t.gbps is not None]
    bound = expect.rate_gbps or (max(tops) if tops else None)
    for p in facts.ports:
        if compute(p, expect, facts):
            continue
        if p.state_now != "ACTIVE":
            out.append(f"{p.where} ({p.link_layer}) {p.state_now or 'unreadable'} (physical state {p.phys_state or 'unknown'})")
        elif bound and p.gbps is not None and p.gbps < bound:
            out.append(f"{p.where} ({p.link_layer}) at {p.rate_now}")
        out += [f"{p.where} ({p.link_layer}): {f.summary.removeprefix(p.where).lstrip(': ')}" for f in _counter_findings(p, facts, expect)]
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
    """Growth between the two reads on the compute ports: FAIL (WARN for discards, which
    congestion causes too; symbol errors only past the profile's rate). Counts since boot that
    did not grow are no finding, unless a counter sits at its ceiling, where growth could not be
    seen. A port no job uses (a storage or management link bouncing in a switch's maintenance)
    says nothing about the job: ``other_ports`` reports it."""
    return [f for p in facts.ports if compute(p, expect, facts) for f in unsure(_counter_findings(p, facts, expect), p, facts)]


def _counter_findings(p: Port, facts: RdmaFacts, expect: RdmaExpect) -> list[Finding]:
    """What ``p``'s state and counters between the two reads would say of a compute port."""
    out = []
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
