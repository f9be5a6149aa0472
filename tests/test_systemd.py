"""The shipped systemd units and launcher drop-ins: they pass `systemd-analyze
verify` (with ExecStart pointing at this installation's `preflight` so the path
resolves), every ExecStart is a command line `preflight` accepts, and the units
agree with each other on where the report and the metrics go."""

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).parent.parent / "systemd"
DROP_INS = sorted((UNITS / "drop-ins").glob("*.service.d/preflight.conf"))
# Launchers that start whatever the gate said, and learn the verdict another way:
# slurmd drains its node through HealthCheckProgram ("preflight: <cause>"), which
# a slurmd held back by the gate could never run; kubelet, held back, could never
# label or taint the node it runs on (and on a GPU Operator node, whose driver
# needs kubelet, would stay down for good).
UNGATED = {"slurmd.service.d", "kubelet.service.d"}
GATED = [p for p in DROP_INS if p.parent.name not in UNGATED]
SLURMD = UNITS / "drop-ins" / "slurmd.service.d" / "preflight.conf"
KUBELET = UNITS / "drop-ins" / "kubelet.service.d" / "preflight.conf"
SHIPPED = sorted([*UNITS.glob("*.service"), *UNITS.glob("*.timer"), *UNITS.glob("*.socket")])
PREFLIGHT = Path(sys.executable).parent / "preflight"
INSTALLED_AS = "/usr/local/bin/preflight"

needs_analyze = pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed (Debian package systemd)")


def settings(path: Path) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> values in file order, as systemd reads a unit file."""
    found: dict[tuple[str, str], list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault((section, key.strip()), []).append(value.strip())
    return found


def install(directory: Path, *units: Path) -> Path:
    """Copy units into directory, ExecStart pointing at this venv's preflight."""
    directory.mkdir(parents=True, exist_ok=True)
    for unit in units:
        (directory / unit.name).write_text(unit.read_text().replace(INSTALLED_AS, str(PREFLIGHT)))
    return directory


def verify(unit: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)


def exec_starts() -> list[tuple[str, list[str]]]:
    return [
        (unit.name, shlex.split(line.lstrip("-@:+!")))
        for unit in sorted(UNITS.glob("*.service"))
        for line in settings(unit).get(("Service", "ExecStart"), [])
    ]


def parse_command_line(args: list[str]) -> dict:
    """The subcommand's parsed parameters; raises as `preflight` would on a bad flag. Runs nothing."""
    from typer.main import get_command

    from preflight.pipeline import registry
    from preflight.cli.app import app

    group = get_command(app)
    ctx = group.make_context("preflight", list(args))
    # The group leaves the subcommand's arguments unparsed: parse them too.
    name, sub, rest = group.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
    params = sub.make_context(name, rest, parent=ctx).params
    for flag in ("only", "skip"):  # a misspelt check name would exit 2 on every run
        registry.check_names([n for v in params.get(flag) or () for n in v.split(",")], f"--{flag}")
    return params


@needs_analyze
@pytest.mark.parametrize("unit", SHIPPED, ids=lambda p: p.name)
def test_unit_verifies(unit, tmp_path):
    assert PREFLIGHT.exists()
    local = install(tmp_path, *SHIPPED) / unit.name  # a timer beside the service it starts
    p = verify(local)
    assert p.returncode == 0 and p.stderr == "", p.stderr


@needs_analyze
def test_verify_would_catch_a_broken_exec_start(tmp_path):
    broken = tmp_path / "preflight.service"
    broken.write_text((UNITS / "preflight.service").read_text().replace(INSTALLED_AS, "/nonexistent/preflight"))
    assert verify(broken).returncode != 0


@needs_analyze
def test_verify_would_catch_a_misspelt_timer_setting(tmp_path):
    # A timer whose only repeating setting is ignored never rechecks: the empty stderr asserted above matters.
    timer = install(tmp_path, *SHIPPED) / "preflight-recheck.timer"
    timer.write_text(timer.read_text().replace("OnCalendar=", "OnCalender="))
    assert "OnCalender" in verify(timer).stderr


def install_launcher(tmp_path: Path, drop_in: Path, unit: str = "") -> tuple[Path, str]:
    """The shipped units, a stand-in launcher (``unit`` added to its [Unit]) and the drop-in for it."""
    launcher = drop_in.parent.name.removesuffix(".d")
    d = install(tmp_path, *SHIPPED)
    (d / launcher).write_text(f"[Unit]\nDescription=stand-in launcher\n{unit}[Service]\nExecStart=/bin/true\n")
    (d / drop_in.parent.name).mkdir()
    shutil.copy(drop_in, d / drop_in.parent.name / drop_in.name)
    return d, launcher


@needs_analyze
@pytest.mark.parametrize("drop_in", GATED, ids=lambda p: p.parent.name)
def test_drop_in_holds_the_launcher_behind_the_gate(drop_in, tmp_path):
    d, launcher = install_launcher(tmp_path, drop_in)

    p = verify(d / launcher)
    assert p.returncode == 0 and p.stderr == "", p.stderr

    # Proof the drop-in is read: a gate that cannot load now keeps the launcher from starting...
    (d / "preflight.service").write_text("[Unit]\nDescription=a gate that refuses to load\n[Service]\nType=oneshot\n")
    p = verify(d / launcher)
    assert p.returncode != 0 and f"Failed to create {launcher}/start: Unit preflight.service" in p.stderr, p.stderr
    # ... and only because of the drop-in.
    shutil.rmtree(d / drop_in.parent.name)
    p = verify(d / launcher)
    assert p.returncode == 0 and p.stderr == "", p.stderr


@pytest.mark.parametrize("drop_in", GATED, ids=lambda p: p.parent.name)
def test_drop_in_starts_the_launcher_only_after_the_gate_finishes(drop_in):
    # Requires= alone would start the launcher alongside the gate, before any verdict.
    s = settings(drop_in)
    assert s[("Unit", "Requires")] == ["preflight.service"]
    assert s[("Unit", "After")] == ["preflight.service"]


def test_slurmd_waits_for_the_gate_but_starts_whatever_it_said():
    # Requires=/Requisite=/BindsTo= would keep slurmd down on a failed gate: Slurm would see a node
    # not responding, with no reason, and no health check could ever resume it. Wants= would rerun
    # the gate at every `systemctl restart slurmd`.
    s = settings(SLURMD)
    assert s == {("Unit", "After"): ["preflight.service"]}


@needs_analyze
def test_slurmd_starts_when_the_gate_fails(tmp_path):
    d, launcher = install_launcher(tmp_path, SLURMD)
    (d / "preflight.service").write_text("[Unit]\nDescription=a gate that refuses to load\n[Service]\nType=oneshot\n")
    p = verify(d / launcher)
    # systemd still says the gate is broken; slurmd's start job is created all the same.
    assert p.returncode == 0 and "Failed to create" not in p.stderr, p.stderr


@needs_analyze
def test_slurmd_is_ordered_after_the_gate(tmp_path):
    # At boot the target pulls both in (the stand-in's Wants=); a gate made to wait for slurmd then
    # closes a cycle, and only because the drop-in orders slurmd after the gate.
    d, launcher = install_launcher(tmp_path, SLURMD, unit="Wants=preflight.service\n")
    gate = d / "preflight.service"
    gate.write_text(gate.read_text() + "\n[Unit]\nAfter=slurmd.service\n")
    assert "Found ordering cycle" in verify(d / launcher).stderr
    shutil.rmtree(d / SLURMD.parent.name)
    assert "Found ordering cycle" not in verify(d / launcher).stderr


def test_the_kubelet_drop_in_only_orders_kubelet_after_the_gate():
    # Requires=/Requisite=/BindsTo= would keep kubelet down on a failed gate, and on a GPU Operator
    # node (whose driver needs kubelet) for good; Wants= would rerun the gate on a kubelet restart.
    assert settings(KUBELET) == {("Unit", "After"): ["preflight.service"]}


@needs_analyze
def test_kubelet_starts_even_when_the_gate_cannot_and_waits_for_it_at_boot(tmp_path):
    d = install(tmp_path, *SHIPPED)
    (d / "kubelet.service").write_text("[Unit]\nDescription=stand-in kubelet\n[Service]\nExecStart=/bin/true\n")
    (d / "kubelet.service.d").mkdir()
    shutil.copy(KUBELET, d / "kubelet.service.d" / "preflight.conf")
    # A gate that cannot even load does not stop kubelet from starting (systemd names the gate's fault).
    gate = (d / "preflight.service").read_text()
    (d / "preflight.service").write_text("[Unit]\nDescription=a gate that refuses to load\n[Service]\nType=oneshot\n")
    p = verify(d / "kubelet.service")
    assert p.returncode == 0 and "Failed to create kubelet.service/start" not in p.stderr, p.stderr
    # Proof systemd reads the drop-in's ordering: started together (as at boot, here pulled in by a
    # stand-in Wants=), a gate ordered after kubelet now makes a cycle, and only because of the drop-in.
    (d / "preflight.service").write_text(gate)
    (d / "kubelet.service").write_text("[Unit]\nDescription=stand-in kubelet\nWants=preflight.service\n[Service]\nExecStart=/bin/true\n")
    (d / "preflight.service.d").mkdir()
    (d / "preflight.service.d" / "cycle.conf").write_text("[Unit]\nAfter=kubelet.service\n")
    assert "Found ordering cycle" in verify(d / "kubelet.service").stderr
    shutil.rmtree(d / "kubelet.service.d")
    p = verify(d / "kubelet.service")
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_there_are_drop_ins_for_slurm_kubernetes_and_any_other_launcher():
    assert {p.parent.name for p in DROP_INS} >= {"slurmd.service.d", "kubelet.service.d", "job-launcher.service.d"}


@pytest.mark.parametrize("unit,args", [pytest.param(u, a, id=f"{u}:{a[1]}") for u, a in exec_starts()])
def test_exec_start_is_a_command_line_preflight_accepts(unit, args):
    assert args[0] == INSTALLED_AS
    parse_command_line(args[1:])


@pytest.mark.parametrize(
    "args,error",
    [(["run", "--if-idel"], "No such option"), (["serv"], "No such command"), (["serve", "--listen"], "requires an argument"),
     (["run", "--skip", "bandwith"], "no such check")],
)
def test_the_command_line_check_catches_a_typo(args, error):
    from typer import TyperException

    from preflight.base.errors import UsageError

    with pytest.raises((TyperException, UsageError), match=error):
        parse_command_line(args)


def test_every_unit_reads_and_writes_the_same_report_and_metrics():
    from preflight.pipeline.report import DEFAULT_REPORT_PATH

    used = [parse_command_line(args[1:]) for _, args in exec_starts()]
    assert {p["report"] for p in used} == {DEFAULT_REPORT_PATH}
    assert {p["textfile_dir"] for p in used if "textfile_dir" in p} == {Path("/var/lib/preflight/textfile")}


@pytest.mark.parametrize("unit", ["preflight.service", "preflight-recheck.service"])
def test_the_directories_a_run_writes_to_exist_before_it_starts(unit):
    # A missing --textfile-dir exits 2 before any check: the gate would fail and hold every launcher back.
    s = settings(UNITS / unit)
    state = {Path("/var/lib", d) for v in s[("Service", "StateDirectory")] for d in v.split()}
    for _, args in [e for e in exec_starts() if e[0] == unit]:
        p = parse_command_line(args[1:])
        assert {p["report"].parent, p["textfile_dir"]} <= state


def test_the_gate_writes_the_report_where_the_tool_expects_it():
    from preflight.pipeline.report import DEFAULT_REPORT_PATH

    exec_start = next(line for line in (UNITS / "preflight.service").read_text().splitlines() if line.startswith("ExecStart="))
    assert f"--report {DEFAULT_REPORT_PATH}" in exec_start


def test_the_gate_stays_passed_and_waits_for_the_nvidia_daemons_without_needing_them():
    s = settings(UNITS / "preflight.service")
    assert s[("Service", "Type")] == ["oneshot"] and s[("Service", "RemainAfterExit")] == ["yes"]
    assert s[("Service", "TimeoutStartSec")]
    daemons = {"nvidia-persistenced.service", "nvidia-fabricmanager.service"}
    assert daemons <= set(" ".join(s[("Unit", "Wants")]).split())
    assert daemons <= set(" ".join(s[("Unit", "After")]).split())
    assert ("Unit", "Requires") not in s


def test_the_gate_waits_for_the_network_it_judges_and_pulls_it_in():
    # After= alone orders nothing unless some unit wants network-online.target.
    s = settings(UNITS / "preflight.service")
    assert "network-online.target" in " ".join(s[("Unit", "Wants")]).split()
    assert "network-online.target" in " ".join(s[("Unit", "After")]).split()


def test_the_timer_reruns_a_light_recheck_when_the_gpus_are_idle():
    timer = settings(UNITS / "preflight-recheck.timer")
    target = timer.get(("Timer", "Unit"), ["preflight-recheck.service"])[0]
    assert (UNITS / target).exists()
    # Wall-clock: a timer counting from the recheck's last start stops for good once Requisite= holds it back.
    assert timer[("Timer", "OnCalendar")] and ("Timer", "OnUnitActiveSec") not in timer and timer[("Timer", "RandomizedDelaySec")]
    assert timer[("Install", "WantedBy")] == ["timers.target"]

    s = settings(UNITS / target)
    # A unit that remains active is never started again by its timer.
    assert s[("Service", "Type")] == ["oneshot"] and s.get(("Service", "RemainAfterExit"), ["no"]) == ["no"]
    assert s[("Service", "TimeoutStartSec")] and "preflight.service" in s[("Unit", "After")]
    # A lighter pass must not stand in for a gate that failed: only while the gate stands passed.
    assert s[("Unit", "Requisite")] == ["preflight.service"]
    (args,) = [a for u, a in exec_starts() if u == target]
    p = parse_command_line(args[1:])
    # The quick level: no torch and no GPU work (not bandwidth, train or nccl's ranks), and nothing while a job holds a GPU.
    assert p["if_idle"] and p["level"] == "quick" and not p["only"]


def test_the_gate_runs_the_standard_level_whatever_the_config_says():
    (args,) = [a for u, a in exec_starts() if u == "preflight.service"]
    p = parse_command_line(args[1:])
    assert p["level"] == "standard" and not p["only"] and not p["skip"] and p["budget"] is None


def test_the_exporter_is_confined_and_listens_on_loopback():
    s = settings(UNITS / "preflight-exporter.service")
    expected = {
        "DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
        "PrivateTmp": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
        "ProtectKernelLogs": "yes", "ProtectControlGroups": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "RestrictNamespaces": "yes",
        "LockPersonality": "yes", "MemoryDenyWriteExecute": "yes", "SystemCallArchitectures": "native",
        "CapabilityBoundingSet": "", "DevicePolicy": "closed", "Restart": "on-failure",
    }
    assert {k: s.get(("Service", k), [None])[-1] for k in expected} == expected
    assert "2" in s[("Service", "RestartPreventExitStatus")][-1].split()  # bad input must not restart-loop
    assert s[("Service", "RestartSec")] and s[("Service", "TasksMax")] and s[("Service", "MemoryMax")]
    # Nothing to write, no GPU to open; PrivateDevices=yes would hide /dev/nvidia* from a site that adds NVML.
    for absent in ("PrivateDevices", "DeviceAllow", "ReadWritePaths", "StateDirectory"):
        assert ("Service", absent) not in s
    (args,) = [a for u, a in exec_starts() if u == "preflight-exporter.service"]
    # Neither --listen nor Environment=PREFLIGHT_LISTEN: both would override `listen` in the config file,
    # and serve's own default is loopback.
    assert args[1] == "serve" and "--listen" not in args and ("Service", "Environment") not in s
    assert "network-online.target" in s[("Unit", "After")][-1].split()


def test_the_exporters_port_is_held_by_a_socket_unit_on_loopback_from_boot():
    # systemd binds it at sockets.target, before any user's process, and keeps it across serve's
    # restarts: no other user can take the port first and answer scrapes in serve's name.
    sock = settings(UNITS / "preflight-exporter.socket")
    assert sock[("Socket", "ListenStream")] == ["127.0.0.1:9842"] and sock[("Socket", "Accept")] == ["no"]
    assert sock[("Install", "WantedBy")] == ["sockets.target"]
    service = settings(UNITS / "preflight-exporter.service")
    assert "preflight-exporter.socket" in service[("Unit", "Requires")] and "preflight-exporter.socket" in service[("Unit", "After")]
