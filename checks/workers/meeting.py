"""Where the nodes of a group meet, between their runs of torchrun.

Node rank 0 hosts a torch.distributed TCPStore at the endpoint's PORT+1 for
its whole run (``host``). At each meeting (before nccl, before bandwidth,
after) every node posts what it knows about itself (``call``): whether it may
join, or why not; later, what it found. A node reads the others' posts, so a
node that stays out is named by every peer at once, and one that never comes
is named when the meeting's time is up. torchrun's own store cannot do this:
it lives only while a launch does, and says how many nodes came, never which.

Keys: {id}/open; {id}/secret: node rank 0's random word for this run, which
every node adds to torchrun's rendezvous id; {id}/{phase}/{node}: the node's JSON post; {id}/bye/{node}:
its last read is done, so rank 0 may close the store. A node that posted in a
later phase has moved on without this one: it counts as out, with its post.

Writes rank0.json in --out: {"stage", "nodes": {rank: post}, "missing": [...],
"error", "secret"}. The store listens only on the endpoint's address; the id
and the secret come in the environment (PREFLIGHT_MEETING_ID,
PREFLIGHT_MEETING_SECRET), never on a command line every user can read.
Standard library and torch only. By hand, on two nodes:
  PREFLIGHT_MEETING_ID=t python meeting.py host --endpoint node0:29501 --nnodes 2
  PREFLIGHT_MEETING_ID=t python meeting.py call --endpoint node0:29501 --nnodes 2 --node-rank 1 --phase nccl --status '{"ok": true}'
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import _rank

POLL = 0.1
POST_LIMIT = 64 << 10  # bytes of one node's post: a few hundred are enough; the store is open to the network
PHASES = ["nccl", "bandwidth", "after", "bye"]


def _post(raw: bytes) -> dict:
    """A node's post as JSON; one too large or not a JSON object (anyone who reaches the store
    could have put it there) is read as that node being out, and why."""
    if len(raw) > POST_LIMIT:
        return {"ok": False, "why": f"its post was {len(raw)} bytes, more than the {POST_LIMIT} a node's post may be: not read"}
    try:
        post = json.loads(raw or b"{}")
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep
        post = None
    return post if isinstance(post, dict) else {"ok": False, "why": "its post was not a JSON object: not read"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["host", "call"])
    p.add_argument("--out", help="directory for rank0.json (default: print it)")
    p.add_argument("--endpoint", required=True, help="HOST:PORT of the meeting store")
    p.add_argument("--id", default=os.environ.get("PREFLIGHT_MEETING_ID"), help="the group's id [PREFLIGHT_MEETING_ID]")
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--phase", choices=PHASES, default="nccl")
    p.add_argument("--status", default="{}", help="this node's post, JSON; {\"ok\": false, \"why\": ...} keeps it out")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the others (host: to serve at most)")
    p.add_argument("--wait-all", action="store_true", help="wait for every node, not only until one is out")
    p.add_argument("--expect", default="", help="bye: the nodes to wait for, comma-separated (default: all)")
    args = p.parse_args()
    if not args.id:
        p.error("give the group's id: PREFLIGHT_MEETING_ID or --id")
    report: dict = {"stage": "import", "error": None, "nodes": {}, "missing": []}

    def save() -> None:
        if args.out:
            _rank.write_report(args.out, 0, report)
        else:
            print(json.dumps(report))

    save()
    try:
        from torch.distributed import TCPStore
    except Exception as e:  # noqa: BLE001 - any import failure is the answer
        report.update(error=f"{type(e).__name__}: {e}", error_kind="no_torch")
        save()
        return 1
    host, _, port = args.endpoint.rpartition(":")
    host = host.strip("[]")
    deadline = time.monotonic() + args.timeout
    if args.mode == "host":
        store = serve(TCPStore, host, int(port))
        store.set(f"{args.id}/secret", os.environ.get("PREFLIGHT_MEETING_SECRET", ""))
        store.set(f"{args.id}/open", "1")
        report.update(stage="serving")
        save()
        # Until the agent ends it (it knows when every node has said bye); should the
        # agent itself die, the store must not hold the port after it: --timeout or
        # a new parent ends it.
        parent = os.getppid()
        while time.monotonic() < deadline and os.getppid() == parent:
            time.sleep(0.5)
        return 0
    store = connect(TCPStore, host, int(port), args.id, deadline, report, save)
    if store is None:
        return 1
    me = args.node_rank
    report["secret"] = store.get(f"{args.id}/secret").decode() if store.check([f"{args.id}/secret"]) else None
    store.set(f"{args.id}/{args.phase}/{me}", args.status)
    report.update(stage="waiting")
    save()
    later = PHASES[PHASES.index(args.phase) + 1:]
    expect = [int(r) for r in args.expect.split(",") if r.strip()] if args.expect else list(range(args.nnodes))
    key = (lambda r: f"{args.id}/bye/{r}") if args.phase == "bye" else (lambda r: f"{args.id}/{args.phase}/{r}")
    nodes: dict[int, dict] = {}
    try:
        while True:
            for r in expect:
                if r in nodes:
                    continue
                if store.check([key(r)]):
                    nodes[r] = {"phase": args.phase, **_post(store.get(key(r)))}
                    continue
                for ph in later:
                    if store.check([f"{args.id}/{ph}/{r}"]):  # moved on without us
                        post = _post(store.get(f"{args.id}/{ph}/{r}"))
                        nodes[r] = {**post, "phase": ph, "ok": False, "why": post.get("why") or f"it went on to the {ph} meeting without this one"}
                        break
            out = any(not n.get("ok", True) for n in nodes.values())
            if len(nodes) == len(expect) or (out and not args.wait_all):
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL)
    except Exception as e:  # noqa: BLE001 - the store went away under us: rank 0 ended or became unreachable
        report.update(error=f"lost node rank 0's meeting point {args.endpoint} ({type(e).__name__}: {e})", error_kind="lost")
    report.update(nodes={str(r): n for r, n in sorted(nodes.items())}, missing=[r for r in expect if r not in nodes], stage="done")
    save()
    # This node's last meeting (after the group checks, or one the group cannot go on from): rank 0 may close.
    if args.phase != "bye" and report["error"] is None and (args.phase == "after" or not report_ok(report)):
        try:
            store.set(f"{args.id}/bye/{me}", "{}")
        except Exception:  # noqa: BLE001 - rank 0 already gone: nothing left to tell it
            pass
    return 0


def serve(TCPStore, host: str, port: int):  # noqa: N803 - torch's class, passed in
    """Node rank 0's store, listening on the endpoint's address only. torch's libuv backend
    (the default from 2.4) takes a listening socket only from 2.8 on; the older backend takes
    it everywhere. A torch too old for either listens on every interface, as it always did."""
    timeout = datetime.timedelta(seconds=30)
    fd = listen(host, port).detach()  # the store's from now on: a socket object would close it when collected
    for extra in ({}, {"use_libuv": False}):
        try:
            return TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout, master_listen_fd=fd, **extra)
        except (TypeError, NotImplementedError, RuntimeError, ValueError):
            continue
    os.close(fd)
    return TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=timeout)


def listen(host: str, port: int):
    """A socket listening on the endpoint's address only: a TCPStore left to itself listens
    on every interface of the node, where any network it is on could reach it."""
    import socket

    family, kind, proto, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    s = socket.socket(family, kind, proto)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(addr)
    s.listen(128)
    return s


def report_ok(report: dict) -> bool:
    return not report["missing"] and all(n.get("ok", True) for n in report["nodes"].values())


def connect(TCPStore, host: str, port: int, rid: str, deadline: float, report: dict, save):  # noqa: N803 - torch's class, passed in
    """A client on node rank 0's store, once it says this run's meeting is open.
    Retried until the deadline: rank 0 may start later, and a store on that port
    from another run does not have this run's key."""
    last = "nothing answered"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            report.update(error=f"could not reach node rank 0's meeting point {host}:{port}: {last}", error_kind="unreachable", stage="done")
            save()
            return None
        try:
            store = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=max(1.0, min(left, 5.0))))
            store.wait([f"{rid}/open"])
            return store
        except Exception as e:  # noqa: BLE001 - refused, timed out, reset: all mean try again
            last = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


if __name__ == "__main__":
    sys.exit(main())
