"""Bad input as a person or a script hands it over, through the real command: one
line naming what is wrong and how to fix it, exit 2, and nothing written (no report,
no textfile, no /dev/shm segment), or, where the input is not bad but was misread,
the right finding. Issue 32's list, item by item."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import CPU_TOML, clean_env, run_preflight

import fakes

ROOT = Path(__file__).parents[2]
DEEP = "a = " + "[" * 1000 + "]" * 1000 + "\n"  # deeper than tomllib recurses


def one_line_exit_2(p, *words: str) -> str:
    """The single error line of a refused command, holding every one of ``words``."""
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("preflight: error: ") and "Traceback" not in p.stderr, p.stderr[-2000:]
    for w in words:
        assert w in line, line
    return line


def run_refused(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    """`preflight run --profile cpu ARGS` with a report and a textfile: refused, it leaves neither."""
    report, textfile = tmp_path / "report.json", tmp_path / "prom"
    textfile.mkdir(exist_ok=True)
    p = run_preflight(["run", "--profile", "cpu", "--report", str(report), "--textfile-dir", str(textfile), *args], env=env, timeout=60)
    assert not report.exists() and list(textfile.iterdir()) == [], p.stderr
    return p


# --- a config or profile nested 1,000 deep ----------------------------------------

def test_a_config_nested_a_thousand_deep_is_one_line_for_run_and_status(tmp_path):
    config = tmp_path / "deep.toml"
    config.write_text(DEEP)
    one_line_exit_2(run_refused(tmp_path, "--config", str(config)), f"config file {config} nests tables or arrays more than 16 deep")
    status = run_preflight(["status", "--config", str(config), "--report", str(tmp_path / "r.json")], timeout=60)
    one_line_exit_2(status, "nests tables or arrays more than 16 deep")


def test_a_profile_nested_a_thousand_deep_is_one_line_for_run_and_show_profile(tmp_path):
    site = tmp_path / "profiles"
    site.mkdir()
    (site / "deep.toml").write_text('name = "deep"\n' + DEEP)
    env = {**clean_env(), "PREFLIGHT_PROFILES_DIR": str(site)}
    one_line_exit_2(run_refused(tmp_path, "--profile", "deep", env=env), f"profile file {site / 'deep.toml'} nests tables or arrays")
    one_line_exit_2(run_preflight(["show-profile", "deep"], env=env, timeout=60), "nests tables or arrays more than 16 deep")


# --- a floor of 0, or 0x10 ------------------------------------------------------------

@pytest.mark.parametrize("value, words", [
    ("0", "= 0 bytes (0 B) passes every node, so its check would judge nothing; give at least 1048576 bytes (1 MiB)"),
    ("0x10", "= 16 bytes (16 B) judges nothing: under 1 MiB, less than one NCCL buffer"),
])
def test_a_floor_that_judges_nothing_is_refused_before_shm_writes_a_segment(tmp_path, value, words):
    config = tmp_path / "site.toml"
    config.write_text(f"[floors]\nshm_min_bytes = {value}\n")
    before = set(os.listdir("/dev/shm"))
    p = run_refused(tmp_path, "--only", "shm", "--config", str(config))
    one_line_exit_2(p, f"config {config} line 2: floor 'shm_min_bytes' ", words)
    assert not {n for n in set(os.listdir("/dev/shm")) - before if n.startswith("preflight")}  # no segment was written


def test_a_ceiling_of_0_or_of_a_billion_seconds_is_refused_and_a_profile_s_own_floor_too(tmp_path):
    config = tmp_path / "site.toml"
    config.write_text("[floors]\nallreduce_latency = 0\n")
    one_line_exit_2(run_refused(tmp_path, "--config", str(config)), "floor 'allreduce_latency' = 0 seconds (0 ms) fails every node")
    config.write_text("[floors]\nallreduce_latency = 1e9\n")
    one_line_exit_2(run_refused(tmp_path, "--config", str(config)), "judges nothing: over 3600.00 s", "give at most 3600 seconds")
    site = tmp_path / "profiles"
    site.mkdir()
    (site / "cpu.toml").write_text(CPU_TOML.read_text().replace("value = 2e9", "value = 0"))  # memcpy_bandwidth
    env = {**clean_env(), "PREFLIGHT_PROFILES_DIR": str(site)}
    one_line_exit_2(run_refused(tmp_path, env=env), f"profile {site / 'cpu.toml'}: floor 'memcpy_bandwidth' = 0 bytes_per_second")


# --- a FIFO with no writer --------------------------------------------------------------

@pytest.mark.parametrize("args", [["explain"], ["nccl-log"], ["xid", "--from"], ["topology", "--from"]], ids=lambda a: a[0])
def test_a_fifo_nothing_writes_to_is_refused_at_once(tmp_path, args):
    fifo = tmp_path / "capture"
    os.mkfifo(fifo)
    started = time.monotonic()
    p = run_preflight([*args, str(fifo)], timeout=60)  # before: it waited until killed
    one_line_exit_2(p, f"{fifo}: a FIFO nothing writes to; save the output to a file")
    assert time.monotonic() - started < 30


def test_a_pipe_with_a_writer_is_still_read(tmp_path):
    log = next((ROOT / "tests" / "fixtures" / "nccl").glob("02_*.log"))
    p = run_preflight(["nccl-log", "/dev/stdin"], timeout=60, input=log.read_text())  # as `nccl-log <(ssh node cat log)` reads
    assert p.returncode == 0 and "NCCL version  2.27.5+cuda12.9" in p.stdout, p.stderr


# --- slurm-healthcheck --node with a host list ------------------------------------------

@pytest.mark.parametrize("name", ["gpu-[01-99]", "gpu-01,gpu-02", "ALL", "gpu 01"])
def test_slurm_healthcheck_takes_one_node_name_and_never_calls_scontrol_otherwise(tmp_path, name):
    log = tmp_path / "scontrol.log"
    bindir = fakes.scontrol(tmp_path / "bin", "NodeName=gpu-01 State=IDLE\n", log)
    env = {**clean_env(), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    p = run_preflight(["slurm-healthcheck", "--node", name, "--report", str(tmp_path / "none.json")], env=env, timeout=60)
    one_line_exit_2(p, f"--node {name!r}: ", "give this node's own NodeName")
    assert not log.exists()  # scontrol was never run: nothing drained
    p = run_preflight(["slurm-healthcheck", "--report", str(tmp_path / "none.json")], env={**env, "SLURMD_NODENAME": name}, timeout=60)
    one_line_exit_2(p, f"SLURMD_NODENAME {name!r}: ")
    assert not log.exists()



@pytest.mark.parametrize("name", ["gpu-01\nother", "GPU-01", "../nodes", "gpu 01", "x" * 254])
def test_kube_label_takes_a_kubernetes_node_name_only(tmp_path, name):
    # Before: --dry-run previewed a PATCH of /api/v1/nodes/gpu-01%0Aother and exit 0; for real, the API
    # server's 404 read as a cluster that could not be told (exit 1).
    shown = repr(name[:80])
    p = run_preflight(["kube-label", "--dry-run", "--node", name, "--report", str(tmp_path / "none.json")], timeout=60)
    one_line_exit_2(p, f"--node {shown}: not a Kubernetes node name")
    p = run_preflight(["kube-label", "--dry-run", "--report", str(tmp_path / "none.json")], env={**clean_env(), "NODE_NAME": name}, timeout=60)
    one_line_exit_2(p, f"NODE_NAME {shown}: not a Kubernetes node name")

# --- integers past any sense ---------------------------------------------------------------

def test_a_node_rank_past_the_group_is_refused_from_flag_config_and_environment(tmp_path):
    one_line_exit_2(run_refused(tmp_path, "--node-rank", "99999999999999999999"), "--node-rank")
    one_line_exit_2(run_refused(tmp_path, "--node-rank", "3"), "node_rank 3 (--node-rank) is not below nnodes 1 (the default)")
    config = tmp_path / "site.toml"
    config.write_text("node_rank = 99999999999999999999\n")
    one_line_exit_2(run_refused(tmp_path, "--config", str(config)), f"config {config} line 1: node_rank: ")
    config.write_text("node_rank = 5\n")
    one_line_exit_2(run_refused(tmp_path, "--config", str(config)), f"node_rank 5 (config {config}) is not below nnodes 1")
    one_line_exit_2(run_preflight(["status", "--config", str(config)], timeout=60), "node_rank 5")  # status reads the same config alike
    env = {**clean_env(), "PREFLIGHT_NODE_RANK": "2"}
    one_line_exit_2(run_refused(tmp_path, "--nnodes", "2", env=env), "node_rank 2 (PREFLIGHT_NODE_RANK) is not below nnodes 2 (--nnodes)")


@pytest.mark.parametrize("args, words", [
    (["kube-label", "--dry-run", "--node", "n1", "--every", "1e300"], "--every 1e+300: give a number of seconds above 0, at most 86400"),
    (["status", "--max-age", "1e400"], "--max-age inf: give a number of seconds above 0"),
    (["pairwise", "--hosts", "{hosts}", "--exec", "false {{host}}", "--timeout", "1e300"], "--timeout 1e+300: give the seconds a pair may take"),
])
def test_seconds_past_a_day_or_infinite_are_refused(tmp_path, args, words):
    hosts = tmp_path / "hosts"
    hosts.write_text("a\nb\n")
    one_line_exit_2(run_preflight([a.format(hosts=hosts) for a in args], timeout=60), words)


# --- a document that quotes NCCL lines is not a log ----------------------------------------

@pytest.mark.parametrize("doc", ["README.md", "docs/ARCHITECTURE.md", "docs/explain.md"])
@pytest.mark.parametrize("args", [["explain"], ["nccl-log"], ["xid", "--from"], ["topology", "--from"]], ids=lambda a: a[0])
def test_a_document_that_quotes_captures_is_not_read_as_one(doc, args):
    p = run_preflight([*args, str(ROOT / doc)], timeout=60)  # before: README (now docs/explain.md) "FAIL /dev/shm is too small", exit 1
    one_line_exit_2(p, f"{ROOT / doc}: is a document (Markdown) that quotes captures, not a capture")


# --- a path the kernel will not take, a full disk where the output goes, an integer past a float ---


def test_a_path_too_long_for_the_kernel_is_one_line_and_nothing_is_written(tmp_path):
    long = "/tmp/" + "x" * 300
    one_line_exit_2(run_refused(tmp_path, "--level", "quick", "--textfile-dir", long), "File name too long; give a shorter path")
    one_line_exit_2(run_preflight(["list"], env={**clean_env(), "PREFLIGHT_PROFILES_DIR": long}, timeout=60), "File name too long")


def test_a_full_disk_where_stdout_goes_is_one_line_not_a_traceback():
    with open("/dev/full", "w") as full:
        p = subprocess.run([*fakes.PREFLIGHT, "list", "--json"], env=clean_env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    one_line_exit_2(p, "cannot write the output: No space left on device")


def test_an_integer_floor_past_a_float_s_range_is_one_line(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[floors]\nshm_min_bytes = 1" + "0" * 400 + "\n")
    one_line_exit_2(run_refused(tmp_path, "--config", str(config)), "a floor must be a finite number >= 0, not an integer of 401 digits")
    config.write_text("lock_timeout = 1" + "0" * 400 + "\n")
    one_line_exit_2(run_preflight(["status", "--config", str(config)], timeout=60), f"config {config} line 1: lock_timeout")


@pytest.mark.parametrize("args, words", [
    (["run", "--profile", "cpu", "--textfile-dir", ""], "--textfile-dir: an empty value; give one, or leave the option out"),
    (["run", "--profile", "cpu", "--report="], "--report: an empty value"),
    (["selftest", "--stage", ""], "--stage: an empty value"),
    (["run", "--nproc-per-node", "abc"], "Invalid value for '--nproc-per-node'"),  # Typer's own, on one line
    (["run", "--if-idel"], "No such option: --if-idel"),
    (["selftest", "--profile", "nosuch"], "unknown profile 'nosuch'"),
])
def test_an_empty_or_unparsable_option_is_one_line_before_anything_runs(tmp_path, args, words):
    # An empty path would read as the current directory: `--textfile-dir ""` wrote preflight.prom there.
    p = run_preflight(args, timeout=60, cwd=tmp_path)
    one_line_exit_2(p, words)
    assert list(tmp_path.iterdir()) == []


NVSMI = ROOT / "tests" / "fixtures" / "nvsmi" / "q_08_a100-sxm4-80gb_driver555_full-q_GPU1-of-4_clean-baseline_no-timestamp-line.txt"


@pytest.mark.parametrize("fixture, old, new", [
    (NVSMI, "Total                             : 81920 MiB", "Total                             : -5 MiB"),
    (NVSMI, "DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : -1"),
    (NVSMI, "DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : " + "9" * 5000),
    (NVSMI, "Driver Version                            : 555.42.02", "Driver Version                            : 555." + "4" * 5000),
    (ROOT / "tests/fixtures/nccltests/02_a100-sxm4-80gb-x8_all_reduce_perf_single-process-g8_thanos.txt", "           8             2     float",
     "           " + "8" * 5000 + "             2     float"),
    (ROOT / "tests/fixtures/df/shm_02_df-k_gh200-container_handmade.txt", "4186993664", "4" * 400),
])
def test_a_capture_with_a_number_no_tool_prints_is_explained_or_refused_in_one_line(tmp_path, fixture, old, new):
    text = fixture.read_text()
    assert old in text
    capture = tmp_path / "capture.txt"
    capture.write_text(text.replace(old, new, 1))
    p = run_preflight(["explain", str(capture), *(["--profile", "a100-sxm4-80gb"] if fixture == NVSMI else [])], timeout=60)
    assert p.returncode in (0, 1, 2) and "Traceback" not in p.stderr, p.stderr[-3000:]
    if p.returncode == 2:
        one_line_exit_2(p, str(capture))


@pytest.mark.parametrize("args, words", [
    (["run", "--profile", "cpu", "--only", "shm\nnccl"], "shm\\nnccl: no such check"),
    (["run", "--profile", "cpu", "--python", "{tmp}/py\nthon"], "py\\nthon"),
    (["explain", "{tmp}/cap\nture"], "cap\\nture: no such file"),
    (["nccl-log", "{tmp}/cap\nture"], "cap\\nture: no such file"),
    (["status", "--config", "{tmp}/con\nfig.toml"], "con\\nfig.toml"),
])
def test_a_line_break_in_a_value_is_told_on_one_line(tmp_path, args, words):
    # Before: the error broke where the value did, two or three lines a log reader takes for separate ones.
    p = run_preflight([a.replace("{tmp}", str(tmp_path)) for a in args], timeout=60, cwd=tmp_path)
    one_line_exit_2(p, words)



def test_selftest_refuses_a_profile_it_cannot_read_before_any_stage(tmp_path):
    # Before: only the name was looked up; the inventory ran, then five stages each failed on the file (exit 1).
    (tmp_path / "broken.toml").write_text('name = "broken"\n')
    env = {**clean_env(), "PREFLIGHT_PROFILES_DIR": str(tmp_path)}
    p = run_preflight(["selftest", "--profile", "broken", "--stage", "cuda"], env=env, timeout=120)
    one_line_exit_2(p, "profile ", "broken.toml: description: required key is missing")
    assert p.stdout == ""



@pytest.mark.parametrize("command", [["run", "--profile", "cpu", "--only", "shm", "--scratch"], ["calibrate", "--profile", "cpu", "-o", "{tmp}/floors.toml"]])
def test_a_file_that_is_no_lock_is_not_taken_as_the_lock(tmp_path, command):
    # Before: `--lock-file /etc/preflight/config.toml` (or PREFLIGHT_LOCK_FILE) wrote the run's pid over the config.
    config = tmp_path / "config.toml"
    config.write_text('profile = "cpu"\nkeep_going = true\n')
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    p = run_preflight(args, env={**clean_env(), "PREFLIGHT_LOCK_FILE": str(config)}, timeout=120)
    one_line_exit_2(p, f"lock file {config}: holds 34 bytes, so it is no lock preflight made")
    assert config.read_text() == 'profile = "cpu"\nkeep_going = true\n'
    assert not (tmp_path / "floors.toml").exists()
