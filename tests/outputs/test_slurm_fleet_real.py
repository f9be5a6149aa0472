"""The cap on drains on a real Slurm of several nodes on one machine: slurmctld and a
slurmd per node, each in a network namespace of its own on one bridge (tests/netns.py,
as the multi-node tests place their nodes) and a UTS namespace with the node's
hostname; one munged, whose socket they share. Every node's gate failed at once (a
bad floor, a bad rollout): the first slurmd to start drains its node, the next ones
are held by the cap and say so. Every wait has a deadline; the daemons die with
their process groups and the namespaces are deleted after."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import netns
from conftest import report_file
from test_slurm_real import EXAMPLES, MISSING, PREFLIGHT, SBIN, TOOLS

pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm is not installed (Debian packages {', '.join(MISSING)}; tests/install-tools.sh installs them)"),
    netns.needs_netns,
]
assert "slurmd" in TOOLS
NODES = ("pfn1", "pfn2", "pfn3")
CALL = 20.0
FAILED = "preflight [node] drain: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor"


class Fleet:
    def __init__(self, root: Path, net: netns.Net):
        self.root, self.net = root, net
        self.conf = root / "slurm.conf"
        self.env = {"PATH": SBIN, "HOME": str(root), "SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    def report(self, node: str) -> Path:
        return self.root / f"report-{node}.json"

    def configure(self) -> None:
        r = self.root
        key = r / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (r / "ctld").mkdir()
        for n in NODES:
            (r / f"spool-{n}").mkdir()
        # The shipped wrapper, each node reading its own report and logging its own output.
        wrapper = (EXAMPLES / "preflight-healthcheck").read_text()
        wrapper = wrapper.replace("/usr/local/bin/preflight ", f"{PREFLIGHT} ").replace("/var/lib/preflight/report.json", f"{r}/report-$SLURMD_NODENAME.json")
        first, rest = wrapper.split("\n", 1)
        hc = r / "healthcheck"
        hc.write_text(f"{first}\nexport SLURM_CONF={self.conf}\nexec >>{r}/healthcheck-$SLURMD_NODENAME.log 2>&1\n{rest}")
        hc.chmod(0o755)
        ctl = self.net.hosts[0].addr
        nodes = "".join(f"NodeName={n} NodeAddr={h.addr} NodeHostname={n} CPUs=1 State=UNKNOWN\n" for n, h in zip(NODES, self.net.hosts[1:]))
        self.conf.write_text(f"""\
ClusterName=preflightfleet
SlurmctldHost=pfctl({ctl})
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge.sock
CredType=cred/munge
StateSaveLocation={r}/ctld
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=30
HealthCheckProgram={hc}
HealthCheckInterval=3600
{nodes}PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def start(self, argv: list[str], ready, what: str, timeout: float = 30.0) -> None:
        log = open(self.root / f"{what.split()[0]}.out", "ab")
        p = subprocess.Popen(argv, env=self.env, cwd=self.root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.daemons.append(p)
        deadline = time.monotonic() + timeout
        while not ready():
            if p.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"{what}: {'exited' if p.poll() is not None else f'not within {timeout:g} s'}: {self.tail()}")
            time.sleep(0.1)

    def tail(self) -> str:
        text = " ".join(f.read_text(errors="replace") for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")))
        return " | ".join(text.strip().splitlines()[-6:]) or "no output"

    def within(self, i: int, hostname: str, *argv: str) -> list[str]:
        """``argv`` in host ``i``'s network namespace, in a UTS namespace named ``hostname``. nsenter, not
        `ip netns exec`, which mounts a /sys of its own without the cgroups slurmd's cgroup plugin reads."""
        return ["nsenter", f"--net=/run/netns/{self.net.hosts[i].ns}", "unshare", "--uts", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh", *argv]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client, from the controller's network."""
        p = subprocess.run(self.net.hosts[0].argv(*args), env=self.env, cwd=self.root, capture_output=True, text=True, timeout=CALL)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
        return p

    def shown(self, node: str) -> str:
        return self.run("scontrol", "show", "node", node, check=False).stdout

    def registered(self, node: str) -> bool:
        s = self.shown(node)
        return "SlurmdStartTime=None" not in s and re.search(r"\bVersion=\d", s) is not None

    def state(self, node: str) -> tuple[str, str]:
        state, _, reason = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T|%E").stdout.strip().partition("|")
        return state.rstrip("*"), reason

    def said(self, node: str) -> str:
        log = self.root / f"healthcheck-{node}.log"
        return log.read_text() if log.exists() else ""

    def boot(self) -> None:
        self.configure()
        r = self.root
        self.start(["munged", "-F", "--force", f"--socket={r}/munge.sock",
                    f"--key-file={r}/munge.key", f"--pid-file={r}/munged.pid", f"--log-file={r}/munged.log", f"--seed-file={r}/munged.seed"],
                   lambda: (r / "munge.sock").exists(), "munged create its socket")
        self.start(self.within(0, "pfctl", "slurmctld", "-D", "-f", str(self.conf)),
                   lambda: self.run("scontrol", "ping", check=False).returncode == 0, "slurmctld answer scontrol ping")

    def start_node(self, i: int) -> None:
        node = NODES[i]
        self.start(self.within(i + 1, node, "slurmd", "-D", "-f", str(self.conf), "-N", node),
                   lambda: self.registered(node), f"slurmd {node} register with slurmctld")

    def stop(self) -> None:
        for p in reversed(self.daemons):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


@pytest.fixture
def fleet(tmp_path):
    net = netns.make(1 + len(NODES))
    f = Fleet(tmp_path, net)
    try:
        f.boot()
        yield f
    finally:
        f.stop()
        net.cleanup()


def test_when_every_gate_fails_at_once_the_cap_drains_one_node_of_three_and_the_others_say_would_drain(fleet):
    for n in NODES:
        report_file(fleet.report(n), "shm-64m-fail")
    # One after another, as a rolling restart brings them up: each slurmd runs its health check before it registers.
    for i in range(len(NODES)):
        fleet.start_node(i)
    assert fleet.state("pfn1") == ("drained", FAILED), (fleet.state("pfn1"), fleet.said("pfn1"))
    for n in ("pfn2", "pfn3"):
        assert "drain" not in fleet.state(n)[0], (n, fleet.state(n), fleet.said(n))
        assert "would drain: 1 of 3 nodes already drained by preflight, past the cap (10% of partition test" in fleet.said(n), fleet.said(n)

    # pfn1 is fixed and passes: its own health check (run here as slurmd runs it) resumes it,
    # and the cap has room again for pfn2, whose gate still fails.
    report_file(fleet.report("pfn1"), "cpu-pass")
    for node, i in (("pfn1", 1), ("pfn2", 2)):
        p = subprocess.run(fleet.net.hosts[i].argv(str(fleet.root / "healthcheck")), env={"SLURMD_NODENAME": node}, capture_output=True, text=True, timeout=60)
        assert p.returncode in (0, 1), p
    assert "drain" not in fleet.state("pfn1")[0], fleet.said("pfn1")
    assert fleet.state("pfn2") == ("drained", FAILED), fleet.said("pfn2")
