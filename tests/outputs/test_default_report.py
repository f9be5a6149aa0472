"""The report where the user will look: `preflight run` with no --report writes the
default (report_paths.default_report_path: root's /var/lib/preflight/report.json,
anyone else's under $XDG_STATE_HOME or ~/.local/state), and `status`, `report`,
`history` and `serve` read it with no path given. Its directory is made where
missing, never through a link another user planted (outputs/gate.default_report);
where it cannot be written (or lies on a network filesystem) the run says so in one line and
writes no report, its verdict unchanged; it never replaces a report of another profile.

conftest's `_isolated` points PREFLIGHT_REPORT at a folder of the test's own, so no
other test writes the real default; the tests here take it away to reach the default
itself: in this process (root's default moved into the test's folder, XDG_STATE_HOME
there for anyone else), and as root for real, in a mount namespace of its own with a
tmpfs over /var/lib."""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env, needs_root
from typer.testing import CliRunner

import fakes
from preflight.base import pathtrust, safefile
from preflight.base.errors import UsageError
from preflight.cli.app import app
from preflight.outputs import gate
from preflight.pipeline import report_paths
from preflight.pipeline.report_paths import DEFAULT_REPORT_PATH, default_report_path

NOBODY = pwd.getpwnam("nobody").pw_uid


# ---- where it is -----------------------------------------------------------------------


def test_root_writes_the_nodes_own_report(monkeypatch):
    real = Path("/var/lib/preflight/report.json")
    assert DEFAULT_REPORT_PATH == real and default_report_path({}, euid=0) != real  # conftest moved root's state for this process
    monkeypatch.setattr(report_paths, "ROOT_STATE_DIR", Path("/var/lib/preflight"))  # only asked here, never written
    assert default_report_path({"XDG_STATE_HOME": "/x", "HOME": "/root"}, euid=0) == real
    assert default_report_path({}, euid=0) == real


def test_anyone_else_writes_in_their_own_state_directory():
    assert default_report_path({"XDG_STATE_HOME": "/srv/state", "HOME": "/home/ann"}, euid=1000) == Path("/srv/state/preflight/report.json")
    assert default_report_path({"HOME": "/home/ann"}, euid=1000) == Path("/home/ann/.local/state/preflight/report.json")
    # The XDG spec: a relative XDG_STATE_HOME is invalid and ignored, as an empty one is.
    for bad in ("state", "", "~/state"):
        assert default_report_path({"XDG_STATE_HOME": bad, "HOME": "/home/ann"}, euid=1000) == Path("/home/ann/.local/state/preflight/report.json")
    # No usable HOME: the user's home from the password database, as expanduser reads it.
    assert default_report_path({}, euid=NOBODY) == Path(pwd.getpwuid(NOBODY).pw_dir) / ".local" / "state" / "preflight" / "report.json"
    assert default_report_path({"HOME": "relative"}, euid=NOBODY) == default_report_path({}, euid=NOBODY)


# ---- its directory, made safely ----------------------------------------------------------


def test_missing_directories_are_made_with_the_mode_asked_not_the_umasks(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    old = os.umask(0o077)
    try:
        safefile.make_dirs(home / ".local" / "state" / "preflight", 0o700)
        safefile.make_dirs(tmp_path / "lib" / "preflight", 0o755)
    finally:
        os.umask(old)
    for d in (home / ".local", home / ".local" / "state", home / ".local" / "state" / "preflight"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert stat.S_IMODE((tmp_path / "lib" / "preflight").stat().st_mode) == 0o755
    safefile.make_dirs(home / ".local" / "state" / "preflight", 0o755)  # already there: left as it is
    assert stat.S_IMODE((home / ".local" / "state" / "preflight").stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a link to nobody")
def test_a_link_another_user_planted_is_never_followed(tmp_path):
    sticky = tmp_path / "shared"
    sticky.mkdir(mode=0o1777)
    sticky.chmod(0o1777)
    target = tmp_path / "roots"
    target.mkdir(mode=0o700)
    (sticky / "state").symlink_to(target)
    os.lchown(sticky / "state", NOBODY, NOBODY)
    with pytest.raises(pathtrust.Untrusted, match="another user could have made"):
        safefile.make_dirs(sticky / "state" / "preflight", 0o700)
    with pytest.raises(pathtrust.Untrusted, match="another user could have made"):
        safefile.make_dirs(sticky / "state", 0o700)
    assert list(target.iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        safefile.make_dirs(tmp_path / "file", 0o700)


def test_the_default_is_made_for_a_user_who_is_not_root_0700(tmp_path, monkeypatch):
    # gate.default_report as a user would run it: their euid, their HOME, no XDG_STATE_HOME.
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: 1000 if real == 0 else real)
    path = default_report_path()
    assert path == tmp_path / "home" / ".local" / "state" / "preflight" / "report.json"
    assert gate.default_report(path) == path
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and not path.exists()
    assert os.listdir(path.parent) == []  # the probe file is gone


def test_roots_default_directory_is_made_0755_for_serves_user_to_read(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("root's default")
    path = default_report_path()  # conftest's stand-in for /var/lib/preflight/report.json
    assert path == report_paths.ROOT_STATE_DIR / "report.json" and not path.parent.exists()
    assert gate.default_report(path) == path
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755 and path.parent.stat().st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory to nobody")
def test_a_default_directory_another_user_owns_or_may_write_is_refused(tmp_path):
    path = tmp_path / "state" / "preflight" / "report.json"
    path.parent.mkdir(parents=True)
    os.chown(path.parent, NOBODY, NOBODY)
    with pytest.raises(UsageError) as e:
        gate.default_report(path)
    assert f"its directory {path.parent} is nobody's, who could replace the report" in str(e.value)
    assert "give --report FILE, or --scratch to write no report" in str(e.value)
    os.chown(path.parent, 0, 0)
    path.parent.chmod(0o777)
    with pytest.raises(UsageError, match=r"other users can write its directory .* \(mode 0777\).*chmod go-w"):
        gate.default_report(path)


def test_a_default_under_a_directory_another_user_could_rename_is_refused(tmp_path):
    # Who can rename a directory on the way could swap in a tree of their own after the check.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by all, not sticky
    path = shared / "home" / "preflight" / "report.json"
    with pytest.raises(UsageError) as e:
        gate.default_report(path)
    assert "another user could swap a directory on the way to it; give --report FILE, or --scratch to write no report" in str(e.value)


def test_a_default_that_cannot_be_made_says_so_and_what_to_do(tmp_path):
    (tmp_path / "state").write_text("a file where the directory would go")
    path = tmp_path / "state" / "preflight" / "report.json"
    with pytest.raises(UsageError) as e:
        gate.default_report(path)
    said = str(e.value)
    assert said.startswith(f"report {path} (the default: no --report given): ") and "\n" not in said
    assert said.endswith("give --report FILE, or --scratch to write no report"), said


# ---- run, then status, report --html and history, with no path given ------------------------


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_run_then_status_report_and_history_need_no_path(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFLIGHT_REPORT")
    path = default_report_path()  # root's stand-in (conftest) or, for anyone else, under XDG_STATE_HOME
    assert not path.parent.exists()
    run = invoke("run", "--profile", "cpu", "--only", "shm")
    assert run.exit_code == 0, run.output
    assert path.is_file() and (path.parent / "history.db").is_file()
    status = invoke("status")
    assert status.exit_code == 0 and status.stdout.startswith("vouched: "), status.output
    page = tmp_path / "report.html"
    html = invoke("report", "--html", str(page))
    assert html.exit_code == 0, html.output
    assert page.read_text().startswith("<!DOCTYPE html>") and str(path) in page.read_text()
    history = invoke("history")
    assert history.exit_code == 0 and history.stdout.startswith(f"1 run(s) in {path.parent / 'history.db'}, "), history.output


def test_scratch_writes_no_default_and_makes_no_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFLIGHT_REPORT")
    path = default_report_path()
    run = invoke("run", "--profile", "cpu", "--only", "shm", "--scratch", "--json")
    assert run.exit_code == 0, run.output
    assert not path.parent.exists()
    status = invoke("status")
    assert status.exit_code == 1 and f"no report at {path}: preflight has not run here (`preflight run` writes it there)" in status.stdout


def test_a_default_that_cannot_be_written_is_said_and_the_run_goes_on_without_a_report(tmp_path, monkeypatch):
    # Nobody asked for that file: a home a pod's arbitrary user cannot write is no fault of the node's.
    monkeypatch.delenv("PREFLIGHT_REPORT")
    path = default_report_path()
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    path.parent.write_text("")  # where the directory would go
    run = invoke("run", "--profile", "cpu", "--only", "shm")
    assert run.exit_code == 0, run.output
    line = run.stderr.strip().splitlines()[0]
    assert line.startswith(f"preflight: warning: report {path} (the default: no --report given): ") and line.endswith("; this run writes no report")
    assert "--report FILE" in line and "[PASS] shm" in run.stderr and path.parent.is_file()


def test_a_run_of_another_profile_leaves_the_nodes_report_alone(tmp_path, monkeypatch):
    # The node's gate wrote its h100-sxm verdict there; a `--profile cpu` dry run by hand must not vouch for the node.
    from conftest import report_file

    monkeypatch.delenv("PREFLIGHT_REPORT")
    path = default_report_path()
    path.parent.mkdir(parents=True, mode=0o700)
    report_file(path, "shm-64m-fail", profile="h100-sxm")
    before = path.read_bytes()
    run = invoke("run", "--profile", "cpu", "--only", "shm")
    assert run.exit_code == 0, run.output
    assert path.read_bytes() == before and not (path.parent / "history.db").exists()
    assert f"preflight: {path} holds this node's profile h100-sxm verdict, which a run of profile cpu does not replace; give --report FILE to keep this one" in run.stderr


def test_a_run_of_another_profile_leaves_the_report_and_metrics_the_config_names_alone(tmp_path, monkeypatch):
    """Was: with the example config's `report = "/var/lib/preflight/report.json"`, a `--profile cpu`
    run by hand replaced the gate's h100-sxm FAIL with a cpu PASS, and `status` vouched for the node.
    The config's (or the environment's) report and textfile are the node's, as the default is."""
    from conftest import report_file

    monkeypatch.delenv("PREFLIGHT_REPORT")
    node = tmp_path / "node"
    (node / "textfile").mkdir(parents=True, mode=0o700)
    node.chmod(0o700)
    path, prom = node / "report.json", node / "textfile" / "preflight.prom"
    report_file(path, "shm-64m-fail", profile="h100-sxm")
    prom.write_text("preflight_run_passed 0\n")
    config = tmp_path / "config.toml"
    config.write_text(f'report = "{path}"\ntextfile_dir = "{prom.parent}"\n')
    before = path.read_bytes()
    run = invoke("run", "--config", str(config), "--profile", "cpu", "--only", "shm")
    assert run.exit_code == 0, run.output
    assert path.read_bytes() == before and prom.read_text() == "preflight_run_passed 0\n"
    assert f"preflight: {path} holds this node's profile h100-sxm verdict, which a run of profile cpu does not replace" in run.stderr
    assert invoke("status", "--report", str(path)).exit_code == 1
    monkeypatch.setenv("PREFLIGHT_REPORT", str(path))  # the environment's is the node's too
    assert invoke("run", "--profile", "cpu", "--only", "shm").exit_code == 0 and path.read_bytes() == before
    monkeypatch.delenv("PREFLIGHT_REPORT")
    # Named on the command line, it is this run's to write.
    assert invoke("run", "--config", str(config), "--profile", "cpu", "--only", "shm", "--report", str(path)).exit_code == 0
    assert path.read_bytes() != before and "preflight_run_passed 1" in prom.read_text()


def test_the_nodes_own_profile_changed_still_writes_the_nodes_report(tmp_path, monkeypatch):
    """The guard above is for a profile chosen for this run: where the node's own profile changed
    (the site edited its config; `auto` picks another after a new GPU or an upgrade), the gate's run
    must replace the old profile's verdict, or a FAIL of the new one would go unseen. A profile
    chosen for the run (--profile, PREFLIGHT_PROFILE, a --config naming one) or one that judges no
    GPU never replaces it."""
    from conftest import report_file

    monkeypatch.delenv("PREFLIGHT_REPORT")
    monkeypatch.delenv("PREFLIGHT_PROFILE", raising=False)
    node = tmp_path / "node"
    node.mkdir(mode=0o700)
    path = node / "report.json"
    report_file(path, "cpu-pass", profile="h200-sxm")
    config = tmp_path / "config.toml"
    config.write_text(f'report = "{path}"\n')
    monkeypatch.setenv("PREFLIGHT_CONFIG", str(config))  # the node's own config, wherever the site keeps it
    before = path.read_bytes()
    for chosen, env in ((["--profile", "h100-sxm"], {}), ([], {"PREFLIGHT_PROFILE": "h100-sxm"})):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert invoke("run", *chosen, "--only", "shm").exit_code == 0 and path.read_bytes() == before, (chosen, env)
        for k in env:
            monkeypatch.delenv(k)
    trial = tmp_path / "trial.toml"
    trial.write_text(f'report = "{path}"\nprofile = "h100-sxm"\n')
    assert invoke("run", "--config", str(trial), "--only", "shm").exit_code == 0 and path.read_bytes() == before
    config.write_text(f'report = "{path}"\nprofile = "cpu"\n')  # the node's config, but a profile that judges no GPU
    assert invoke("run", "--only", "shm").exit_code == 0 and path.read_bytes() == before
    config.write_text(f'report = "{path}"\nprofile = "h100-sxm"\n')  # the site moved its node to another GPU profile
    run = invoke("run", "--only", "shm")
    assert run.exit_code == 0, run.output
    assert json.loads(path.read_text())["profile"] == "h100-sxm" and "does not replace" not in run.stderr


def test_which_profile_is_chosen_for_a_run_is_read_as_the_settings_read_it(monkeypatch):
    from preflight.pipeline import settings

    monkeypatch.delenv("PREFLIGHT_PROFILE", raising=False)
    monkeypatch.setenv("preflight_profile", "h100-sxm")  # any case, as pydantic-settings reads it
    s = settings.load({})
    assert s.profile == "h100-sxm" and s.profile_given
    monkeypatch.setenv("preflight_profile", "auto")  # `auto`, wherever it is named, is the node's own
    assert not settings.load({}).profile_given and not settings.load({"profile": "auto"}).profile_given
    monkeypatch.delenv("preflight_profile")
    assert settings.load({"profile": "cpu"}).profile_given and not settings.load({}).profile_given

def test_a_run_that_leaves_the_nodes_report_alone_leaves_no_record_of_a_run_either(tmp_path, monkeypatch):
    # The gate's pass stands; a `--profile cpu` run by hand writes no report there, so it must not
    # leave REPORT.started either: once it exited, every reader would take it for a run that died
    # after the pass, and slurm-healthcheck would drain (kube-label taint) a healthy node.
    from conftest import report_file
    from preflight.outputs.record import run_record

    monkeypatch.delenv("PREFLIGHT_REPORT")
    path = default_report_path()
    path.parent.mkdir(parents=True, mode=0o700)
    report_file(path, "cpu-pass", profile="h100-sxm")
    run = invoke("run", "--profile", "cpu", "--only", "shm")
    assert run.exit_code == 0, run.output
    assert not run_record.path_for(path).exists()
    status = invoke("status")
    assert status.exit_code == 0 and status.stdout.startswith("vouched: passed") and "under way" not in status.stdout


def test_a_run_on_fake_nvml_facts_writes_no_default(tmp_path, monkeypatch):
    from preflight.pipeline import settings

    monkeypatch.delenv("PREFLIGHT_REPORT")
    s = settings.load({"nvml_fake": tmp_path / "facts.json"})
    said = settings.outputs_of(s, None, None, False)
    assert s.report is None and said == "a run on fake NVML facts (--nvml-fake) writes no default report; give --report FILE to keep its verdict"


def test_a_default_on_a_network_filesystem_is_not_written(tmp_path):
    from preflight.outputs import gate

    home = tmp_path / "home"
    home.mkdir()
    nfs = f"36 25 0:45 / {home} rw,relatime shared:20 - nfs4 filer:/export/home rw,vers=4.2\n"
    local = f"36 25 0:45 / {home} rw,relatime shared:20 - ext4 /dev/sda1 rw\n"
    assert gate.network_fs(home / "u" / ".local" / "state" / "preflight", "1 0 8:1 / / rw - ext4 /dev/root rw\n" + nfs) == "nfs4"
    assert gate.network_fs(home / "u" / ".local" / "state" / "preflight", "1 0 8:1 / / rw - ext4 /dev/root rw\n" + local) is None


def test_a_group_run_writes_no_default(tmp_path, monkeypatch):
    # The node's own report is its gate: a whole group fails with one bad node.
    from preflight.pipeline import settings

    monkeypatch.delenv("PREFLIGHT_REPORT")
    s = settings.load({"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "127.0.0.1:1"})
    assert settings.outputs_of(s, None, None, False) is None and s.report is None and not s.report_is_default
    s = settings.load({})
    assert settings.outputs_of(s, None, None, False) is None and s.report == default_report_path() and s.report_is_default
    given = settings.load({"report": tmp_path / "r.json"})
    assert settings.outputs_of(given, tmp_path / "r.json", None, False) is None and not given.report_is_default


# ---- as root, for real: /var/lib/preflight in a mount namespace of the test's own ------------


@needs_root
def test_as_root_the_first_run_makes_var_lib_preflight_and_every_reader_finds_it(tmp_path):
    env = {**clean_env(report=False), "TMPDIR": str(tmp_path)}
    page = tmp_path / "node.html"
    pf = " ".join(fakes.PREFLIGHT)
    # A tmpfs over /var/lib, seen by this namespace alone: the real /var/lib/preflight is never touched.
    script = f"""set -e
mount -t tmpfs -o mode=0755 tmpfs /var/lib
{pf} run --profile cpu --only shm -q
stat -c '%a %U' /var/lib/preflight
test -f /var/lib/preflight/report.json && test -f /var/lib/preflight/history.db
{pf} status
{pf} report --html {page}
{pf} history
mount -o remount,ro /var/lib
{pf} run --profile cpu --only shm -q; echo "read-only: exit $?"
"""
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout.splitlines()
    assert out[0] == "755 root", done.stdout
    assert out[1].startswith("vouched: "), done.stdout
    assert "/var/lib/preflight/history.db" in done.stdout and out[-1] == "read-only: exit 0", done.stdout  # the verdict stands
    assert page.read_text().startswith("<!DOCTYPE html>") and "/var/lib/preflight/report.json" in page.read_text()
    said = [line for line in done.stderr.splitlines() if line.startswith("preflight: warning: report /var/lib/preflight/report.json")]
    assert said and "(the default: no --report given): cannot write in " in said[-1], done.stderr
    assert said[-1].endswith("(Read-only file system); give --report FILE, or --scratch to write no report; this run writes no report"), said


def test_a_reader_without_a_report_of_its_own_reads_the_nodes(tmp_path):
    # kube-label and node-problem-detector run as nobody, an admin asks `preflight status` without
    # sudo: with no report of their own, each reads the node's (what the units and root runs write).
    from preflight.pipeline import report_paths

    env = {"XDG_STATE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
    node = report_paths.ROOT_STATE_DIR / "report.json"
    own = tmp_path / "xdg" / "preflight" / "report.json"
    assert report_paths.reader_report_path(env, 65534) == own  # neither exists: the user's own, where their run would write
    node.parent.mkdir(parents=True, exist_ok=True)
    node.write_text("{}")
    assert report_paths.reader_report_path(env, 65534) == node
    own.parent.mkdir(parents=True)
    own.write_text("{}")
    assert report_paths.reader_report_path(env, 65534) == node  # there, but not theirs: another user could have written it
    os.chown(own, 65534, 65534)
    os.chown(own.parent, 65534, 65534)
    assert report_paths.reader_report_path(env, 65534) == own  # their own run's, once they have one
    assert report_paths.reader_report_path(env, 0) == node
    assert report_paths.node_report_path() == node  # what the readers that act for the node read, whoever runs them


def test_the_readers_that_act_for_the_node_read_the_nodes_report_whoever_runs_them(tmp_path, monkeypatch):
    # slurm-healthcheck, kube-label, serve and `status --npd` drain, label or vouch for the node: a
    # report a user keeps of their own (a dry run by hand) must never be what they act on.
    from preflight.cli import plain
    from preflight.pipeline import report_paths

    monkeypatch.delenv("PREFLIGHT_REPORT")
    monkeypatch.setattr(report_paths.os, "geteuid", lambda: 65534)
    own = report_paths.default_report_path()
    own.parent.mkdir(parents=True)
    own.write_text("{}")
    os.chown(own, 65534, 65534)
    os.chown(own.parent, 65534, 65534)
    assert plain.report_path(None, None) == own  # a person's `status`: their own
    assert plain.report_path(None, None, node=True) == report_paths.node_report_path()
