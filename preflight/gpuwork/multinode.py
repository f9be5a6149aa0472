"""Which group of nodes this one belongs to, for the checks that span nodes.

A group is what torchrun's rendezvous across nodes needs: how many nodes, this node's
rank among them, the endpoint every node meets at, and an id for the
rendezvous. Given by hand, or read from Slurm's environment, where `srun -N 4
--ntasks-per-node=1 preflight run --multi-node` sets everything: SLURM_NNODES,
SLURM_NODEID, and the first host of SLURM_JOB_NODELIST as the endpoint.
"""

from __future__ import annotations

import itertools
import math
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from preflight.base.errors import UsageError

DEFAULT_PORT = 29500  # torchrun's own default rendezvous port: what a site's firewall already opens
# preflight's own meeting store (node rank 0, PORT+1): nodes say there whether they
# may join, and what they found. Apart from torchrun's store, which lives and dies
# with each launch, so a node never talks to the wrong one.
MEETING_OFFSET = 1
MAX_HOSTS = 65536  # Slurm's largest clusters are tens of thousands of nodes; a range past this is a typo, and would be built in memory


@dataclass(frozen=True)
class Group:
    nnodes: int
    node_rank: int
    endpoint: str  # HOST:PORT of the rendezvous store (node rank 0 hosts it)
    rdzv_id: str

    @property
    def host(self) -> str:
        return self.endpoint.rpartition(":")[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.endpoint.rpartition(":")[2])

    @property
    def meeting_port(self) -> int:
        return self.port + MEETING_OFFSET


def parse_endpoint(text: str, where: str) -> str:
    """``host:port`` or ``[v6]:port``; the port is required (every node must agree on it)."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65535:
        raise UsageError(f"{where} {text!r}: give HOST:PORT (PORT below 65535: the next port is preflight's meeting point), e.g. node01:{DEFAULT_PORT}; every node must give the same one")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise UsageError(f"{where} {text!r}: write an IPv6 address in brackets, e.g. [fd00::1]:{DEFAULT_PORT}")
    return f"{host}:{int(port)}"


def group(nnodes: int, node_rank: int, endpoint: str, rdzv_id: str) -> Group:
    if nnodes < 1:
        raise UsageError(f"--nnodes {nnodes}: give the number of nodes, 1 or more")
    if not 0 <= node_rank < nnodes:
        raise UsageError(f"--node-rank {node_rank}: give a rank from 0 to {nnodes - 1} (--nnodes {nnodes}), each node its own")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", rdzv_id):
        raise UsageError(f"--rdzv-id {rdzv_id!r}: letters, digits, '.', '_' and '-' only, at most 64; every node must give the same one")
    return Group(nnodes, node_rank, parse_endpoint(endpoint, "--rdzv-endpoint"), rdzv_id)


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list, expanded in order: ``gpu[01-03,07],login1`` ->
    gpu01 gpu02 gpu03 gpu07 login1; several brackets multiply
    (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2); zero padding is kept."""
    hosts: list[str] = []
    for item in _split_top(text.strip()):
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = [_range(p[1:-1], text) if p.startswith("[") else [p] for p in parts if p]
        if len(hosts) + math.prod(len(c) for c in choices) > MAX_HOSTS:
            raise ValueError(f"{text!r} names more than {MAX_HOSTS} hosts")
        hosts += ["".join(c) for c in itertools.product(*choices)]
    if not hosts:
        raise ValueError(f"no host in {text!r}")
    return hosts


def _split_top(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in {text!r}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in {text!r}")
    items.append(text[start:])
    return [i for i in items if i]


def _range(spec: str, text: str) -> list[str]:
    out = []
    for piece in spec.split(","):
        lo, _, hi = piece.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"{piece!r} in {text!r} is not a number or a range of numbers")
        if not hi:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"range {piece!r} in {text!r} runs backwards")
        if int(hi) - int(lo) >= MAX_HOSTS:
            raise ValueError(f"range {piece!r} in {text!r} names more than {MAX_HOSTS} hosts")
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


def from_slurm(env: Mapping[str, str], port: int = DEFAULT_PORT) -> Group:
    """The group `srun` describes: one preflight per node (--ntasks-per-node=1)."""
    missing = [v for v in ("SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST") if not env.get(v) and not (v == "SLURM_JOB_NODELIST" and env.get("SLURM_NODELIST"))]
    if missing:
        raise UsageError(f"--multi-node: {', '.join(missing)} not set: run it under `srun -N N --ntasks-per-node=1 preflight run --multi-node`, or give --nnodes, --node-rank and --rdzv-endpoint")
    tasks = env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]
    if tasks not in ("", "1"):
        raise UsageError(f"--multi-node: SLURM_NTASKS_PER_NODE={env['SLURM_NTASKS_PER_NODE']}: preflight starts every GPU's rank itself; run one task per node (--ntasks-per-node=1)")
    nodelist = env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"]
    try:
        hosts = expand_hostlist(nodelist)
        nnodes, node_rank = int(env["SLURM_NNODES"]), int(env["SLURM_NODEID"])
    except ValueError as e:
        raise UsageError(f"--multi-node: cannot read Slurm's environment ({e}); give --nnodes, --node-rank and --rdzv-endpoint instead") from None
    if len(hosts) != nnodes:
        raise UsageError(f"--multi-node: SLURM_NNODES={nnodes} but SLURM_JOB_NODELIST={nodelist} names {len(hosts)} hosts; is this a heterogeneous job? give --nnodes, --node-rank and --rdzv-endpoint")
    job = env.get("SLURM_JOB_ID", "job")
    step = env.get("SLURM_STEP_ID")
    return group(nnodes, node_rank, f"{hosts[0]}:{port}", f"preflight-{job}" + (f".{step}" if step else ""))


def of(nnodes: int, node_rank: int, endpoint: str | None, rdzv_id: str | None) -> Group | None:
    """The group the settings describe, or None for a single node."""
    if nnodes == 1 and endpoint is None:
        return None
    if endpoint is None:
        raise UsageError(f"--nnodes {nnodes}: give --rdzv-endpoint HOST:PORT too, node rank 0's address, the same on every node (or --multi-node under srun)")
    return group(nnodes, node_rank, endpoint, rdzv_id or "preflight")


@dataclass(frozen=True)
class LocalSide:
    addr: str  # this node's address towards the endpoint: torchrun's --local-addr
    ifname: str | None  # the interface holding it: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME


def local_side(g: Group, wait: float = 0.0) -> LocalSide:
    """Which of this node's addresses and interfaces reach the endpoint (the kernel's
    route, asked with a UDP connect that sends nothing). Node rank 0 hosts the
    rendezvous, so there the endpoint must be one of its own addresses. Other ranks
    wait up to ``wait`` s for the name to resolve: a Kubernetes pod's DNS record
    appears only once that pod is scheduled, which may be after its peers start."""
    until = time.monotonic() + (wait if g.node_rank != 0 else 0.0)
    while True:
        try:
            infos = socket.getaddrinfo(g.host, g.port, type=socket.SOCK_DGRAM)
            break
        except socket.gaierror as e:
            if time.monotonic() >= until:
                waited = f", after waiting {wait:g} s" if wait and g.node_rank != 0 else ""
                raise UsageError(f"--rdzv-endpoint {g.endpoint}: {g.host} does not resolve ({e.strerror}{waited}); give node rank 0's address or a name every node resolves") from None
            time.sleep(1.0)
    family, _, _, _, target = infos[0]
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(target)
            addr = s.getsockname()[0]
    except OSError as e:
        raise UsageError(f"--rdzv-endpoint {g.endpoint}: no route from this node to {target[0]} ({e.strerror or e}); check the address and this node's network") from None
    if g.node_rank == 0 and addr != target[0]:
        raise UsageError(
            f"--rdzv-endpoint {g.endpoint}: node rank 0 hosts the rendezvous, but {target[0]} is not an address of this node "
            f"(its address towards it is {addr}); give node rank 0's own address, or run node rank 0 on {g.host}"
        )
    ifname = next((name for name, addrs in psutil.net_if_addrs().items() if any(a.address.split("%")[0] == addr for a in addrs)), None)
    return LocalSide(addr, ifname)
