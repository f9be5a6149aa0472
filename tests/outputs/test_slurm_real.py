"""`preflight slurm-healthcheck` and the prolog against a real Slurm: Debian's munged,
slurmctld and slurmd started here as one node in one partition, every file, socket,
port and log private to the test (a generated slurm.conf and munge key under a
temporary directory, SLURM_CONF for the clients), stopped with their process
groups after. The shipped HealthCheckProgram wrapper is slurmd's, as
slurm.conf.snippet installs it, and so is examples/slurm/prolog.sh where a test
asks for the prolog.

A daemon that cannot start makes the test skip and say why; every wait has a
deadline."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import REPORTS, lock_held, report_file
from preflight.gpuwork.launch import free_port

SBIN = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
TOOLS = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "scontrol": "slurm-client", "sinfo": "slurm-client",
         "squeue": "slurm-client", "sbatch": "slurm-client", "scancel": "slurm-client"}
MISSING = sorted({pkg for cmd, pkg in TOOLS.items() if shutil.which(cmd, path=SBIN) is None})
pytestmark = [
    pytest.mark.skipif(bool(MISSING), reason=f"Slurm is not installed (Debian packages {', '.join(MISSING)}; tests/install-tools.sh installs them)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd runs jobs as root here (SlurmUser=root): needs root"),
]

EXAMPLES = Path(__file__).parents[2] / "examples" / "slurm"
PREFLIGHT = Path(sys.executable).parent / "preflight"
TOKEN = "PREFLIGHT_SLURM_TEST"  # on every daemon and job: the sweep after finds what a process group kill missed
FAILED = "preflight [node] drain: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor"
CALL = 20.0  # per client command: slurmctld answers a single node in milliseconds


class Cluster:
    def __init__(self, root: Path, interval: int, prolog: bool = False, cpus: int = 1, shm: str | None = None,
                 ghosts: dict[str, str] | None = None):
        """``prolog``: the shipped prolog as Prolog= (PrologFlags=Alloc, the cpu profile, a lock of
        its own); ``cpus``: jobs of one CPU that may share the node; ``shm``: slurmd, and so every
        prolog and job, in a mount namespace of its own with a tmpfs of this size on /dev/shm,
        and a PID namespace of its own, so a prolog sees this cluster's jobs alone in /proc.
        ``ghosts``: more nodes of the partition, by name, with their Gres= ("" for none), that
        slurmctld knows and no slurmd serves: the health check is run for them by hand (--node)."""
        self.root, self.node, self.interval = root, socket.gethostname().split(".")[0], interval
        self.prolog, self.cpus, self.shm = prolog, cpus, shm
        self.ghosts = ghosts or {}
        self.lock = root / "preflight.lock"
        self.report = root / "report.json"
        self.token = uuid.uuid4().hex
        self.conf = root / "slurm.conf"
        self.env = {"PATH": SBIN, "HOME": str(root), "SLURM_CONF": str(self.conf), TOKEN: self.token, "PREFLIGHT_LOCK_FILE": str(self.lock)}
        self.daemons: dict[str, subprocess.Popen] = {}
        self.boot_state: tuple[str, str] | None = None  # the node as slurmd registered it

    def configure(self) -> None:
        ctld_port = d_port = free_port()
        while d_port == ctld_port:
            d_port = free_port()
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        for d in ("ctld", "spool"):
            (self.root / d).mkdir()
        # The shipped wrapper, with this test's preflight, report and slurm.conf
        # (slurmd gives it an empty environment), and its output kept for a failure message.
        wrapper = (EXAMPLES / "preflight-healthcheck").read_text()
        wrapper = wrapper.replace("/usr/local/bin/preflight ", f"{PREFLIGHT} ").replace("/var/lib/preflight/report.json", str(self.report))
        first, rest = wrapper.split("\n", 1)
        healthcheck = self.root / "healthcheck"
        healthcheck.write_text(f"{first}\nexport SLURM_CONF={self.conf}\nexec >>{self.root}/healthcheck.log 2>&1\n{rest}")
        healthcheck.chmod(0o755)
        r = self.root
        # Ports nothing listens on: slurmctld's pings go unanswered and each stays "not responding".
        ghosts = "".join(f"NodeName={g} NodeAddr=127.0.0.1 Port={free_port()} CPUs=1{' Gres=' + gres if gres else ''} State=UNKNOWN\n"
                         for g, gres in self.ghosts.items())
        gres_types = "GresTypes=gpu\n" if any(self.ghosts.values()) else ""
        prolog = ""
        if self.prolog:
            # slurmd gives a prolog an empty environment, as it does HealthCheckProgram: the settings a site
            # puts in its own wrapper or config file, here this test's preflight, report, profile and lock.
            wrapper = r / "prolog"
            wrapper.write_text(f"#!/bin/sh\nexport PATH={PREFLIGHT.parent}:/usr/bin:/bin PREFLIGHT_REPORT={self.report} PREFLIGHT_PROFILE=cpu "
                               f"PREFLIGHT_LOCK_FILE={self.lock}\nexec >>{r}/prolog.log 2>&1\nexec {EXAMPLES / 'prolog.sh'}\n")
            wrapper.chmod(0o755)
            prolog = f"Prolog={wrapper}\nPrologFlags=Alloc\n"
        self.conf.write_text(f"""\
ClusterName=preflighttest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge.sock
CredType=cred/munge
StateSaveLocation={r}/ctld
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
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
HealthCheckProgram={healthcheck}
HealthCheckInterval={self.interval}
{gres_types}{prolog}NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} CPUs={self.cpus} State=UNKNOWN
{ghosts}PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def start(self, name: str, args: list[str], ready, what: str, timeout: float = 30.0, within: list[str] = ()) -> None:
        """``within``: a command that runs the daemon (its path and arguments appended)."""
        log = open(self.root / f"{name}.out", "wb")
        self.daemons[name] = subprocess.Popen([*within, shutil.which(name, path=SBIN), *args], env=self.env, cwd=self.root,
                                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while not self.answers(ready):
            if self.daemons[name].poll() is not None or time.monotonic() > deadline:
                why = "exited" if self.daemons[name].poll() is not None else f"did not {what} within {timeout:g} s"
                pytest.skip(f"{name} {why}: {self.tail(name)}")
            time.sleep(0.1)

    @staticmethod
    def answers(ready) -> bool:
        try:
            return ready()
        except subprocess.TimeoutExpired:
            return False

    def tail(self, name: str) -> str:
        text = " ".join(f.read_text(errors="replace") for f in self.root.glob(f"{name}.*") if f.suffix in (".out", ".log"))
        return " | ".join(text.strip().splitlines()[-5:]) or "no output"

    def boot(self) -> None:
        self.configure()
        r = self.root
        # --force: otherwise munged refuses a socket in a directory other users cannot enter, as this private one.
        self.start("munged", ["-F", "--force", f"--socket={r}/munge.sock", f"--key-file={r}/munge.key", f"--pid-file={r}/munged.pid",
                              f"--log-file={r}/munged.log", f"--seed-file={r}/munged.seed"],
                   lambda: (r / "munge.sock").exists(), "create its socket")
        self.start("slurmctld", ["-D", "-f", str(self.conf)], lambda: self.run("scontrol", "ping", check=False).returncode == 0, "answer scontrol ping")
        within = []
        if self.shm:
            within = ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c", f'mount -t tmpfs -o size={self.shm} tmpfs /dev/shm && exec "$0" "$@"']
        self.start("slurmd", ["-D", "-f", str(self.conf), "-N", self.node], self.registered, "register with slurmctld", within=within)

    def dev_shm(self) -> Path:
        """The /dev/shm slurmd, its prologs and its jobs see: its own tmpfs where ``shm`` gave one."""
        slurmd = psutil.Process(self.daemons["slurmd"].pid)
        if slurmd.name() != "slurmd":  # unshare --fork waits in the host's namespaces for the slurmd it started
            (slurmd,) = slurmd.children()
        return Path(f"/proc/{slurmd.pid}/root/dev/shm")

    def health_checks(self) -> int:
        """How many times slurmd has run HealthCheckProgram (one line of output each)."""
        log = self.root / "healthcheck.log"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def registered(self) -> bool:
        shown = self.run("scontrol", "show", "node", self.node, check=False).stdout
        return "SlurmdStartTime=None" not in shown and re.search(r"\bVersion=\d", shown) is not None

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(list(args), env=self.env, cwd=self.root, capture_output=True, text=True, timeout=CALL)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
        return p

    def state(self) -> tuple[str, str]:
        """sinfo's long state ("idle", "drained", "draining") and the drain reason. Without the "*"
        (not responding) slurmctld shows for a moment after a resume, until its ping is answered."""
        state, _, reason = self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%T|%E").stdout.strip().partition("|")
        return state.rstrip("*"), reason

    def healthcheck(self, *args: str, node: str | None = None) -> subprocess.CompletedProcess:
        """`preflight slurm-healthcheck` by hand, as an admin runs it on the node."""
        return self.run(str(PREFLIGHT), "slurm-healthcheck", "--report", str(self.report), "--node", node or self.node, *args, check=False)

    def reason(self, node: str) -> str:
        shown = self.run("scontrol", "show", "node", node).stdout
        return re.search(r"^\s*Reason=(.*?)(?: \[[^\]]*@[^\]]*\])?\s*$", shown, re.MULTILINE).group(1)

    def drained(self, node: str) -> bool:
        return "DRAIN" in re.search(r"State=(\S+)", self.run("scontrol", "show", "node", node).stdout).group(1)

    def job(self) -> str:
        return self.run("sbatch", "--parsable", "-D", str(self.root), "-o", f"{self.root}/job-%j.out", "--wrap", "echo ran on $SLURMD_NODENAME").stdout.strip()

    def job_state(self, job: str) -> tuple[str, str]:
        shown = self.run("scontrol", "show", "job", job).stdout
        return re.search(r"JobState=(\S+)", shown).group(1), re.search(r"Reason=(\S+)", shown).group(1)

    def wait(self, what: str, done, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while not (got := done()):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:g} s (slurmctld: {self.tail('slurmctld')}; slurmd: {self.tail('slurmd')})")
            time.sleep(0.2)
        return got

    def stop(self) -> None:
        if "slurmctld" in self.daemons:
            try:
                self.run("scancel", "--full", "--user=root", check=False)
            except (subprocess.TimeoutExpired, OSError):
                pass  # the process groups and the sweep below end the jobs anyway
        # SIGKILL: the state is thrown away, and slurmctld takes seconds to shut down on SIGTERM.
        for p in reversed(self.daemons.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        for left in self.left_behind():
            left.kill()

    def left_behind(self) -> list[psutil.Process]:
        """What a process group kill misses: slurmstepd and the job it runs leave slurmd's session.
        slurmstepd writes its title over its environment, so it is known by its working directory."""
        found = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid != os.getpid() and (p.environ().get(TOKEN) == self.token or Path(p.cwd()).is_relative_to(self.root)):
                    found.append(p)
            except (psutil.Error, OSError):
                continue
        return found


@contextlib.contextmanager
def running(root: Path, interval: int, gate: str = "shm-64m-fail", **how):
    c = Cluster(root, interval, **how)
    # The gate's report is there before slurmd starts, as the drop-in orders it: by default a failed one.
    report_file(c.report, gate)
    try:
        c.boot()
        c.boot_state = c.state()
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Health checks by hand only: slurmctld's next one is an hour away."""
    with running(tmp_path_factory.mktemp("slurm"), 3600) as c:
        yield c


def test_left_to_itself_slurm_drains_a_node_whose_gate_failed_and_resumes_it_once_it_passes(tmp_path):
    with running(tmp_path, interval=2) as c:
        assert c.boot_state == ("drained", FAILED)
        job = c.job()
        c.wait("the scheduler to consider the job", lambda: c.job_state(job)[1] != "None")
        assert c.job_state(job)[0] == "PENDING"

        report_file(c.report, "cpu-pass")  # the fix, and `preflight run` again
        c.wait("the next health check to resume the node", lambda: "drain" not in c.state()[0])
        c.wait("the job to complete", lambda: c.job_state(job)[0] == "COMPLETED")

        c.run("scontrol", "update", f"NodeName={c.node}", "State=DRAIN", "Reason=maintenance")
        runs = c.health_checks()
        c.wait("two more health checks", lambda: c.health_checks() >= runs + 2)
        assert c.state() == ("drained", "maintenance")


def test_a_node_whose_gate_failed_comes_up_drained_with_the_cause(cluster):
    # slurmd ran HealthCheckProgram before it registered: no moment where the node took jobs.
    assert cluster.boot_state == ("drained", FAILED), (cluster.boot_state, (cluster.root / "healthcheck.log").read_text())
    shown = cluster.run("scontrol", "show", "node", cluster.node).stdout
    assert f"Reason={FAILED} [root@" in shown
    assert FAILED in cluster.run("sinfo", "-R", "-h", "-o", "%100E").stdout


def test_a_job_waits_while_the_report_fails_and_runs_once_a_pass_resumes_the_node(cluster):
    report_file(cluster.report, "shm-64m-fail")
    p = cluster.healthcheck()
    assert p.returncode == 1 and cluster.state() == ("drained", FAILED), p.stdout + p.stderr

    job = cluster.job()
    # The scheduler has looked at the job once it gives a reason; it left it pending.
    state, reason = cluster.wait("the scheduler to consider the job", lambda: (s := cluster.job_state(job))[1] != "None" and s)
    assert state == "PENDING" and ("ReqNodeNotAvail" in reason or "DRAINED" in reason), reason  # for the node, not priority or limits

    report_file(cluster.report, "cpu-pass")
    p = cluster.healthcheck()
    assert p.returncode == 0 and f"resuming {cluster.node}, drained earlier by preflight ({FAILED})" in p.stdout, p.stdout + p.stderr
    state, reason = cluster.state()
    assert "drain" not in state and reason == "none", (state, reason)  # "idle*" for a moment: slurmctld pings a resumed node
    cluster.wait("the job to complete", lambda: cluster.job_state(job)[0] == "COMPLETED")
    assert (cluster.root / f"job-{job}.out").read_text().strip() == f"ran on {cluster.node}"


def test_an_admins_drain_is_never_lifted_nor_rewritten(cluster):
    cluster.run("scontrol", "update", f"NodeName={cluster.node}", "State=DRAIN", "Reason=maintenance")
    try:
        report_file(cluster.report, "cpu-pass")
        p = cluster.healthcheck()
        assert p.returncode == 0 and "stays drained: someone else drained it (maintenance)" in p.stdout
        assert cluster.state() == ("drained", "maintenance")
        report_file(cluster.report, "shm-64m-fail")
        p = cluster.healthcheck()
        assert p.returncode == 1 and "already drained by someone else (maintenance): left alone" in p.stdout
        assert cluster.state() == ("drained", "maintenance")
    finally:
        cluster.run("scontrol", "update", f"NodeName={cluster.node}", "State=RESUME")


def test_the_dry_run_line_is_the_command_a_run_would_send(cluster):
    report_file(cluster.report, "shm-64m-fail")
    p = cluster.healthcheck("--dry-run")
    first = p.stdout.splitlines()[0]
    assert p.returncode == 1 and first.startswith("would run: scontrol update"), p.stdout
    assert "drain" not in cluster.state()[0]  # the dry run changed nothing
    try:
        cluster.run(*shlex.split(first.removeprefix("would run: ")))  # what the admin copies runs as printed
        assert cluster.state() == ("drained", FAILED)
        assert cluster.healthcheck("--dry-run").stdout.startswith("nothing: not vouched (shm FAIL")
    finally:
        cluster.run("scontrol", "update", f"NodeName={cluster.node}", "State=RESUME")


def resume(c: Cluster) -> None:
    c.run("scontrol", "update", f"NodeName={c.node}", "State=RESUME")


def test_a_drain_is_lifted_only_once_the_check_that_drained_it_passes(cluster):
    report_file(cluster.report, "shm-64m-fail")
    assert cluster.healthcheck().returncode == 1 and cluster.state() == ("drained", FAILED)
    try:
        # A later run that passes but left shm out (a quick run of other checks): shm has not passed since.
        pass_ = json.loads((REPORTS / "cpu-pass.json").read_text())
        report_file(cluster.report, "cpu-pass", checks=[r for r in pass_["checks"] if r["check"] != "shm"])
        p = cluster.healthcheck()
        assert p.returncode == 0 and "stays drained: preflight drained it for shm, which does not pass yet: not in this report" in p.stdout, p.stdout + p.stderr
        assert cluster.state() == ("drained", FAILED)
        report_file(cluster.report, "cpu-pass")  # shm passes again
        p = cluster.healthcheck()
        assert p.returncode == 0 and "resuming" in p.stdout and "drain" not in cluster.state()[0], p.stdout + p.stderr
    finally:
        if "drain" in cluster.state()[0]:
            resume(cluster)


def test_a_passing_lemon_is_drained_for_service_and_resumed_once_its_history_asks_nothing(cluster):
    from test_slurm import LEMON

    report_file(cluster.report, "cpu-pass", history=LEMON)  # the run passed; the node failed 3 times this week
    try:
        p = cluster.healthcheck()
        reason = "preflight [node] service: history WARN: failed 3 times in 7 days: shm, shm, shm"
        assert cluster.state() == ("drained", reason), p.stdout + p.stderr
        report_file(cluster.report, "cpu-pass")  # the failures aged out of the window: the history asks nothing
        p = cluster.healthcheck()
        assert p.returncode == 0 and "resuming" in p.stdout and "drain" not in cluster.state()[0], p.stdout + p.stderr
    finally:
        if "drain" in cluster.state()[0]:
            resume(cluster)


def test_a_drain_of_an_older_preflight_is_still_its_own(cluster):
    old = "preflight: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor"
    cluster.run("scontrol", "update", f"NodeName={cluster.node}", "State=DRAIN", f"Reason={old}")
    report_file(cluster.report, "cpu-pass")
    p = cluster.healthcheck()
    assert p.returncode == 0 and f"resuming {cluster.node}, drained earlier by preflight ({old})" in p.stdout, p.stdout + p.stderr
    assert "drain" not in cluster.state()[0]


# --- Slurm's Gres, and the cap on drains: nodes slurmctld knows that no slurmd serves ---------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Four nodes in one partition: this one (slurmd), and three that slurmctld knows, with Gres, and no slurmd serves."""
    ghosts = {"gpu-a": "gpu:h100:8", "gpu-b": "gpu:4", "gpu-c": "gpu:h100:4(S:0),gpu:a100:4(S:1)"}
    with running(tmp_path_factory.mktemp("slurm"), 3600, gate="cpu-pass", ghosts=ghosts) as c:
        yield c


def with_gpus(c: Cluster, fixture: str, gpus: int) -> None:
    shape = {"gpus": gpus, "gpus_from": "PCI bus and /dev/nvidia0-7"}
    report_file(c.report, fixture, shape=shape)


def test_a_node_whose_gres_names_more_gpus_than_it_has_is_drained_for_service(fleet):
    with_gpus(fleet, "cpu-pass", 7)
    p = fleet.healthcheck(node="gpu-a")
    try:
        assert p.returncode == 0 and "draining gpu-a" in p.stdout, p.stdout + p.stderr
        assert fleet.reason("gpu-a") == "preflight [node] service: slurm-gres FAIL: Slurm's Gres says 8 GPUs, the node has 7"
        p = fleet.healthcheck(node="gpu-a")
        assert "already drained by preflight" in p.stdout and fleet.drained("gpu-a")
        with_gpus(fleet, "cpu-pass", 8)  # the GPU is back (or replaced): the drain named slurm-gres, which now agrees
        # Slurm refuses RESUME for a node that never registered (no slurmd serves gpu-a): the line it would send.
        # test_a_drain_is_lifted_only_once_the_check_that_drained_it_passes resumes a served node for real.
        p = fleet.healthcheck("--dry-run", node="gpu-a")
        assert p.stdout.startswith("would run: scontrol update NodeName=gpu-a State=RESUME"), p.stdout + p.stderr
        # More GPUs than configured: the config is out of date, the software's to fix (gpu-a held drained: past the cap).
        p = fleet.healthcheck("--drain-cap", "1", node="gpu-b")
        assert fleet.reason("gpu-b") == "preflight [software] drain: slurm-gres FAIL: Slurm's Gres says 4 GPUs, the node has 8", p.stdout
        # Two GPU types of four: eight, as the node has.
        assert "draining" not in fleet.healthcheck("--drain-cap", "1", node="gpu-c").stdout and not fleet.drained("gpu-c")
    finally:
        pass  # Slurm undrains no node that never registered: this cluster serves this test alone


@pytest.fixture(scope="module")
def partition(tmp_path_factory):
    """Four nodes in one partition: this one (slurmd), and three that slurmctld knows and no slurmd serves."""
    with running(tmp_path_factory.mktemp("slurm"), 3600, gate="cpu-pass", ghosts={"gpu-a": "", "gpu-b": "", "gpu-c": ""}) as c:
        yield c


def test_past_the_cap_a_node_is_not_drained_and_the_output_says_so(partition):
    fleet = partition
    report_file(fleet.report, "shm-64m-fail")
    p = fleet.healthcheck(node="gpu-a")
    assert p.returncode == 1 and fleet.reason("gpu-a") == FAILED, p.stdout + p.stderr
    # One of four drained by preflight: 10% of four is under one, so one is the cap.
    p = fleet.healthcheck("--textfile-dir", str(fleet.root), node="gpu-b")
    assert p.returncode == 1 and "would drain: 1 of 4 nodes already drained by preflight, past the cap" in p.stdout, p.stdout + p.stderr
    assert not fleet.drained("gpu-b")
    # The report that asked for the drain says so, where `status`, the page and serve's metrics read it.
    held = json.loads(fleet.report.read_text())["held_back"]
    assert held["by"] == "slurm-healthcheck" and held["said"].startswith("would drain: 1 of 4 nodes already drained by preflight, past the cap")
    assert "held back by slurm-healthcheck" in fleet.run(str(PREFLIGHT), "status", "--report", str(fleet.report), check=False).stdout
    # What node_exporter reads and PreflightDrainCapReached (examples/prometheus/preflight-slurm-rules.yml) fires on.
    prom = (fleet.root / "preflight-slurm.prom").read_text()
    assert 'preflight_slurm_drain_held{node="gpu-b"} 1' in prom and 'preflight_slurm_drained_by_preflight{node="gpu-b",partition="test"} 1' in prom
    assert "would drain: 1 of 4" in fleet.healthcheck("--dry-run", node="gpu-b").stdout
    # A wider cap lets one more through, and no further.
    p = fleet.healthcheck("--drain-cap", "0.5", "--textfile-dir", str(fleet.root), node="gpu-b")
    assert "draining gpu-b" in p.stdout and fleet.reason("gpu-b") == FAILED, p.stdout + p.stderr
    assert 'preflight_slurm_drain_held{node="gpu-b"} 0' in (fleet.root / "preflight-slurm.prom").read_text()
    assert json.loads(fleet.report.read_text())["held_back"] is None  # drained: nothing held back now
    p = fleet.healthcheck("--drain-cap", "0.5", node="gpu-c")
    assert "would drain: 2 of 4 nodes already drained by preflight, past the cap" in p.stdout and not fleet.drained("gpu-c")
    assert json.loads(fleet.report.read_text())["held_back"]["said"].startswith("would drain: 2 of 4")


# --- the prolog: never a drain for preflight's own reasons ----------------------------------


@pytest.fixture(scope="module")
def prolog_cluster(tmp_path_factory):
    """The shipped prolog before every job, on a node of 2 CPUs that jobs of one CPU share, whose
    /dev/shm is a 1.5 GiB tmpfs of its own; the gate passed."""
    with running(tmp_path_factory.mktemp("slurm"), 3600, gate="cpu-pass", prolog=True, cpus=2, shm="1536m") as c:
        assert c.boot_state == ("idle", "none"), c.boot_state
        yield c


def ran(c: Cluster, job: str, timeout: float = 120.0) -> None:
    """The job ran to its end, and the node is still in service: the prolog let it in,
    and what it wrote in the report gives the health check no cause to drain."""
    def ended() -> str | None:  # or refused: a drained node takes the job no more
        state = c.job_state(job)[0]
        return state if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING") or "drain" in c.state()[0] else None

    state = c.wait(f"job {job} to end", ended, timeout)
    prolog = (c.root / "prolog.log").read_text() if (c.root / "prolog.log").exists() else "nothing"
    assert state == "COMPLETED", f"job {job}: {state}, {c.job_state(job)[1]}; node {c.state()}; the prolog said: {prolog}"
    p = c.healthcheck()
    assert p.returncode == 0 and "drain" not in c.state()[0], (p.stdout + p.stderr, c.state())


def test_a_job_runs_while_another_preflight_run_holds_the_lock(prolog_cluster):
    c = prolog_cluster
    report_file(c.report, "cpu-pass")
    before = c.report.read_text()
    with lock_held(c.lock):  # a standard run, an admin's, the gate run again: they take it the same way
        job = c.job()
        ran(c, job)  # the prolog waited its 5 s and judged by the last report
        assert c.report.read_text() == before  # the holder writes the verdict, not the prolog
    job = c.job()
    ran(c, job)  # the lock free: the prolog took its own quick look into the node's report
    assert json.loads(c.report.read_text())["level"] == "quick"
    assert (c.root / f"job-{job}.out").read_text().strip() == f"ran on {c.node}"


def test_a_second_job_runs_beside_a_job_that_filled_dev_shm_and_its_leftovers_are_caught_once_it_ends(prolog_cluster):
    c = prolog_cluster
    report_file(c.report, "cpu-pass")
    ready = c.root / "job-a-ready"
    first = c.run("sbatch", "--parsable", "-D", str(c.root), "-o", f"{c.root}/job-%j.out", "--wrap",
                  f"head -c 800M /dev/zero > /dev/shm/job-a-data && touch {ready} && exec sleep 600").stdout.strip()
    try:
        c.wait("the first job to fill 800 MiB of /dev/shm", ready.exists, 120)
        assert (c.dev_shm() / "job-a-data").stat().st_size == 800 << 20
        second = c.job()
        ran(c, second)
        shm = next(r for r in json.loads(c.report.read_text())["checks"] if r["check"] == "shm")
        assert shm["status"] == "PASS" and shm["summary"].endswith(f"the free space is not judged: Slurm job {first} runs on this node"), shm
        assert "736 MiB free" in shm["summary"]  # what the first job left: reported, not held against the node
    finally:
        c.run("scancel", first)
    c.wait("the first job to end", lambda: c.job_state(first)[0] not in ("RUNNING", "COMPLETING"), 60)
    # Its 800 MiB stayed behind (a crashed job's segments do): on the now idle node they are a leftover.
    third = c.job()
    try:
        c.wait("the prolog to refuse the third job", lambda: "drain" in c.state()[0], 120)
        assert c.state() == ("drained", "Prolog error")
        assert "only 736 MiB of /dev/shm is free, below the 1 GiB floor" in (c.root / "prolog.log").read_text()
    finally:
        c.run("scancel", third)
        (c.dev_shm() / "job-a-data").unlink(missing_ok=True)
        c.run("scontrol", "update", f"NodeName={c.node}", "State=RESUME")
