"""The CLI as a person uses it: through Typer's CliRunner, and as real processes."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import clean_env, needs_root, no_driver, run_preflight
from typer.testing import CliRunner

import fakes
from preflight.cli.app import app
from preflight.gpuwork.launch import free_port
from preflight.base.progress import PLAIN_EVERY
from preflight.pipeline.report import Report


def invoke(*args):
    return CliRunner().invoke(app, list(args))


# --- run --------------------------------------------------------------------

def test_cpu_profile_passes_and_prints_the_verdict():
    r = invoke("run", "--profile", "cpu")
    assert r.exit_code == 0, r.output
    assert "[PASS] shm" in r.stderr and "[PASS] nccl" in r.stderr and "preflight: PASS (profile cpu; " in r.stderr
    # bandwidth and train measure: on a machine loaded by other work a figure may not settle within
    # its band, or a rank may trail the other, and that is a WARN, never a failure.
    assert all(f"[PASS] {c}" in r.stderr or f"[WARN] {c}" in r.stderr for c in ("bandwidth", "train")), r.stderr
    assert r.stdout == ""  # data goes to stdout only with --json


def test_json_report_validates_against_the_model_and_is_written_too(tmp_path):
    path = tmp_path / "report.json"
    r = invoke("run", "--profile", "cpu", "--json", "--report", str(path))
    assert r.exit_code == 0
    printed = Report.model_validate_json(r.stdout)
    assert Report.model_validate_json(path.read_text()) == printed
    assert printed.verdict == "pass" and printed.profile == "cpu" and printed.exit_code == 0
    assert printed.schema_version == 1 and printed.boot_id and printed.hostname
    assert printed.started_at.tzinfo is not None and printed.finished_at >= printed.started_at
    assert [c.check for c in printed.checks] == ["shm", "nccl", "bandwidth", "train"]
    raw = json.loads(r.stdout)
    assert raw["started_at"].endswith("Z")  # RFC 3339 in UTC


def test_quiet_keeps_warn_lines_as_the_page_lists_them_under_problems(tmp_path):
    env = {**clean_env(), "NCCL_SHM_DISABLE": "1"}  # the shm check warns: a debugging switch left on
    p = run_preflight(["run", "--profile", "cpu", "--only", "shm", "-q", "--report", str(tmp_path / "r.json")], env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert lines[0].startswith("[WARN] shm (") and "NCCL_SHM_DISABLE=1 is set" in lines[0], p.stderr  # before: hidden by -q
    assert any(line.strip().startswith("fix: unset NCCL_SHM_DISABLE") for line in lines)
    assert lines[-1].startswith("preflight: PASS (profile cpu; 1 warn)")


@no_driver
def test_auto_without_a_driver_fails_with_the_cause_and_the_dry_run_hint(tmp_path):
    path = tmp_path / "r.json"
    r = invoke("run", "--report", str(path))
    assert r.exit_code == 1
    assert "no NVIDIA driver" in r.stderr and "--profile cpu" in r.stderr
    rep = Report.model_validate_json(path.read_text())
    assert rep.verdict == "fail" and rep.profile is None and rep.checks[0].check == "profile"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--profile", "h900"], "unknown profile 'h900'; choose one of: auto, a100-pcie, a100-sxm4-80gb, cpu, gb10, generic, h100-nvl"),
        (["--profile", "cpu", "--only", "nosuch"], "only (--only, PREFLIGHT_ONLY or config): nosuch: no such check; installed checks:"),
        (["--profile", "cpu", "--skip", "nosuch"], "skip (--skip, PREFLIGHT_SKIP or config): nosuch: no such check"),
        (["--profile", "cpu", "--only", "shm", "--skip", "shm"], "only and skip both name shm"),
        (["--profile", "cpu", "--skip", "shm,nccl,bandwidth,train"], "no check left to run: skip removes every check of profile cpu at level standard (shm, nccl, bandwidth, train)"),
        (["--profile", "cpu", "--rdzv-port", "70000"], "--rdzv-port: Input should be less than or equal to 65535"),
        (["--profile", "cpu", "--nproc-per-node", "0"], "--nproc-per-node: Input should be greater than or equal to 1"),
        (["--profile", "cpu", "--lock-timeout", "-1"], "--lock-timeout: Input should be greater than or equal to 0"),
        (["--profile", "cpu", "--report", "/nonexistent/dir/r.json"], "directory /nonexistent/dir does not exist"),
        (["--profile", "cpu", "--config", "/nonexistent/c.toml"], "config file /nonexistent/c.toml does not exist"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_runs_nothing(args, message):
    r = invoke("run", *args)
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("preflight: error: ")
    assert message in r.stderr
    assert "[PASS]" not in r.stderr and "[FAIL]" not in r.stderr  # no check ran


@pytest.mark.parametrize(
    "config, message",
    [
        ('profile = "cpu"\n\n[floors]\nshm_min_bytes = "lots"\n', "line 4: floors.shm_min_bytes: Value error, a floor must be a number"),
        ('profile = "cpu"\n[floors]\nshm_min_bytes = -1\n', "line 3: floors.shm_min_bytes: Value error, a floor must be a finite number >= 0"),
        ('profile = "cpu"\n[floors]\nhbm = 5\n', "line 3: floor 'hbm' is not a floor of profile cpu"),
        ('profile = "cpu"\nkeepgoing = true\n', "line 2: keepgoing: unknown key"),
        ('profile = cpu\n', "invalid TOML"),
        ('profile = "cpu"\n[node]\ngpus = 0\n', "line 3: node.gpus: Value error, must be a whole number of GPUs from 1 to 256"),
        ('profile = "cpu"\n[node]\ngpus = 4096\n', "line 3: node.gpus: Value error, must be a whole number of GPUs from 1 to 256 (no node holds more), not 4096"),
    ],
)
def test_bad_config_exits_2_naming_file_line_and_key_and_writes_nothing(tmp_path, config, message):
    cfg = tmp_path / "config.toml"
    cfg.write_text(config)
    report = tmp_path / "report.json"
    r = invoke("run", "--config", str(cfg), "--report", str(report))
    assert r.exit_code == 2
    assert str(cfg) in r.stderr and message in r.stderr
    assert not report.exists()


def test_a_site_floor_override_is_applied(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('profile = "cpu"\n[floors]\nshm_min_bytes = 1099511627776000\n')
    r = invoke("run", "--config", str(cfg), "--json")
    assert r.exit_code == 1
    check, *after = Report.model_validate_json(r.stdout).checks
    assert check.summary.endswith("below the 1000 TiB floor") and [a.status for a in after] == ["SKIP", "SKIP", "SKIP"]


def test_fail_fast_keep_going_timeout_and_error_through_the_cli(plugin):
    # Each run a trial of its own (--scratch): a report, the default one too, would keep
    # for the next run what it skips (report.carry_forward: the FAIL of `failing` below).
    fakes.write_profile(plugin / "profiles", "fakes", ["passing", "failing", "warning"])
    r = invoke("run", "--profile", "fakes", "--json", "--scratch")
    assert r.exit_code == 1
    assert [c.status for c in Report.model_validate_json(r.stdout).checks] == ["PASS", "FAIL", "SKIP"]
    r = invoke("run", "--profile", "fakes", "--json", "--keep-going", "--scratch")
    assert [c.status for c in Report.model_validate_json(r.stdout).checks] == ["PASS", "FAIL", "WARN"]
    r = invoke("run", "--profile", "fakes", "--json", "--skip", "failing", "--scratch")
    assert r.exit_code == 0
    assert [c.check for c in Report.model_validate_json(r.stdout).checks] == ["passing", "warning"]

    fakes.write_profile(plugin / "profiles", "raises", ["raising"])
    r = invoke("run", "--profile", "raises", "--json", "--scratch")
    assert r.exit_code == 3  # the tool broke, not the node: still not a pass
    (c,) = Report.model_validate_json(r.stdout).checks
    assert c.status == "ERROR" and "boom inside the check" in c.details["traceback"]


def test_only_a_check_outside_the_profile_is_refused(plugin):
    fakes.write_profile(plugin / "profiles", "fakes", ["passing"])
    r = invoke("run", "--profile", "fakes", "--only", "warning")
    assert r.exit_code == 2 and "only warning: not in profile fakes (its checks: passing)" in r.stderr


def test_a_profile_that_lists_a_check_before_what_it_requires_is_refused(plugin):
    fakes.write_profile(plugin / "profiles", "backwards", ["needsfailing", "failing"])
    r = invoke("run", "--profile", "backwards")
    assert r.exit_code == 2 and "lists needsfailing before failing, which it requires; put failing first" in r.stderr


def test_a_profile_missing_a_floor_its_check_needs_is_refused(plugin):
    fakes.write_profile(plugin / "profiles", "noshmfloor", ["shm"])
    r = invoke("run", "--profile", "noshmfloor")
    assert r.exit_code == 2 and "has no floor 'shm_min_bytes', which check shm needs" in r.stderr


# --- real processes ----------------------------------------------------------

def test_real_process_cpu_profile_exits_0(tmp_path):
    # A healthy cpu run's checks now end within PLAIN_EVERY, before a log gets a stage line: this
    # site copy of the profile times enough latency iterations that bandwidth outlasts it.
    from conftest import CPU_TOML

    site = tmp_path / "profiles"
    site.mkdir()
    text = CPU_TOML.read_text()
    for old, new in (("latency_iters = 100\n", "latency_iters = 20000\n"), ("max_latency_iters = 400\n", "max_latency_iters = 20000\n")):
        assert old in text
        text = text.replace(old, new)
    (site / "cpu.toml").write_text(text)
    p = run_preflight(["run", "--profile", "cpu"], env={**clean_env(), "PREFLIGHT_PROFILES_DIR": str(site)})
    assert p.returncode == 0, p.stderr
    assert "preflight: PASS" in p.stderr and p.stdout == ""
    # In a pipe, progress is plain lines on stderr: each check's start, then its stage as it
    # changes, at most one line per progress.PLAIN_EVERY seconds; no escape code, no carriage return.
    assert "\x1b" not in p.stderr and "\r" not in p.stderr
    started = re.findall(r"^  \.\.\. (\w+)$", p.stderr, re.M)
    assert started == ["shm", "nccl", "bandwidth", "train"], p.stderr
    staged = re.findall(r"^  \.\.\. (\w+)  (.+)  (\d+\.\d) s$", p.stderr, re.M)
    assert any("2 ranks" in stage or "rank " in stage for _, stage, _ in staged), p.stderr  # the workers' stages
    for check in started:
        clocks = [float(clock) for c, _, clock in staged if c == check]
        assert all(b - a >= PLAIN_EVERY - 0.1 for a, b in zip([0.0, *clocks], clocks)), (check, clocks)


def test_plain_output_in_logs_with_measurements_when_verbose():
    p = run_preflight(["run", "--profile", "cpu", "-v"])
    assert "\x1b[" not in p.stderr  # no escape codes in logs
    assert "shm_size = " in p.stderr  # -v prints measurements


def test_a_hung_check_fails_within_its_deadline_and_leaves_no_process(tmp_path):
    root = fakes.install_plugin(tmp_path)
    fakes.write_profile(root / "profiles", "hangs", ["hanging"], "[timeouts]\nhanging = 1.0\n")
    pid_file = tmp_path / "sleeper.pid"
    start = time.monotonic()
    p = run_preflight(["run", "--profile", "hangs", "--json"], env={**fakes.plugin_env(root), "FAKE_PID_FILE": str(pid_file)})
    assert time.monotonic() - start < 30
    assert p.returncode == 1
    (c,) = Report.model_validate_json(p.stdout).checks
    assert c.status == "FAIL" and "did not finish within 1 s" in c.summary
    assert not psutil.pid_exists(int(pid_file.read_text()))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_kills_the_checks_children_and_still_writes_the_report(tmp_path, sig):
    root = fakes.install_plugin(tmp_path)
    fakes.write_profile(root / "profiles", "hangs", ["hanging", "passing"], "[timeouts]\nhanging = 300\n")
    pid_file, report = tmp_path / "sleeper.pid", tmp_path / "report.json"
    env = {**fakes.plugin_env(root), "FAKE_PID_FILE": str(pid_file)}
    proc = subprocess.Popen([*fakes.PREFLIGHT, "run", "--profile", "hangs", "--report", str(report)], env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 128 + sig
    rep = Report.model_validate_json(report.read_text())
    assert rep.interrupted_by_signal == sig and rep.exit_code == 128 + sig
    assert [c.status for c in rep.checks] == ["ERROR", "SKIP"] and rep.checks[0].duration_seconds > 0
    assert not psutil.pid_exists(int(pid_file.read_text()))


def test_a_crash_mid_run_leaves_the_previous_report_intact(tmp_path):
    root = fakes.install_plugin(tmp_path)
    fakes.write_profile(root / "profiles", "ok", ["passing"])
    fakes.write_profile(root / "profiles", "crash", ["passing", "crashing"])
    out = tmp_path / "out"
    out.mkdir()
    report = out / "report.json"
    env = fakes.plugin_env(root)
    assert run_preflight(["run", "--profile", "ok", "--report", str(report)], env=env).returncode == 0
    before = report.read_text()
    p = run_preflight(["run", "--profile", "crash", "--report", str(report)], env=env)
    assert p.returncode == -signal.SIGKILL
    # The report is untouched, and beside it the record of the run that died: the pass no longer vouches.
    assert report.read_text() == before and sorted(os.listdir(out)) == ["history.db", "report.json", "report.json.started", "trends.json"]  # the first run's history
    st = run_preflight(["status", "--report", str(report)])
    assert st.returncode == 1 and st.stdout.startswith("NOT vouched: a run started at ") and "did not finish" in st.stdout


def test_a_second_run_waits_for_the_lock_then_exits_2(tmp_path):
    root = fakes.install_plugin(tmp_path)
    fakes.write_profile(root / "profiles", "slow", ["slow"])
    env = {**fakes.plugin_env(root), "FAKE_SLOW_SECONDS": "20"}
    first = subprocess.Popen([*fakes.PREFLIGHT, "run", "--profile", "slow", "-q"], env=env)
    try:
        time.sleep(1.5)  # let the first one take the lock
        report = tmp_path / "second.json"
        p = run_preflight(["run", "--profile", "slow", "--lock-timeout", "0.5", "--report", str(report)], env=env)
        assert p.returncode == 2
        assert f"another preflight run (pid {first.pid}) holds" in p.stderr and "--lock-timeout" in p.stderr
        assert not report.exists()
    finally:
        first.kill()
        first.wait()


HELP_IMPORTS = (
    "import sys\n"
    "sys.argv = ['preflight', *sys.argv[1:]]\n"
    "from preflight.cli.app import main\n"
    "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
    "print('torch' in sys.modules, code, file=sys.stderr)\n"
)


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["run", "--profile", "cpu"], ["list"]])
def test_the_cli_never_imports_torch(args):
    p = subprocess.run([sys.executable, "-c", HELP_IMPORTS, *args], capture_output=True, text=True, timeout=60)
    assert p.stderr.splitlines()[-1] == "False 0", p.stderr


# --- help ---------------------------------------------------------------------

def _every_command():
    from typer.main import get_command

    group = get_command(app)
    return [(group, [])] + [(cmd, [name]) for name, cmd in sorted(group.commands.items())]


def _flat(text: str) -> str:
    return " ".join(text.split())  # help is wrapped to the terminal: compare words, not lines


@pytest.mark.parametrize("cmd, args", _every_command(), ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_help_keeps_every_bracketed_word_and_shows_no_python_type(cmd, args):
    r = invoke(*args, "--help")
    assert r.exit_code == 0, r.output
    shown = _flat(r.stdout)
    written = [cmd.help or "", cmd.short_help or ""] + [p.help or "" for p in cmd.params if not getattr(p, "hidden", False)]
    brackets = [b for text in written for b in re.findall(r"\[[^\]]*\]", text)]
    for b in brackets:
        assert _flat(b) in shown, f"{b} is missing from `preflight {' '.join(args)} --help`"
    assert not re.search(r"<(?:bool|str|int|float|path)>|list\[", r.stdout), r.stdout
    for p in cmd.params:  # a value is named for what it is (FILE, SECONDS), a flag takes none
        if not getattr(p, "hidden", False) and not getattr(p, "is_flag", False) and p.name != "help":
            assert p.metavar and p.metavar.upper() == p.metavar, f"{p.opts} has no metavar"
            assert re.search(rf"(?:{'|'.join(map(re.escape, p.opts))}) {re.escape(p.metavar)}\b|^  {re.escape(p.metavar)} ", r.stdout, re.M)


def test_the_bracketed_words_that_were_lost_are_there():
    assert "Site floors file to write: [floors] tables" in _flat(invoke("calibrate", "--help").stdout)
    run = _flat(invoke("run", "--help").stdout)
    assert "the profile's [nccl] ranks without GPUs]" in run and "[default: $PREFLIGHT_CONFIG, else /etc/preflight/config.toml if present]" in run
    assert "--only CHECK" in run and "--lock-timeout SECONDS" in run and "--json Print JSON" in run


def test_profile_help_lists_the_installed_profiles_site_ones_too(tmp_path):
    site = tmp_path / "profiles"
    site.mkdir()
    (site / "b200-site.toml").write_text("not parsed for --help\n")
    builtin = sorted(p.stem for p in (Path(__file__).parents[2] / "preflight" / "pipeline" / "profiles").glob("*.toml"))
    r = run_preflight(["run", "--help"], env={**clean_env(), "PREFLIGHT_PROFILES_DIR": str(site)})
    assert r.returncode == 0
    assert f"-p, --profile NAME Profile: auto (pick by GPU model), or one of: {', '.join(sorted([*builtin, 'b200-site']))}. [default: auto]" in _flat(r.stdout)


# --- a reader of stdout that goes away ---------------------------------------------

@pytest.mark.parametrize("args", [["version"], ["list"], ["show-profile", "cpu"]])
def test_a_closed_stdout_ends_quietly_as_sigpipe_would(args):
    proc = subprocess.Popen([*fakes.PREFLIGHT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    proc.stdout.close()  # the reader is gone before the first write: `preflight version | head -0`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


@pytest.mark.parametrize("args", [["version"], ["list"], ["status", "--npd"]])
def test_a_stdout_closed_before_start_does_not_turn_into_an_internal_error(args):
    # `preflight ... >&-`: Python sets sys.stdout to None; the command's verdict stands.
    cmd = f"{' '.join(fakes.PREFLIGHT)} {' '.join(args)} >&-"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60, env=clean_env())
    assert "internal error" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.returncode in (0, 2 if args[0] == "status" else 0), (p.returncode, p.stderr)


def test_version_into_head_prints_its_first_line_and_nothing_else():
    cmd = f"{' '.join(fakes.PREFLIGHT)} version | head -1"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("preflight ") and p.stdout.count("\n") == 1 and p.stderr == ""


# --- the other commands ------------------------------------------------------

def test_list_names_every_check_and_what_it_verifies():
    r = invoke("list")
    assert r.exit_code == 0 and r.stdout.startswith("cuda       driver and NVML health of every GPU")
    assert "\ntopology   GPU/NIC/CPU layout" in r.stdout and "\nshm        /dev/shm is a tmpfs" in r.stdout  # cheapest first, names aligned
    assert "\nnccl       torchrun on every GPU" in r.stdout and "\nbandwidth  HBM, host<->device" in r.stdout
    assert "\ntrain " in r.stdout and r.stdout.rstrip().endswith("(after cuda)")  # memtest, the last, needs cuda only
    rows = json.loads(invoke("list", "--json").stdout)
    assert [row["name"] for row in rows] == ["cuda", "topology", "pcie", "rdma", "fabric", "firmware", "shm", "nccl", "bandwidth", "train", "burnin", "memtest"] and rows[0]["timeout_seconds"] > 0


def test_list_in_a_profiles_order(plugin):
    fakes.write_profile(plugin / "profiles", "fakes", ["warning", "passing"])
    r = invoke("list", "--profile", "fakes")
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["warning", "passing"]


def test_show_profile_says_where_each_floor_came_from(tmp_path):
    r = invoke("show-profile", "cpu")
    assert r.exit_code == 0
    assert "shm_min_bytes: at least 1073741824 bytes (1 GiB)" in r.stdout
    assert "value from: profile" in r.stdout and "source: NGC" in r.stdout
    cfg = tmp_path / "site.toml"
    cfg.write_text("[floors]\nshm_min_bytes = 8589934592\n")
    r = invoke("show-profile", "cpu", "--config", str(cfg))
    assert "at least 8589934592 bytes (8 GiB)" in r.stdout and f"value from: config {cfg} line 2" in r.stdout
    data = json.loads(invoke("show-profile", "cpu", "--json").stdout)
    assert data["floors"]["shm_min_bytes"]["value"] == 2**30


def test_show_profile_of_an_unknown_name():
    r = invoke("show-profile", "h900")
    assert r.exit_code == 2 and "unknown profile 'h900'" in r.stderr


@no_driver
@pytest.mark.parametrize("args", [["show-profile", "auto"], ["list", "--profile", "auto"]])
def test_auto_without_a_driver_elsewhere_in_the_cli(args):
    r = invoke(*args)
    assert r.exit_code == 1 and "no NVIDIA driver" in r.stderr and "Traceback" not in r.stderr


@no_driver
def test_show_profile_without_a_name_or_a_driver_asks_for_a_name_and_lists_them():
    r = invoke("show-profile")
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert "no profile named, and `auto` has no GPU to pick by here (no NVIDIA driver" in r.stderr
    assert "name one: preflight show-profile NAME, with NAME one of a100-pcie, a100-sxm4-80gb, cpu, gb10, generic, h100-nvl" in r.stderr


def test_show_profile_without_a_name_still_picks_by_gpu_where_nvml_answers(monkeypatch):
    monkeypatch.setenv("PREFLIGHT_NVML_FAKE", str(NVML_FIXTURES / "h100-sxm-8x-healthy.json"))
    r = invoke("show-profile")
    assert r.exit_code == 0 and r.stdout.startswith("profile h100-sxm (auto: 8 x NVIDIA H100 80GB HBM3 matched")
    monkeypatch.setenv("PREFLIGHT_NVML_FAKE", str(NVML_FIXTURES / "h100-mixed-skus.json"))
    r = invoke("show-profile")  # NVML answered, and nothing fits: that is the answer, not a question
    assert r.exit_code == 1 and "mixed GPU models on one node" in r.stderr


def test_a_profile_listing_a_check_that_is_not_installed_is_refused(plugin):
    fakes.write_profile(plugin / "profiles", "typo", ["passing", "nccll"])
    r = invoke("run", "--profile", "typo")
    assert r.exit_code == 2 and "lists check nccll: no such check" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["list", "--config", "/nonexistent.toml"], "config file /nonexistent.toml does not exist"),
        (["run", "--profile", "cpu", "--lock-timeout", "inf"], "--lock-timeout: Input should be a finite number"),
        (["run", "--profile", "cpu", "--only", ""], "--only: Value error, names no check"),
        (["run", "--profile", "cpu", "--report", "/dev/null"], "report /dev/null: is not a regular file"),
    ],
)
def test_more_bad_input(args, message):
    r = invoke(*args)
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1


def test_version():
    r = invoke("version")
    assert r.exit_code == 0 and r.stdout.startswith("preflight ") and "python 3." in r.stdout


# --- auto, through a fake NVML -------------------------------------------------

NVML_FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvml"


def test_auto_picks_a_site_profile_by_gpu_model(plugin, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML_FIXTURES / "h100-sxm-8x-healthy.json"))
    fakes.write_profile(plugin / "profiles", "fake-h100", ["passing"], 'match = ["H100 80GB HBM3 "]\n')
    fakes.write_profile(plugin / "profiles", "h100-sxm", ["passing"], 'match = ["NVIDIA H100 80GB HBM3"]\n')
    r = invoke("run", "--json")
    assert r.exit_code == 0, r.stderr
    rep = Report.model_validate_json(r.stdout)
    assert rep.profile == "h100-sxm"  # a site profile replaces the built-in of the same name
    assert rep.profile_chosen_because == "auto: 8 x NVIDIA H100 80GB HBM3 matched profile h100-sxm by name 'NVIDIA H100 80GB HBM3'"


def test_auto_with_every_gpu_lost_fails_with_a_remedy_for_a_broken_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_FACTS", str(NVML_FIXTURES / "all-lost.json"))
    r = invoke("run", "--json")
    assert r.exit_code == 1
    (c,) = Report.model_validate_json(r.stdout).checks
    assert c.check == "profile" and "cannot reach any" in c.cause and "GPU is lost" in c.cause
    assert "reset the GPU" in c.remedy and "--profile cpu" not in c.remedy


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tiny tmpfs")
def test_a_report_that_cannot_be_written_keeps_the_verdict_and_the_old_report(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("previous\n")
    # A full 4 KiB tmpfs: the writability probe (an empty file) passes, the write itself fails.
    setup = f"mount -t tmpfs -o size=4k tmpfs {out} && echo previous > {out}/report.json && head -c 4096 /dev/zero > {out}/filler"
    # shm alone: a verdict no load can turn (beside CPU hogs the train probe may name a straggler WARN).
    cmd = f"{setup}; {' '.join(fakes.PREFLIGHT)} run --profile cpu --only shm --report {out}/report.json; echo rc=$?; cat {out}/report.json; ls -A {out}"
    p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert "could not write the report to" in p.stderr and "No space left on device" in p.stderr
    assert "Traceback" not in p.stderr
    # Every check passed, but a run whose report is not written vouches for nothing: never "PASS ... exit 3".
    assert "preflight: ERROR (profile cpu; 1 pass)" in p.stderr and "exit 3" in p.stderr and "preflight: PASS" not in p.stderr
    assert p.stdout.splitlines() == ["rc=3", "previous", "filler", "report.json"]


def test_the_installed_console_script_works():
    script = os.path.join(os.path.dirname(sys.executable), "preflight")
    # shm only: the script is what is tested, and a figure compared on a loaded machine could WARN.
    p = subprocess.run([script, "run", "--profile", "cpu", "--only", "shm", "-q"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stderr.startswith("preflight: PASS")
    assert "  ... " not in p.stderr  # -q in a log: no progress at all


def test_a_closed_stderr_or_a_reader_that_left_does_not_change_the_verdict(tmp_path):
    report = tmp_path / "r.json"
    cmd = f"{' '.join(fakes.PREFLIGHT)} run --profile cpu --report {report} 2>&-; echo rc=$?"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "rc=0" and Report.model_validate_json(report.read_text()).verdict == "pass"
    cmd = f"{' '.join(fakes.PREFLIGHT)} run --profile cpu --json 2>/dev/null | head -c1 >/dev/null; echo rc=${{PIPESTATUS[0]}}"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "rc=0", p.stderr


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (/proc/PID/status SigCgt)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def test_sigterm_while_nvml_hangs_leaves_no_child_and_says_so(tmp_path):
    env = {
        **clean_env(),
        "PYTHONPATH": str(fakes.install_fake_pynvml(tmp_path / "nvml")),
        "FAKE_NVML": "hang",
        "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock"),
    }
    proc = subprocess.Popen([*fakes.PREFLIGHT, "run"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not psutil.Process(proc.pid).children(recursive=True):
        time.sleep(0.05)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the NVML query never started"
    # NVML's child starts first, before the agent imports the rest of itself: the signal is sent once
    # the run handles it (its SIGTERM handler in place), as a stop would come while NVML hangs.
    while time.monotonic() < deadline and not catches_sigterm(proc.pid):
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    assert "interrupted by signal 15 before any check ran" in proc.stderr.read()
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children)


# --- detect and xid -------------------------------------------------------------

XID_FIXTURES = Path(__file__).parents[1] / "fixtures" / "xid"


def test_detect_prints_the_gpus_and_the_profile_it_picks_and_why():
    r = invoke("detect", "--nvml-fake", str(NVML_FIXTURES / "h100-sxm-8x-healthy.json"))
    assert r.exit_code == 0, r.output
    assert "driver 550.54.15, CUDA 12.4 (from fake " in r.stdout
    assert "GPU 7  NVIDIA H100 80GB HBM3  0000:df:00.0  device 0x2330  80 GiB" in r.stdout
    assert "profile: h100-sxm (auto: 8 x NVIDIA H100 80GB HBM3 matched profile h100-sxm by name" in r.stdout
    # The shape, and how each part was learnt: this machine's bus has no NVIDIA GPU, so the count is NVML's (the fake's).
    assert "node: 8 GPUs joined by NVSwitch, " in r.stdout
    assert "  links: joined by NVSwitch (NVML: active NVLinks end at an NVSwitch)" in r.stdout
    data = json.loads(invoke("detect", "--json", "--nvml-fake", str(NVML_FIXTURES / "h100-sxm-8x-healthy.json")).stdout)
    assert data["profile"] == "h100-sxm" and len(data["gpus"]) == 8
    assert (data["shape"]["gpus"], data["shape"]["fabric"]) == (8, "nvswitch") and data["shape"]["gpus_from"].startswith("NVML")


def test_detect_names_what_it_cannot_pick():
    r = invoke("detect", "--nvml-fake", str(NVML_FIXTURES / "h100-mixed-skus.json"))
    assert r.exit_code == 1
    assert "profile: none (mixed GPU models on one node: NVIDIA H100 80GB HBM3 (0x2330), NVIDIA H100 PCIe (0x2331)" in r.stdout


@no_driver
def test_detect_without_a_driver_says_so():
    r = invoke("detect")
    assert r.exit_code == 1 and "no NVIDIA driver" in r.stderr


@no_driver
def test_detect_json_without_a_driver_is_still_json_with_the_error_in_it():
    r = invoke("detect", "--json")
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "no NVIDIA driver" in r.stderr
    data = json.loads(r.stdout)
    assert data["gpus"] == [] and data["lost"] == [] and data["driver_version"] is None and data["profile"] is None
    assert data["cause"].startswith("no NVIDIA driver") and "install or load the NVIDIA driver" in data["fix"]
    assert data["error"] == f"{data['cause']}; {data['fix']}" == data["why"]


@pytest.mark.parametrize("fake, code, error", [
    ("h100-sxm-8x-healthy.json", 0, None),
    ("all-lost.json", 1, "NVML counts 3 GPU(s) but cannot reach any"),
    ("h100-mixed-skus.json", 1, "mixed GPU models on one node"),
    ("nonexistent.json", 2, "cannot read it (No such file or directory)"),
])
def test_detect_json_always_has_the_same_keys_and_error_says_why_it_exits_non_zero(fake, code, error):
    r = invoke("detect", "--json", "--nvml-fake", str(NVML_FIXTURES / fake))
    assert r.exit_code == code
    data = json.loads(r.stdout)
    assert {"driver_version", "gpus", "lost", "profile", "why", "shape", "error", "cause", "fix"} <= set(data)
    if error is None:
        assert (data["error"], data["cause"], data["fix"]) == (None, None, None) and data["profile"] == "h100-sxm"
    else:
        assert error in data["error"]
    if code == 2:  # bad input is still said on stderr, in one line
        assert r.stderr.count("\n") == 1 and error in r.stderr


def test_detect_with_a_malformed_fake_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"driver_version": 550, "gpus": []}')
    r = invoke("detect", "--nvml-fake", str(bad))
    assert r.exit_code == 2 and "field driver_version: Input should be a valid string" in r.stderr


XID_EXPECTED = {
    # file prefix -> every event, in order, as kind+code:severity (the line's own words count)
    "01_": ["xid63:fatal"],
    "03_": ["xid79:fatal"],
    "05_": ["xid13:app", "xid13:app", "xid13:app", "xid109:fatal"],
    "15_": ["init_failed:fatal", "xid48:fatal", "xid64:fatal"],
    "dmesg-caller-tag": ["xid31:app", "xid154:fatal"],
    "dmesg-x-iso": ["xid79:fatal", "fell_off_bus:fatal"],
    "fell-off-bus": ["fell_off_bus:fatal", "fell_off_bus:fatal"],
    "garbage": [],
    "journalctl-localized": ["xid48:fatal", "xid145:app", "xid144:fatal"],
    "journalctl-short-iso": ["xid94:app", "xid31:app"],
    "journalctl-short-monotonic": ["xid119:fatal", "xid74:fatal"],
    "kmsg": ["xid79:fatal", "fell_off_bus:fatal", "xid154:fatal", "sxid24007:fatal"],
    "nvswitch-multiline": ["sxid12028:app"],
    "sxid_": ["sxid24007:fatal", "sxid20009:app", "sxid28006:app", "sxid26006:app"],
    "syslog_old-driver": ["fell_off_bus:fatal", "xid3:app"],
    "no-gpu-event_": [],  # real kernel logs: a clean one still exits 0
}


@pytest.mark.parametrize("path", sorted(XID_FIXTURES.glob("*.txt")), ids=lambda p: p.name[:12])
def test_xid_from_a_saved_log_explains_every_event(path):
    (expected,) = [v for k, v in XID_EXPECTED.items() if path.name.startswith(k)]
    r = invoke("xid", "--from", str(path), "--json")
    data = json.loads(r.stdout)
    assert data["source"] == str(path)
    assert [f"{e['kind']}{e['code'] or ''}:{e['severity']}" for e in data["events"]] == expected
    assert all(e["meaning"] and e["action"] for e in data["events"])
    assert r.exit_code == (1 if any(x.endswith(":fatal") for x in expected) else 0)


def test_xid_table_for_a_person():
    r = invoke("xid", "--from", str(XID_FIXTURES / "15_syslog-kernel-prefix_xid48-DBE-physAddr-partition_xid64-page-retirement-blacklisting-failed_RmInitAdapter-failed_gpu-operator-1146.txt"))
    assert r.exit_code == 1  # fatal events listed
    assert "FATAL  Xid 48" in r.stdout and "0000:07:00" in r.stdout and "Dec  2 11:38:47" in r.stdout
    assert "action: " in r.stdout


def test_xid_on_this_machine_reads_the_kernel_log():
    r = invoke("xid", "--json")
    if r.stdout:
        data = json.loads(r.stdout)
        assert data["source"] and r.exit_code == (1 if any(e["severity"] == "fatal" for e in data["events"]) else 0)
    else:  # a container without /dev/kmsg, journal or dmesg access: said in one line, exit 1
        assert r.exit_code == 1 and "cannot read the kernel log" in r.stderr


def test_xid_from_a_missing_file_is_a_usage_error(tmp_path):
    r = invoke("xid", "--from", str(tmp_path / "nope.log"))
    assert r.exit_code == 2 and "nope.log" in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("name, content", [
    ("pyproject.toml", None),  # the wrong file (README.md is a document: tests/cli/test_bad_input.py)
    ("empty.log", ""),
    ("journal.txt", "-- No entries --\n"),  # journalctl -k that could read nothing
    ("nccl.log", (Path(__file__).parents[1] / "fixtures" / "nccl" / "E14_nccl2.29.2_P2P+SHM-disabled_NET-Socket-0-Shared_ncclSocketInit-family1-internal-error.log").read_text()),
    ("auth.log", "Dec  2 11:38:47 worker4 sshd[812]: Accepted publickey for root from 10.0.0.1 port 50022\n"),
])
def test_xid_from_a_file_with_no_kernel_log_line_is_refused(tmp_path, name, content):
    path = Path(__file__).parents[2] / name if content is None else tmp_path / name
    if content is not None:
        path.write_text(content)
    r = invoke("xid", "--from", str(path), "--json")
    assert r.exit_code == 2 and r.stdout == "" and r.stderr.count("\n") == 1
    assert f"--from {path}: " in r.stderr and "holds no kernel log lines" in r.stderr


def test_xid_from_this_machines_own_dmesg(tmp_path):
    done = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0 or not done.stdout.strip():
        pytest.skip(f"dmesg cannot be read here: {done.stderr.strip()}")
    (tmp_path / "dmesg.txt").write_text(done.stdout)
    r = invoke("xid", "--from", str(tmp_path / "dmesg.txt"), "--json")
    assert r.exit_code in (0, 1) and json.loads(r.stdout)["source"] == str(tmp_path / "dmesg.txt")


def test_a_cr_a_user_put_in_a_kernel_message_forges_no_xid(tmp_path):
    # `mount -o "$(printf "y\rNVRM: Xid ...")"` in a user namespace, as `dmesg` prints it: a healthy node.
    cap = tmp_path / "cap.log"
    cap.write_bytes(b"[ 1234.567890] tmpfs: Unknown parameter 'y\rNVRM: Xid (PCI:0000:5d:00): 48, pid=0, DBE (0x1)'\n"
                    b"[ 1234.600000] EXT4-fs (vda1): mounted filesystem\n")
    r = invoke("xid", "--from", str(cap), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["events"] == []
    r = invoke("explain", str(cap))
    assert r.exit_code == 0 and "Xid 48" not in r.output, r.output


# --- topology ----------------------------------------------------------------

TOPO = Path(__file__).parents[1] / "fixtures" / "topo"
SPLIT = TOPO / "03_h100-sxm-8x_nv18_12nic_2numa_no-leading-tab-header.txt"
HEALTHY_NVML = Path(__file__).parents[1] / "fixtures" / "nvml" / "h100-sxm-8x-healthy.json"


@pytest.mark.parametrize("name", sorted(p.name for p in TOPO.glob("*.txt")))
def test_topology_from_each_capture_gives_its_index_facts_as_json(name):
    from conftest import assert_index_facts

    r = invoke("topology", "--from", str(TOPO / name), "--json")
    assert r.exit_code == 0, r.output
    assert_index_facts(json.loads(r.stdout), name)


def test_topology_from_a_4_4_split_capture_gives_the_numa_finding_and_the_pinning_advice():
    r = invoke("topology", "--from", str(SPLIT))
    assert r.exit_code == 0, r.output
    assert "[NUMA node 0  CPUs 0-55,112-167]\n  GPU0 -- mlx5_0   GPU1 -- mlx5_1   GPU2 -- mlx5_2   GPU3 -- mlx5_3" in r.stdout
    assert "NV18: all 28 GPU pairs" in r.stdout
    assert "WARN  GPUs span 2 NUMA nodes (node 0: GPU 0-3; node 1: GPU 4-7)" in r.stdout
    assert "local rank 4 -> GPU4  NUMA 1  CPUs 56-111,168-223  NIC mlx5_6 (PIX)" in r.stdout
    assert "$ torchrun --numa-binding=node --nproc-per-node=8 train.py" in r.stdout
    assert "exec numactl --cpunodebind=$n --membind=$n python train.py" in r.stdout
    data = json.loads(invoke("topology", "--from", str(SPLIT), "--json").stdout)
    assert data["spans_numa"] is True and data["numa_nodes"] == [0, 1] and data["profile"] is None
    assert [(f["part"], f["status"]) for f in data["findings"]] == [("numa", "WARN")]
    assert data["advice"]["ranks"][0]["numactl"] == "numactl --cpunodebind=0 --membind=0"


def test_topology_against_a_profile_fails_what_the_sku_does_not_allow():
    ok = invoke("topology", "--from", str(SPLIT), "--profile", "h100-sxm")
    assert ok.exit_code == 0 and "findings against profile h100-sxm" in ok.stdout
    r = invoke("topology", "--from", str(TOPO / "18_rtx3090-2x_nv4-bridge_single-numa_gpu-numa-id.txt"), "--profile", "h100-sxm", "--json")
    assert r.exit_code == 1
    found = {f["summary"] for f in json.loads(r.stdout)["findings"]}
    assert found == {"NVLink below NV18 between 1 GPU pair(s)", "no NIC in the GPU topology"}


@pytest.mark.parametrize("content, message", [
    (b"", "line"),  # replaced below: the parser's words for an empty file
    (b"\x7fELF\x02\x01\x01\x00\x00\x00garbage", "is not text"),
    (b"# preflight\n\nDecide, in seconds, whether this GPU node will run a job.\n", "no header line starting with GPU0"),
])
def test_topology_from_a_file_that_is_no_matrix_is_exit_2_in_one_line(tmp_path, content, message):
    path = tmp_path / "capture.txt"
    path.write_bytes(content)
    r = invoke("topology", "--from", str(path))
    expected = "the text is empty" if not content else message
    assert r.exit_code == 2 and expected in r.stderr and str(path) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_topology_refuses_damaged_huge_and_odd_files(tmp_path):
    r = invoke("topology", "--from", str(TOPO / "malformed" / "M1_h100-8x_nv18_12nic_PASTE-CORRUPTED-PIXNODE.txt"))
    assert r.exit_code == 2 and "line 7: row GPU5, column NIC7: 'PIXNODE' is not a link type" in r.stderr
    big = tmp_path / "huge.txt"
    with big.open("wb") as f:
        f.truncate(300 * 2**20)  # sparse: hundreds of MB without the disk
    started = time.monotonic()
    r = invoke("topology", "--from", str(big))
    assert r.exit_code == 2 and "larger than 1 MiB" in r.stderr and time.monotonic() - started < 5
    for odd, words in ((tmp_path, "is a directory"), (tmp_path / "missing.txt", "no such file"), (Path("/dev/zero"), "not a regular file")):
        r = invoke("topology", "--from", str(odd))
        assert r.exit_code == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = invoke("topology", "--from", str(SPLIT), "--profile", "no-such-sku")
    assert r.exit_code == 2 and "unknown profile 'no-such-sku'" in r.stderr


def test_topology_rows_and_header_that_disagree_are_refused(tmp_path):
    lines = SPLIT.read_text().splitlines()
    del lines[3]  # GPU2's row
    path = tmp_path / "capture.txt"
    path.write_text("\n".join(lines) + "\n")
    r = invoke("topology", "--from", str(path))
    assert r.exit_code == 2 and "line 4: row 'GPU3' where the header says GPU2 comes next" in r.stderr


@no_driver
def test_topology_on_a_machine_without_gpus_says_to_use_a_capture(tmp_path, monkeypatch):
    r = invoke("topology")
    assert r.exit_code == 1 and "no NVIDIA driver" in r.stderr and "--from FILE" in r.stderr
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi: the layout comes from NVML and sysfs, and it says so
    r = invoke("topology", "--nvml-fake", str(HEALTHY_NVML))
    assert r.exit_code == 1 and "8 GPU(s), 0 NIC(s) from NVML and sysfs" in r.stdout  # 1: the fake facts fail closed
    assert "nvidia-smi topo -m: nvidia-smi is not on PATH" in r.stdout and "(read from NVML and sysfs instead)" in r.stdout


def test_topology_live_judges_this_machines_real_cpus(tmp_path, monkeypatch):
    """The matrix of an 8-GPU node, with this 2-CPU machine's real cpuset: starved."""
    monkeypatch.setenv("PATH", f"{fakes.nvidia_smi(tmp_path / 'bin', SPLIT)}:{os.environ['PATH']}")
    r = invoke("topology", "--nvml-fake", str(HEALTHY_NVML), "--profile", "h100-sxm", "--json")
    data = json.loads(r.stdout)
    usable = len(os.sched_getaffinity(0))
    starved = [f for f in data["findings"] if f["part"] == "cpus" and f["status"] == "FAIL"]
    assert r.exit_code == 1 and starved[0]["summary"] == f"{usable / 8:.1f} vCPUs per GPU, 11 needed"
    assert data["machine"]["cpus"]["allowed"] and len(data["machine"]["gpus"]) == 8
    assert {"part": "source", "status": "FAIL"}.items() <= next(f for f in data["findings"] if f["part"] == "source").items()
    config = tmp_path / "config.toml"
    config.write_text("[floors]\nvcpus_per_gpu = 24  # DGX-class hosts here\n")
    r = invoke("topology", "--nvml-fake", str(HEALTHY_NVML), "--profile", "h100-sxm", "--config", str(config), "--json")
    assert f"{usable / 8:.1f} vCPUs per GPU, 24 needed" in {f["summary"] for f in json.loads(r.stdout)["findings"]}


@needs_root
def test_run_topology_in_a_container_cpuset_on_the_recorded_node(tmp_path):
    """`preflight run` for real: the recorded HGX sysfs bind-mounted over /sys in
    a private mount namespace, the 4+4 capture from nvidia-smi, one CPU by taskset."""
    tree = Path(__file__).parents[1] / "fixtures" / "sysfs" / "hgx-h100" / "sys"
    bin_dir = fakes.nvidia_smi(tmp_path / "bin", SPLIT)
    report = tmp_path / "report.json"
    cmd = (f"mount --bind {tree} /sys && exec taskset -c 0 {' '.join(fakes.PREFLIGHT)} run --profile h100-sxm --only topology "
           f"--nvml-fake {HEALTHY_NVML} --report {report}")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    result = Report.model_validate_json(report.read_text()).checks[0]
    assert result.details["parts"] == {"matrix": "PASS", "nvlink": "PASS", "numa": "PASS", "nics": "PASS",
                                       "cpus": "FAIL", "pcie": "PASS", "agreement": "PASS", "source": "FAIL"}
    assert "224 CPUs online; this process's cpuset allows 1 (0)" in result.cause
    assert result.details["advice"]["ranks"][7]["cpus"] is None  # CPU 0 is on node 0: nothing to give GPU 7's rank


# --- calibrate -------------------------------------------------------------------


# A real calibration (several runs, then runs against its floors) is in test_calibrate.py.


@pytest.mark.parametrize(
    "args, words",
    [
        (["--fraction", "1.5"], "--fraction 1.5: give a number in (0, 1]"),
        (["--output", "EXISTING"], "already exists; pass --force to replace it"),
        (["--profile", "gb10"], "profile gb10 runs none of bandwidth, train"),
    ],
)
def test_calibrate_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, words):
    existing = tmp_path / "floors.toml"
    existing.write_text("# the site's floors\n")
    args = [str(existing) if a == "EXISTING" else a for a in args]
    if "--output" not in args:
        args = ["--output", str(tmp_path / "new.toml"), *args]
    r = invoke("calibrate", *args)
    assert r.exit_code == 2, r.output
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert existing.read_text() == "# the site's floors\n" and not (tmp_path / "new.toml").exists()


NVML_FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvml"


def test_if_idle_leaves_the_last_report_while_a_job_holds_a_gpu(tmp_path):
    report = tmp_path / "report.json"
    report.write_text("the last verdict\n")
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    p = run_preflight(["run", "--if-idle", "--profile", "h100-sxm", "--nvml-fake", str(NVML_FIXTURES / "h100-sxm-8x-busy.json"),
                       "--report", str(report), "--textfile-dir", str(textfile)])
    assert p.returncode == 0, p.stderr
    assert "not run: a job holds GPU 3 (pid 48213); GPU 5 (pid 48215); the last report stands" in p.stderr
    assert report.read_text() == "the last verdict\n" and list(textfile.iterdir()) == []  # nothing touched
    assert "[PASS]" not in p.stderr and "[FAIL]" not in p.stderr


def test_if_idle_runs_when_the_gpus_are_free(tmp_path):
    report = tmp_path / "report.json"
    p = run_preflight(["run", "--if-idle", "--profile", "h100-sxm", "--only", "shm", "--nvml-fake", str(NVML_FIXTURES / "h100-sxm-8x-idle.json"),
                       "--report", str(report)])
    assert "not run" not in p.stderr and Report.model_validate_json(report.read_text()).checks[0].check == "shm"


@no_driver
def test_if_idle_without_a_driver_runs_and_names_the_fault(tmp_path):
    # NVML not answering is not "busy": the run goes ahead, so a broken node is reported, not skipped.
    p = run_preflight(["run", "--if-idle", "--profile", "cpu", "--only", "shm"])
    assert p.returncode == 0 and "not run" not in p.stderr and "[PASS] shm" in p.stderr


def test_scratch_leaves_the_configured_report_and_textfile_alone(tmp_path):
    # pairwise runs each side with --scratch: a pair's verdict must not become the node's gate report.
    (tmp_path / "prom").mkdir()
    config = tmp_path / "config.toml"
    config.write_text(f'report = "{tmp_path / "report.json"}"\ntextfile_dir = "{tmp_path / "prom"}"\n')
    r = run_preflight(["run", "--profile", "cpu", "--only", "shm", "--config", str(config), "--scratch", "--json", "--lock-file", str(tmp_path / "l")],
                      env=clean_env(report=False))  # the config's report, which PREFLIGHT_REPORT would replace
    assert r.returncode == 0 and json.loads(r.stdout)["checks"][0]["check"] == "shm"
    assert not (tmp_path / "report.json").exists() and list((tmp_path / "prom").iterdir()) == []
    both = run_preflight(["run", "--profile", "cpu", "--scratch", "--report", str(tmp_path / "r.json")])
    assert both.returncode == 2 and "--scratch writes no report" in both.stderr


def test_a_group_run_leaves_the_gates_configured_report_and_textfile_alone(tmp_path):
    # The node's gate report is what the prolog and the health check read; a whole
    # group fails with one bad node, so a group run writes only what it is told to.
    (tmp_path / "prom").mkdir()
    gate = tmp_path / "gate.json"
    gate.write_text('{"the gate": "untouched"}')
    config = tmp_path / "config.toml"
    config.write_text(f'report = "{gate}"\ntextfile_dir = "{tmp_path / "prom"}"\n')
    nobody = free_port()  # node rank 0's meeting point that nobody serves: this node fails fast
    group = ["run", "--profile", "cpu", "--only", "shm,nccl", "--lock-file", str(tmp_path / "l"),
             "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{nobody}", "--rdzv-timeout", "5"]
    from_config = run_preflight([*group, "--config", str(config)], env=clean_env(report=False))  # the config's report, not PREFLIGHT_REPORT
    assert from_config.returncode == 1
    assert f"does not write the node's own report {gate} or textfile dir {tmp_path / 'prom'} (from config or environment)" in from_config.stderr
    from_env = run_preflight([*group, "--report", str(tmp_path / "group.json")],
                             env={**clean_env(), "PREFLIGHT_REPORT": str(gate), "PREFLIGHT_TEXTFILE_DIR": str(tmp_path / "prom")})
    assert from_env.returncode == 1 and f"does not write the node's own textfile dir {tmp_path / 'prom'}" in from_env.stderr
    assert gate.read_text() == '{"the gate": "untouched"}' and list((tmp_path / "prom").iterdir()) == []
    record = json.loads((tmp_path / "group.json").read_text())["group"]  # what the command line names is written
    assert record["nnodes"] == 2 and not record["passed"] and record["missing"] == [0]  # not itself
