"""A rendezvous no one else can reach or write, attacked for real.

tests/rdzv_attacker.py, running as `nobody`, reads the run's endpoints and ids
from /proc, connects to every port the run's processes listen on, and stores a
pickled object under every key torchrun's launcher reads. Unpickled, the object
makes a directory. Root must not run it, and the run's verdict must not change.
From another network namespace (another host), the run's ports refuse."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import netns
from conftest import clean_env, run_preflight
from fakes import PREFLIGHT

ATTACKER = Path(__file__).parents[1] / "rdzv_attacker.py"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the attacker drops from root to nobody")


def start_attacker(tmp_path: Path, wrap: list[str], addr: str | None = None) -> tuple[subprocess.Popen, Path]:
    """The attacker, watching as nobody; it attacks only this test's run (its TMPDIR), never another on the machine."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    out = tmp_path / "attacker.json"
    argv = [*wrap, sys.executable, str(ATTACKER), "--out", str(out), "--mark", str(tmp_path / "pwned"), "--under", str(tmp_path), *(["--addr", addr] if addr else [])]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    # It imports torch as root, then drops to nobody: the run starts only once it watches as nobody.
    until = time.monotonic() + 180
    while time.monotonic() < until and proc.poll() is None:
        try:
            uid = next(line.split()[1] for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):
            uid = None
        if uid == "65534":
            return proc, out
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the attacker never became nobody (exit {proc.poll()})")


def stop_attacker(proc: subprocess.Popen, out: Path) -> dict:
    proc.terminate()
    proc.wait(30)
    return json.loads(out.read_text())


def run_args(tmp_path: Path) -> list[str]:
    return ["run", "--profile", "cpu", "--only", "nccl,bandwidth", "--report", str(tmp_path / "report.json"), "--lock-file", str(tmp_path / "lock")]


def test_a_local_user_cannot_reach_or_write_the_rendezvous(tmp_path: Path) -> None:
    attacker, out = start_attacker(tmp_path, [])
    try:
        done = run_preflight(run_args(tmp_path), env={**clean_env(), "TMPDIR": str(tmp_path / "tmp")}, timeout=600)
    finally:
        log = stop_attacker(attacker, out)
    assert not (tmp_path / "pwned").exists(), f"root ran the attacker's pickle: {log}"
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["verdict"] == "pass"
    assert log["uid"] == 65534
    # The attack was aimed: it saw the store's port on torchrun's command line and the
    # ranks' listening sockets in /proc, and the store's port refused it.
    ports = [s.rsplit(":", 1)[1] for s in log["seen"]]
    assert log["seen"], log
    nccl = next(c for c in report["checks"] if c["check"] == "nccl")
    assert nccl["details"]["isolation"] == {"network": "private"}
    master = nccl["details"]["endpoint"].rsplit(":", 1)[1]
    assert master in ports, log
    assert f"127.0.0.1:{master}" in " ".join(log["refused"]), log


def attacked_from_another_host(tmp_path: Path, wrap: list[str] = []) -> tuple[subprocess.CompletedProcess, dict, str]:
    """Two hosts on a bridge: the run on the first (under ``wrap``), the attacker on the second,
    aiming at every port the run's processes listen on, at the first host's address. The run,
    the attacker's log, and the first host's address."""
    net = netns.make(2)
    try:
        run_host, other = net.hosts
        attacker, out = start_attacker(tmp_path, other.argv(), addr=run_host.addr)
        try:
            env = {**clean_env(), "TMPDIR": str(tmp_path / "tmp")}
            done = subprocess.run(run_host.argv(*wrap, *PREFLIGHT, *run_args(tmp_path)), env=env, capture_output=True, text=True, timeout=600)
        finally:
            log = stop_attacker(attacker, out)
    finally:
        net.cleanup()
    return done, log, run_host.addr


@netns.needs_netns
def test_another_network_namespace_is_refused(tmp_path: Path) -> None:
    done, log, addr = attacked_from_another_host(tmp_path)
    assert done.returncode == 0, done.stderr
    assert log["seen"], log
    assert all(s.startswith(addr) for s in log["seen"]), log
    assert log["connected"] == [], f"reached the run from another namespace: {log}"
    assert not (tmp_path / "pwned").exists()


@netns.needs_netns
def test_a_peer_of_a_group_that_learns_its_id_still_cannot_run_code_on_its_nodes(tmp_path: Path) -> None:
    """The exposure a group keeps (docs/many-nodes.md): a third host on the group's network
    that knows the group's id (here it reads it off the agents' command lines) reads the
    per-run word at the meeting point and writes torchrun's store. It may disturb the run;
    it must not run code: torchrun's static rendezvous unpickles nothing on any node."""
    net = netns.make(3)
    try:
        (tmp_path / "tmp").mkdir()
        attacker, out = start_attacker(tmp_path, net.hosts[2].argv())
        env = {**clean_env(), "TMPDIR": str(tmp_path / "tmp")}
        nodes = []
        try:
            for i in range(2):
                argv = [*PREFLIGHT, "run", "--profile", "cpu", "--only", "nccl", "--nnodes", "2", "--node-rank", str(i),
                        "--rdzv-endpoint", f"{net.hosts[0].addr}:29500", "--rdzv-id", f"t-{net.tag}", "--rdzv-timeout", "120",
                        "--lock-file", str(tmp_path / f"{i}.lock"), "--report", str(tmp_path / f"report{i}.json")]
                nodes.append(subprocess.Popen(net.hosts[i].argv(*argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True))
            for n in nodes:
                n.wait(600)
        finally:
            for n in nodes:
                if n.poll() is None:
                    n.kill()
            log = stop_attacker(attacker, out)
    finally:
        net.cleanup()
    assert log["secrets"], f"the attacker never read the meeting point: {log}"
    assert any(s.endswith(":29500") for s in log["stored"]), f"the attack never reached torchrun's store: {log}"
    assert not (tmp_path / "pwned").exists(), f"a node unpickled the attacker's object: {log}"


@netns.needs_netns
@pytest.mark.skipif(not shutil.which("setpriv"), reason="util-linux's setpriv drops the capability")
def test_where_the_launch_gets_no_network_of_its_own_another_host_still_cannot_reach_its_store(tmp_path: Path) -> None:
    """A container without CAP_SYS_ADMIN (the Kubernetes examples drop every capability): the
    launch runs on the host's network, and torchrun's own store would listen on every
    interface, where another host could write the keys the ranks read and fail the node."""
    done, log, _ = attacked_from_another_host(tmp_path, ["setpriv", "--inh-caps=-sys_admin", "--bounding-set=-sys_admin"])
    assert done.returncode == 0, done.stderr
    nccl = next(c for c in json.loads((tmp_path / "report.json").read_text())["checks"] if c["check"] == "nccl")
    assert nccl["details"]["isolation"]["network"] == "host", nccl["details"]["isolation"]
    assert log["seen"], log  # it aimed at the run's ports, at the run host's address
    assert log["connected"] == [], f"reached the run's store from another host: {log}"
    assert not (tmp_path / "pwned").exists()
