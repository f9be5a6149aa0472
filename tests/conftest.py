from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import fakes
from preflight.checkkit import shm_judges
from preflight.pipeline import settings as settings_mod
from preflight.pipeline import report_paths, settings_view
from preflight.pipeline.check import Context
from preflight.base.host import Host
from preflight.pipeline.profiles import ResolvedFloor, ResolvedProfile

sys.path.insert(0, str(Path(__file__).parent))

FIXTURES = Path(__file__).parent / "fixtures"

# Every process this test session starts inherits this mark (launches pass the agent's
# environment on to their ranks), so a scan for what a test left running counts this
# session's processes only: another run of this checkout's tests beside it is not a stray.
SESSION_MARK = "PFTEST_SESSION"
os.environ[SESSION_MARK] = f"{os.getpid()}-{os.urandom(4).hex()}"


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


no_driver = pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA driver")
needs_root = pytest.mark.skipif(not _can_unshare(), reason="needs root and `unshare -m` for a private mount namespace")


# What the autouse fixture sets and clean_env keeps: a test's own lock file and report.
KEPT = ("PREFLIGHT_LOCK_FILE", "PREFLIGHT_REPORT")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No PREFLIGHT_* from the caller, no site config, a private lock file, and a private
    report: `run` with no --report writes PREFLIGHT_REPORT, never the real default
    (/var/lib/preflight as root, ~/.local/state otherwise), in this process or a child.
    A test that takes PREFLIGHT_REPORT away still finds the default in a folder of its own
    (root's state directory moved here, in this process only; anyone else's from XDG_STATE_HOME, children too)."""
    for key in list(os.environ):
        if key.startswith("PREFLIGHT_"):
            monkeypatch.delenv(key)
    monkeypatch.setattr(settings_mod, "DEFAULT_CONFIG", Path("/nonexistent/preflight/config.toml"))
    monkeypatch.setattr(settings_view, "DEFAULT_CONFIG", Path("/nonexistent/preflight/config.toml"))  # status's reader of it
    monkeypatch.setenv("PREFLIGHT_LOCK_FILE", str(tmp_path_factory.mktemp("lock") / "preflight.lock"))
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("PREFLIGHT_REPORT", str(state / "report.json"))
    monkeypatch.setattr(report_paths, "ROOT_STATE_DIR", state / "root")
    monkeypatch.setenv("XDG_STATE_HOME", str(state / "xdg"))


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fakes installed as a real entry-point plugin, visible in-process."""
    root = fakes.install_plugin(tmp_path / "plugin")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PREFLIGHT_PROFILES_DIR", str(root / "profiles"))
    return root


def tmpdir_in_nobodys_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """TMPDIR set to root's own tmp in a home nobody owns, who could rename tmp away and put one of
    theirs in its place; the directory, and the refusal preflight must give (gpuwork/scratch.py)."""
    home = tmp_path / "alice"
    (home / "tmp").mkdir(parents=True)
    os.chown(home, 65534, 65534)
    monkeypatch.setenv("TMPDIR", str(home / "tmp"))
    return home / "tmp", f"TMPDIR={home / 'tmp'} could be replaced under the workers by another user: {home} is nobody's"


def make_ctx(floors: dict[str, float] | None = None, host: Host | None = None) -> Context:
    profile = ResolvedProfile(
        name="test",
        description="test",
        path="(test)",
        checks=[],
        floors={
            k: ResolvedFloor(value=v, unit="bytes", source="test", origin="test") for k, v in (floors or {}).items()
        },
        timeouts={},
        chosen_because="test",
    )
    return Context(profile=profile, settings=settings_mod.Settings(), host=host or Host())


def load_worker(name: str):
    """checks/workers/NAME.py as a module, as torchrun runs it: its siblings (_rank...) imported bare, from beside it."""
    import importlib.util

    from preflight.gpuwork import launch

    if str(launch.WORKERS_DIR) not in sys.path:
        sys.path.insert(0, str(launch.WORKERS_DIR))
    spec = importlib.util.spec_from_file_location(f"{name}_worker", launch.WORKERS_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def nccl_fixture_text(prefix: str) -> str:
    """The recorded NCCL log (tests/fixtures/nccl) whose name starts with ``prefix``."""
    (path,) = (FIXTURES / "nccl").glob(prefix + "*.log")
    return path.read_text()


def run_preflight(args: list[str], env: dict[str, str] | None = None, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`python -m preflight ARGS` as a real process, as a person or systemd runs it."""
    if env is None:
        env = clean_env()
    return subprocess.run([*fakes.PREFLIGHT, *args], env=env, capture_output=True, text=True, timeout=timeout, **kw)


CPU_TOML = Path(__file__).parents[1] / "preflight" / "pipeline" / "profiles" / "cpu.toml"


def clean_env(report: bool = True) -> dict[str, str]:
    """This process's environment without PREFLIGHT_* settings (the test's lock file and report
    kept). ``report=False`` leaves out PREFLIGHT_REPORT too, for a run whose report a config file
    names (the variable would win over it) or that writes none (--scratch, a group run)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_") or k in KEPT and (report or k != "PREFLIGHT_REPORT")}


def fast_profile(tmp_path: Path, check: str, deadline: float, edits: dict[str, str] | None = None) -> dict[str, str]:
    """The cpu profile with a 4 s collective timeout and ``deadline`` for ``check``,
    as a site profile "cpu-fast" an operator would write: a hang is found in seconds.
    ``edits``: more text replaced in it (each must be found once)."""
    site = tmp_path / "profiles"
    site.mkdir()
    text = CPU_TOML.read_text().replace('name = "cpu"', 'name = "cpu-fast"').replace("op_timeout_seconds = 20", "op_timeout_seconds = 4")
    for old, new in (edits or {}).items():
        assert text.count(old) == 1, f"{old!r} is not in cpu.toml once"
        text = text.replace(old, new)
    (site / "cpu-fast.toml").write_text(text + f"\n[timeouts]\n{check} = {deadline}\n")
    return {**clean_env(), "PREFLIGHT_PROFILES_DIR": str(site)}


def workers_left(tmp_path: Path) -> str:
    """What pgrep finds of this test's workers (their --out lies under its own
    TMPDIR, so runs elsewhere on the machine do not count): must be nothing."""
    return subprocess.run(["pgrep", "-af", f"{tmp_path}/tmp/preflight-worker-"], capture_output=True, text=True).stdout.strip()


REPORTS = FIXTURES / "reports"


def report_file(path: Path, fixture: str, boot: str | None = "this", age: float = 0.0, **changes: object) -> Path:
    """A recorded report (tests/fixtures/reports) rewritten as if its run finished
    ``age`` seconds ago, in this boot (``boot="this"``), in another, or with none."""
    import json
    from datetime import datetime, timedelta, timezone

    from preflight.outputs.record.last_report import this_boot

    data = json.loads((REPORTS / f"{fixture}.json").read_text())
    finished = datetime.now(timezone.utc) - timedelta(seconds=age)
    data["finished_at"] = finished.isoformat()
    data["started_at"] = (finished - timedelta(seconds=data["duration_seconds"])).isoformat()
    data["boot_id"] = this_boot() if boot == "this" else boot
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))
    return path


def recorded_run(hours_ago: float, memcpy: float | None = None, failed: tuple[str, ...] | list[str] = ()):
    """The recorded cpu run (tests/fixtures/reports/cpu-pass.json) as if it finished ``hours_ago``,
    with both ranks' memcpy at ``memcpy`` and ``failed`` checks failed: a past run for a history."""
    from datetime import datetime, timedelta, timezone

    from preflight.base.findings import Status
    from preflight.pipeline.report import Report, Verdict

    r = Report.model_validate_json((REPORTS / "cpu-pass.json").read_text())
    finished = datetime.now(timezone.utc) - timedelta(hours=hours_ago)
    r.started_at, r.finished_at = finished - timedelta(seconds=r.duration_seconds), finished
    for c in r.checks:
        if c.check in failed:
            c.status = Status.FAIL
        for m in c.measurements:
            if m.name == "memcpy_bandwidth" and memcpy is not None:
                m.value = memcpy
    if failed:
        r.verdict = Verdict.FAIL
    return r


def run_record_file(report: Path, started_at, alive: bool, deadline_after: float = 3600.0) -> Path:
    """The record (preflight/outputs/record/run_record.py) of a run that started at ``started_at``, beside
    ``report``: this test process's own (alive), or a real process's that wrote it and exited (gone)."""
    from datetime import timedelta

    from preflight.outputs.record import last_report, run_record

    deadline = started_at + timedelta(seconds=deadline_after)
    if alive:
        text = run_record.render(started_at, deadline, last_report.this_boot())
    else:
        code = ("import sys; from datetime import datetime; from preflight.outputs.record import last_report, run_record; "
                "print(run_record.render(datetime.fromisoformat(sys.argv[1]), datetime.fromisoformat(sys.argv[2]), last_report.this_boot()), end='')")
        text = subprocess.run([sys.executable, "-c", code, started_at.isoformat(), deadline.isoformat()],
                              capture_output=True, text=True, check=True, timeout=60).stdout  # reaped: its pid is gone
    path = run_record.path_for(report)
    path.write_text(text)
    return path


# ---- shared by more than one test module -------------------------------------


# An unprivileged local user, for what one can do to a run as root: /usr/bin's
# python (this venv's may sit where nobody cannot reach), ln, flock.
NOBODY_PYTHON = "/usr/bin/python3"
needs_nobody = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("runuser") or not os.access(NOBODY_PYTHON, os.X_OK),
    reason="needs root, runuser and /usr/bin/python3 to act as user nobody",
)


def as_nobody(*cmd: str, **kw) -> subprocess.CompletedProcess:
    """``cmd`` run as user nobody (runuser), as another user on the node would."""
    return subprocess.run(["runuser", "-u", "nobody", "--", *cmd], capture_output=True, text=True, timeout=60, **kw)


def as_user(uid: int, fn):  # noqa: ANN001, ANN201
    """``fn()``'s JSON-able answer, from a forked child that gave up root for ``uid`` first: this
    checkout's code, already imported, run as another user (who may not reach this venv). An
    exception in the child comes back as {"error": its repr}. Skips the test where this process is
    not root, which cannot become another user."""
    if os.geteuid() != 0:
        pytest.skip(f"needs root to act as uid {uid}")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            try:
                answer = fn()
            except BaseException as e:  # said to the parent, not lost with the child
                answer = {"error": repr(e)}
            os.write(w, json.dumps(answer).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def _reachable(kind: str, mode: int) -> Iterator[Path]:
    """A fresh directory of root's in /tmp with ``mode``, which user nobody can reach."""
    d = Path(tempfile.mkdtemp(prefix=f"preflight-{kind}-", dir="/tmp"))
    d.chmod(mode)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like /var/lib/preflight: root's, 0755, so other users can read what is 0644 in it."""
    yield from _reachable("shared", 0o755)


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A fresh directory like /tmp (root's, 1777) that user nobody can reach."""
    yield from _reachable("sticky", 0o1777)



@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A passing and a failing report, each written by a real `preflight run`."""
    d = tmp_path_factory.mktemp("reports")
    env = {**clean_env(), "PREFLIGHT_LOCK_FILE": str(d / "preflight.lock")}
    run = [*fakes.PREFLIGHT, "run", "--profile", "cpu", "--only", "shm", "-q", "--report"]
    done = subprocess.run([*run, str(d / "pass.json")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if needs_root.args[0]:  # skipif's condition: no private mount namespace here: the same failure, built as the pipeline builds it
        fail = json.loads((d / "pass.json").read_text())
        fail["verdict"], fail["exit_code"] = "fail", 1
        fail["checks"][0].update(status="FAIL", summary="/dev/shm is 64 MiB, below the 1 GiB floor")
        (d / "fail.json").write_text(json.dumps(fail))
    else:  # a real failure: /dev/shm at Docker's 64 MiB in a private mount namespace
        line = " ".join([*run, str(d / "fail.json")])
        done = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {line}"],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1, done.stderr
    # The node's own gate writes it on the host: its small /dev/shm is the node's configuration
    # (checkkit/shm_judges.py's owner). Where this machine is itself a container, the run said the job's.
    fail = json.loads((d / "fail.json").read_text())
    host = shm_judges.owner(shm_judges.ShmFacts(path="/dev/shm", exists=True))
    fail["checks"][0].update(action=host.action.value, domain=host.domain.value, action_source=host.source)
    (d / "fail.json").write_text(json.dumps(fail))
    return {"pass": d / "pass.json", "fail": d / "fail.json"}


HOLD_LOCK = (
    "import sys\nfrom pathlib import Path\nfrom preflight.pipeline.lock import run_lock\n"
    "with run_lock(Path(sys.argv[1]), 0):\n    print('held', flush=True)\n    sys.stdin.read()\n"
)


@contextlib.contextmanager
def lock_held(path: Path) -> Iterator[int]:
    """Another preflight run's hold on the lock (a recheck, an admin's standard run), taken as
    every run takes it (preflight.pipeline.lock.run_lock) in a process of its own; yields its pid."""
    p = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "held\n", f"the holder did not take {path}"
        yield p.pid
    finally:
        p.stdin.close()  # lets it go
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# `nvidia-smi topo -m` captures and the facts tests/fixtures/topo/expected.json states for each.
TOPO_EXPECTED = json.loads((FIXTURES / "topo" / "expected.json").read_text())
GPU_KEYS = ("index", "cpu_affinity", "numa_affinity", "gpu_numa_id")


def expand_links(spec: dict, n_gpu: int) -> dict[str, str]:
    """expected.json's compact links ({"all": T} or {T: ["a-b", ...]}) as Topo.links."""
    pairs = [f"{a}-{b}" for a, b in itertools.combinations(range(n_gpu), 2)]
    if "all" in spec:
        return dict.fromkeys(pairs, spec["all"])
    out = {pair: kind for kind, listed in spec.items() for pair in listed}
    assert len(out) == sum(map(len, spec.values())) and set(out) == set(pairs), "expected.json must list every pair once"
    return out


def gpu_facts(dump: dict) -> list[dict]:
    return [{k: g[k] for k in GPU_KEYS} for g in dump["gpus"]]


def assert_index_facts(got: dict, name: str) -> None:
    """``got`` (a Topo dump, or `preflight topology --json`) holds the facts INDEX.md states for ``name``."""
    want = TOPO_EXPECTED[name]
    assert len(got["gpus"]) == want["gpu_count"]
    assert got["nics"] == want["nics"]
    assert got["links"] == expand_links(want["links"], want["gpu_count"])
    assert gpu_facts(got) == want["gpus"]
    for key in ("numa_nodes", "cpu_groups", "spans_numa", "nearest_nics"):
        assert got[key] == want[key], key
    assert got["notes"] == []


def world_processes() -> list[psutil.Process]:
    """Ranks of a shared launch (checks/workers/world.py) this test session started, still alive
    anywhere on this machine (orphans included: they keep the session's mark in their environment)."""
    from preflight.gpuwork import launch

    driver = str(launch.WORKERS_DIR / "world.py")
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if (p.info["status"] != psutil.STATUS_ZOMBIE and driver in (p.info["cmdline"] or [])
                    and p.environ().get(SESSION_MARK) == os.environ[SESSION_MARK]):
                found.append(p)
        except psutil.Error:
            continue
    return found
