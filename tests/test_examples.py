"""The files in examples/ work as shipped: every `preflight ...` they run is a
valid invocation of the real CLI (parsed, never run), the manifests say what
their comments promise, and the Slurm prolog gives the right exit codes
against real reports."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command

from preflight.cli.app import app

EXAMPLES = Path(__file__).parents[1] / "examples"
K8S = EXAMPLES / "kubernetes"
SLURM = EXAMPLES / "slurm"
NPD = EXAMPLES / "node-problem-detector" / "preflight-plugin.json"
SLURM_COMMANDS = ("scontrol", "squeue", "sinfo", "sbatch", "srun", "salloc", "scancel", "sacctmgr", "sacct")


def parse(argv: list[str]) -> str:
    """Parse ``preflight ARGV`` as the real CLI would, down to the subcommand's
    own options and values, without running it; raises on anything invalid."""
    group = get_command(app)
    ctx = group.make_context("preflight", list(argv))
    # What the group's invoke() does next: find the subcommand and parse its arguments.
    rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
    name, sub, args = group.resolve_command(ctx, rest)
    assert sub is not None
    sub.make_context(name, args, parent=ctx)
    return str(name)


def preflight_args(argv: list[str]) -> list[str] | None:
    """The arguments of a command line that runs preflight, else None."""
    return list(argv[1:]) if argv and os.path.basename(argv[0]) == "preflight" else None


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return [*pod.get("initContainers", []), *pod.get("containers", [])]


def yaml_commands(path: Path) -> list[list[str]]:
    found = []
    for doc in yaml.safe_load_all(path.read_text()):
        for c in containers(doc):
            args = preflight_args([*c.get("command", []), *c.get("args", [])])
            if args is not None:
                found.append(args)
    return found


def docs(path: Path) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(path.read_text())}


# --- the parser has teeth -------------------------------------------------------------


def test_the_parser_accepts_real_invocations_and_refuses_bad_ones() -> None:
    assert parse(["kube-label", "--every=60", "--taint"]) == "kube-label"
    assert parse(["status", "--npd"]) == "status"
    for bad in (["kube-label", "--evry", "60"], ["kube-label", "--every", "soon"], ["status", "--npd", "extra"], ["no-such-command"]):
        with pytest.raises(Exception):  # noqa: B017 - click's own usage errors, whichever it picks
            parse(bad)


# --- Kubernetes ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["init-container.yaml", "daemonset.yaml"])
def test_every_preflight_command_in_the_manifests_is_valid(name: str) -> None:
    found = yaml_commands(K8S / name)
    assert found, f"no preflight command in {name}"
    for args in found:
        parse(args)


def test_the_commented_taint_option_is_valid_when_uncommented() -> None:
    text = (K8S / "daemonset.yaml").read_text()
    assert re.search(r"^\s*# - --taint$", text, re.MULTILINE)
    enabled = re.sub(r"^(\s*)# - --taint$", r"\1- --taint", text, flags=re.MULTILINE)
    (args,) = [a for d in yaml.safe_load_all(enabled) for c in containers(d) if (a := preflight_args(c.get("command", []))) is not None]
    assert args == ["kube-label", "--every=60", "--report=/var/lib/preflight/report.json", "--taint"]
    parse(args)
    # kube-label runs as nobody, whose own default is not the node's: the report it names is the one mounted.
    mounts = [m["mountPath"] for d in yaml.safe_load_all(text) for c in containers(d) for m in c.get("volumeMounts", [])]
    assert "/var/lib/preflight" in mounts, mounts


def test_the_cluster_role_grants_exactly_get_list_and_patch_on_nodes() -> None:
    # list: the taint cap counts the nodes preflight has tainted (kube-label --taint-cap).
    d = docs(K8S / "daemonset.yaml")
    assert d["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}]
    binding = d["ClusterRoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": d["ClusterRole"]["metadata"]["name"]}
    sa = d["ServiceAccount"]["metadata"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
    assert d["Namespace"]["metadata"]["name"] == sa["namespace"] == d["DaemonSet"]["metadata"]["namespace"] == "preflight"


def test_the_daemonset_reads_the_hosts_report_as_a_locked_down_user() -> None:
    ds = docs(K8S / "daemonset.yaml")["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "preflight"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "preflight/failed", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    (c,) = pod["containers"]
    assert c["image"] == "registry.example.com/preflight:0.2.0"
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in c["env"]
    assert c["securityContext"] == {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert c["resources"]["requests"] and c["resources"]["limits"]
    (mount,) = c["volumeMounts"]
    assert mount == {"name": "report", "mountPath": "/var/lib/preflight", "readOnly": True}
    (vol,) = pod["volumes"]
    assert vol["name"] == "report" and vol["hostPath"]["path"] == "/var/lib/preflight"


def test_the_init_container_checks_the_jobs_own_gpus_and_shm() -> None:
    job = docs(K8S / "init-container.yaml")["Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (init,) = pod["initContainers"]
    (app_,) = pod["containers"]
    assert preflight_args(init["command"])[:1] == ["run"]
    assert init["resources"]["limits"]["nvidia.com/gpu"] == app_["resources"]["limits"]["nvidia.com/gpu"]
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
    for c in (init, app_):
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


# --- node-problem-detector ----------------------------------------------------------


def go_seconds(duration: str) -> float:
    """A Go time.ParseDuration string as NPD's config uses ("30s", "5m", "1h30m")."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and duration, f"not a Go duration NPD parses: {duration!r}"
    h, m, s = (int(p or 0) for p in parts.groups())
    return h * 3600 + m * 60 + s


def test_the_npd_plugin_config_is_what_npd_validates() -> None:
    cfg = json.loads(NPD.read_text())
    assert cfg["plugin"] == "custom" and cfg["source"] == "preflight"
    plugin = cfg["pluginConfig"]
    assert plugin["max_output_length"] <= 80 and plugin["concurrency"] == 1
    assert go_seconds(plugin["invoke_interval"]) == 300
    (rule,) = cfg["rules"]
    assert rule["type"] == "permanent"
    assert [rule["path"], *rule["args"]] == ["/usr/local/bin/preflight", "status", "--npd"]
    parse(preflight_args([rule["path"], *rule["args"]]) or [])
    # NPD refuses a rule slower than the global timeout, and a permanent condition with no default.
    assert go_seconds(rule["timeout"]) <= go_seconds(plugin["timeout"])
    assert rule["condition"] in [c["type"] for c in cfg["conditions"]]


def test_status_npd_fits_npds_output_limit(reports: dict[str, Path]) -> None:
    limit = json.loads(NPD.read_text())["pluginConfig"]["max_output_length"]
    for which, code in (("pass", 0), ("fail", 1)):
        done = subprocess.run(["preflight", "status", "--npd", "--report", str(reports[which])], env=_env(), capture_output=True, timeout=60)
        assert done.returncode == code, done.stderr
        assert 0 < len(done.stdout.rstrip(b"\n")) <= limit


# --- Slurm --------------------------------------------------------------------------


def _env(first: Path | None = None, **extra: str) -> dict[str, str]:
    """This venv's bin first on PATH (after ``first``), so the scripts run this
    preflight; no PREFLIGHT_* from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
    path = [str(p) for p in (first, Path(sys.executable).parent) if p is not None]
    return {**env, "PATH": os.pathsep.join([*path, env.get("PATH", "")]), **extra}


def code_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_prolog_is_valid_bash_and_calls_no_slurm_command() -> None:
    prolog = SLURM / "prolog.sh"
    assert os.access(prolog, os.X_OK)
    assert subprocess.run(["bash", "-n", str(prolog)], capture_output=True).returncode == 0
    assert "set -u" in code_lines(prolog)
    words = {w for line in code_lines(prolog) for w in re.findall(r"[\w-]+", line)}
    assert not words & set(SLURM_COMMANDS)


@pytest.fixture
def recorders(tmp_path: Path) -> Path:
    """A `preflight` that records its arguments and a `logger` that records its message:
    the last call's in NAME.args, every call's in NAME.calls (each after a line "@@call")."""
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("preflight", "logger"):
        (d / name).write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/{name}.args"\nprintf "%s\\n" @@call "$@" >> "{tmp_path}/{name}.calls"\n'
                              'exit "${FAKE_EXIT:-0}"\n')
        (d / name).chmod(0o755)
    return d


def calls(path: Path) -> list[list[str]]:
    """What a recorder was called with, call by call."""
    text = path.read_text() if path.exists() else ""
    path.unlink(missing_ok=True)
    return [call.strip("\n").split("\n") if call.strip("\n") else [] for call in text.split("@@call\n")[1:]]


def test_the_prologs_preflight_commands_are_valid(recorders: Path) -> None:
    done = subprocess.run([str(SLURM / "prolog.sh")], env=_env(recorders), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    status, run = calls(recorders.parent / "preflight.calls")
    assert status == ["status", "--report", "/var/lib/preflight/report.json"]  # no age limit unless the site sets one
    parse(status)
    # Then a fresh look at the quick level, within a budget, into the same report.
    assert run[:5] == ["run", "--level", "quick", "--budget", "10"] and run[-2:] == ["--report", "/var/lib/preflight/report.json"]
    # Another run holding the lock is waited for briefly, then the last report (which status vouched for) stands.
    assert run[run.index("--lock-timeout") + 1] == "5" and run[run.index("--if-locked") + 1] == "skip"
    assert not [a for a in run if "lock-file" in a]  # the lock is preflight's own setting, the recheck's and the gate's
    parse(run)
    done = subprocess.run([str(SLURM / "prolog.sh")], env=_env(recorders, PREFLIGHT_MAX_AGE="86400", PREFLIGHT_BUDGET="4.5"), capture_output=True, text=True, timeout=30)
    status, run = calls(recorders.parent / "preflight.calls")
    assert done.returncode == 0 and status[-2:] == ["--max-age", "86400"] and run[3:5] == ["--budget", "4.5"]
    parse(status)
    parse(run)


def test_the_prolog_runs_no_quick_look_on_a_node_the_report_does_not_vouch_for(recorders: Path) -> None:
    done = subprocess.run([str(SLURM / "prolog.sh")], env=_env(recorders, FAKE_EXIT="1"), capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    (status,) = calls(recorders.parent / "preflight.calls")  # status said no: nothing ran
    assert status[0] == "status"


@pytest.fixture
def real_prolog(recorders: Path, tmp_path: Path):  # noqa: ANN201
    """The prolog with this venv's real `preflight` (the cpu profile, a lock of its own)."""
    (recorders / "preflight").unlink()

    def run(**env: str) -> subprocess.CompletedProcess:
        base = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "gpu17", "PREFLIGHT_PROFILE": "cpu", "PREFLIGHT_LOCK_FILE": str(tmp_path / "lock")}
        return subprocess.run([str(SLURM / "prolog.sh")], env=_env(recorders, **{**base, **env}), capture_output=True, text=True, timeout=60)

    return run


def test_the_prolog_passes_a_vouched_node_and_refuses_the_rest(reports: dict[str, Path], real_prolog, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    shutil.copy(reports["pass"], report)  # the prolog's quick look rewrites it
    ok = real_prolog(PREFLIGHT_REPORT=str(report))
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    after = json.loads(report.read_text())
    assert after["level"] == "quick" and after["verdict"] == "pass"  # the quick look was written where every reader looks
    failed = real_prolog(PREFLIGHT_REPORT=str(reports["fail"]))
    assert failed.returncode == 1
    said = "preflight prolog: job 4242 refused on gpu17: NOT vouched: [software] drain: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor"
    assert failed.stderr.startswith(said), failed.stderr
    assert calls(tmp_path / "logger.calls")[-1][-1].startswith(said)  # and to the journal
    missing = real_prolog(PREFLIGHT_REPORT=str(tmp_path / "none.json"))
    assert missing.returncode == 1 and "no report at" in missing.stderr
    stale = real_prolog(PREFLIGHT_REPORT=str(reports["pass"]), PREFLIGHT_MAX_AGE="0.001")
    assert stale.returncode == 1 and "older than the 0.001 s allowed" in stale.stderr


def test_the_prolog_refuses_a_vouched_node_whose_quick_look_fails_and_keeps_the_gates_results(tmp_path: Path, real_prolog) -> None:
    from conftest import report_file

    report = report_file(tmp_path / "report.json", "cpu-pass")  # the boot gate's pass, this boot
    gate = json.loads(report.read_text())
    config = tmp_path / "config.toml"
    config.write_text("[floors]\nshm_min_bytes = 1125899906842624\n")  # 1 PiB: /dev/shm fails now
    failed = real_prolog(PREFLIGHT_REPORT=str(report), PREFLIGHT_CONFIG=str(config))
    assert failed.returncode == 1
    assert failed.stderr.startswith("preflight prolog: job 4242 refused on gpu17: [FAIL] shm") and failed.stderr.count("\n") == 1, failed.stderr
    after = json.loads(report.read_text())
    assert (after["verdict"], after["level"]) == ("fail", "quick")
    kept = {c["check"]: c["details"]["carried_from"] for c in after["checks"] if "carried_from" in c["details"]}
    assert set(kept) == {"nccl", "bandwidth", "train"} and set(kept.values()) == {gate["finished_at"]}


def test_the_prolog_lets_the_job_run_on_the_last_report_while_another_run_holds_the_lock(tmp_path: Path, real_prolog) -> None:
    from conftest import lock_held, report_file

    report = report_file(tmp_path / "report.json", "cpu-pass")
    before = report.read_text()
    with lock_held(tmp_path / "lock") as holder:  # real_prolog's lock: a standard run, an admin's, the gate again
        ok = real_prolog(PREFLIGHT_REPORT=str(report))
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    assert report.read_text() == before  # no look taken: the holder writes the verdict
    said = calls(tmp_path / "logger.calls")[-1][-1]
    assert said.startswith(f"preflight prolog: job 4242 on gpu17: preflight: not run: another preflight run (pid {holder}) still holds "), said
    # Lock free again: the prolog takes its own look.
    assert real_prolog(PREFLIGHT_REPORT=str(report)).returncode == 0
    assert json.loads(report.read_text())["level"] == "quick"


def test_after_a_run_that_died_the_prolog_takes_a_fresh_look_only_where_this_boot_passed(tmp_path: Path, real_prolog) -> None:
    # An OOM-killed recheck after the gate passed is no verdict on the node: the quick look
    # keeps the gate's results and decides. A gate of this boot that died is: no look stands in.
    from datetime import datetime, timedelta, timezone

    from conftest import report_file, run_record_file

    report = report_file(tmp_path / "report.json", "cpu-pass", age=600)
    run_record_file(report, datetime.now(timezone.utc) - timedelta(seconds=300), alive=False)
    ok = real_prolog(PREFLIGHT_REPORT=str(report))
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    after = json.loads(report.read_text())
    assert (after["verdict"], after["level"]) == ("pass", "quick") and {"nccl", "bandwidth", "train"} <= {
        c["check"] for c in after["checks"] if "carried_from" in c["details"]}
    earlier = report_file(tmp_path / "earlier.json", "cpu-pass", boot="another", age=600)
    run_record_file(earlier, datetime.now(timezone.utc) - timedelta(seconds=300), alive=False)
    refused = real_prolog(PREFLIGHT_REPORT=str(earlier))
    assert refused.returncode == 1 and "did not finish" in refused.stderr, refused.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare for a private /dev/shm")
def test_the_prolog_refuses_a_job_on_a_node_whose_dev_shm_is_too_small_for_any_job(tmp_path: Path, recorders: Path) -> None:
    from conftest import report_file

    report = report_file(tmp_path / "report.json", "cpu-pass")
    (recorders / "preflight").unlink()
    env = _env(recorders, SLURM_JOB_ID="4242", SLURMD_NODENAME="gpu17", PREFLIGHT_PROFILE="cpu", PREFLIGHT_LOCK_FILE=str(tmp_path / "lock"),
               PREFLIGHT_REPORT=str(report))
    # An idle node (its own PID namespace: no job but this one) with Docker's 64 MiB /dev/shm.
    done = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c",
                           f'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {SLURM / "prolog.sh"}'], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("preflight prolog: job 4242 refused on gpu17: [FAIL] shm") and "/dev/shm is 64 MiB, below the 1 GiB floor" in done.stderr


def test_the_prolog_refuses_where_the_quick_level_does_not_fit_its_budget(tmp_path: Path, real_prolog) -> None:
    from conftest import report_file

    report = report_file(tmp_path / "report.json", "cpu-pass")
    before = report.read_text()
    slow = real_prolog(PREFLIGHT_REPORT=str(report), PREFLIGHT_BUDGET="0.1")  # the report's shm took 0.37 s
    assert slow.returncode == 1
    assert "fits no level: the quick level is expected to take 0.375 s, from this node's report" in slow.stderr and "(exit 2)" in slow.stderr
    assert report.read_text() == before  # refused before anything ran


def test_the_healthcheck_wrapper_adds_valid_options() -> None:
    wrapper = SLURM / "preflight-healthcheck"
    assert os.access(wrapper, os.X_OK)
    assert subprocess.run(["sh", "-n", str(wrapper)], capture_output=True).returncode == 0
    (line,) = [x for x in code_lines(wrapper) if x.startswith("exec ")]
    argv = shlex.split(line)
    assert argv[0] == "exec" and argv[-1] == "$@"
    args = preflight_args(argv[1:-1])
    assert args is not None and args[0] == "slurm-healthcheck"
    parse(args)


def test_the_healthcheck_wrapper_gives_preflight_a_path_under_slurmds_empty_environment(tmp_path) -> None:
    # slurmd runs HealthCheckProgram with no PATH; scontrol lives in /usr/bin,
    # /usr/local/bin (source builds) or /opt/slurm/bin. A stand-in preflight says what it got.
    standin = tmp_path / "preflight"
    standin.write_text(f"#!{sys.executable}\nimport json, os, sys\nprint(json.dumps([os.environ.get('PATH'), sys.argv[1:]]))\n")
    standin.chmod(0o755)
    script = tmp_path / "preflight-healthcheck"
    script.write_text((SLURM / "preflight-healthcheck").read_text().replace("/usr/local/bin/preflight ", f"{standin} "))
    p = subprocess.run(["/usr/bin/env", "-i", "SLURMD_NODENAME=gpu-01", "/bin/sh", str(script)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    path, args = json.loads(p.stdout)
    assert {"/usr/local/bin", "/usr/bin", "/bin", "/opt/slurm/bin"} <= set(path.split(":")) and args[0] == "slurm-healthcheck"


def test_the_slurm_conf_snippet_points_at_the_shipped_programs() -> None:
    conf = dict(line.split("=", 1) for line in code_lines(SLURM / "slurm.conf.snippet"))
    # Slurm runs HealthCheckProgram as a bare path: no room for arguments, hence the wrapper.
    assert conf["HealthCheckProgram"] == "/usr/local/bin/preflight-healthcheck"
    assert conf["HealthCheckInterval"] == "300" and conf["HealthCheckNodeState"] == "ANY"
    assert conf["PrologFlags"] == "Alloc" and conf["Prolog"].endswith(".sh") and " " not in conf["Prolog"]


# --- many nodes -------------------------------------------------------------------
#
# The multi-node examples run `preflight run --nnodes/--node-rank/--rdzv-endpoint/
# --rdzv-id/--rdzv-timeout`, `--multi-node` and `preflight pairwise`: the parser
# must accept each of them as written.

MULTINODE_JOB = K8S / "multinode-job.yaml"
DOCS = EXAMPLES.parent / "docs"


def option(args: list[str], name: str) -> str | None:
    """The value of ``name`` in ``args``, written ``--name=V`` or ``--name V``."""
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def kube_expand(arg: str, env: dict[str, str]) -> str:
    """What the kubelet does to command and args: ``$(VAR)`` of a variable the
    container has becomes its value, ``$$`` a literal ``$``, anything else stays."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), arg)


def test_kube_expand_is_the_kubelets_substitution() -> None:
    env = {"JOB_COMPLETION_INDEX": "3"}
    assert kube_expand("--node-rank=$(JOB_COMPLETION_INDEX)", env) == "--node-rank=3"
    assert kube_expand("$$(JOB_COMPLETION_INDEX)", env) == "$(JOB_COMPLETION_INDEX)"
    assert kube_expand("$(UNSET)", env) == "$(UNSET)"


def multinode_job() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The Service, the Job, its pod spec and its one container."""
    d = docs(MULTINODE_JOB)
    assert set(d) == {"Service", "Job"}
    pod = d["Job"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    return d["Service"], d["Job"], pod, c


def test_the_multinode_job_is_indexed_with_a_headless_service_for_its_pods_names() -> None:
    svc, job, pod, _ = multinode_job()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] >= 2  # every pod at once, or they never all meet
    # A failed index is not retried, and a failure does not end the Job while the others still run.
    assert spec["backoffLimitPerIndex"] == 0 and "backoffLimit" not in spec
    assert pod["restartPolicy"] == "Never"
    # <job>-<index>.<service> resolves only with the Service as the pods' subdomain ...
    assert pod["subdomain"] == svc["metadata"]["name"]
    # ... a headless one, selecting these pods, publishing them before they are Ready.
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc.get("metadata", {}).get("namespace") == job.get("metadata", {}).get("namespace")


def test_the_multinode_job_puts_one_pod_on_each_node_with_all_its_gpus_and_a_real_shm() -> None:
    _, job, pod, c = multinode_job()
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "IPC_LOCK" in c["securityContext"]["capabilities"]["add"]  # InfiniBand verbs pin memory
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_every_pod_of_the_multinode_job_runs_a_valid_command_for_its_own_rank() -> None:
    svc, job, _, c = multinode_job()
    name, n = job["metadata"]["name"], job["spec"]["completions"]
    args = preflight_args([*c.get("command", []), *c.get("args", [])])
    assert args is not None and args[0] == "run"
    assert option(args, "--profile") == "auto"
    assert option(args, "--nnodes") == str(n)
    assert option(args, "--node-rank") == "$(JOB_COMPLETION_INDEX)"  # the Job controller sets it in every pod
    assert option(args, "--rdzv-id") == name
    host, _, port = (option(args, "--rdzv-endpoint") or "").rpartition(":")
    assert host == f"{name}-0.{svc['metadata']['name']}"  # pod 0, node rank 0, hosts the store
    # torchrun's store on PORT, preflight's meeting point on PORT+1: both through the Service, both declared.
    assert {int(port), int(port) + 1} <= {p["port"] for p in svc["spec"]["ports"]}
    assert {int(port), int(port) + 1} <= {p["containerPort"] for p in c["ports"]}
    # Pod 0's name resolves only once pod 0 is scheduled: the others wait for it within --rdzv-timeout.
    assert float(option(args, "--rdzv-timeout") or 0) >= 300
    for index in range(n):
        expanded = [kube_expand(a, {"JOB_COMPLETION_INDEX": str(index)}) for a in args]
        assert option(expanded, "--node-rank") == str(index)
        parse(expanded)


def test_the_multinode_job_writes_its_own_report_on_each_node_not_the_boot_gates() -> None:
    _, _, pod, c = multinode_job()
    args = preflight_args([*c.get("command", []), *c.get("args", [])]) or []
    report = Path(option(args, "--report") or "")
    assert report != Path("/var/lib/preflight/report.json")  # a failed group would mark the good nodes failed
    (mount,) = [m for m in c["volumeMounts"] if report.parent == Path(m["mountPath"])]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert vol["hostPath"]["path"] == mount["mountPath"]


def sbatch_options(path: Path) -> dict[str, str]:
    """The #SBATCH options: ``--key=value``, ``--key value``, ``-N 2``, or a bare flag ("")."""
    opts = {}
    for line in path.read_text().splitlines():
        if line.startswith("#SBATCH "):
            words = shlex.split(line[len("#SBATCH "):])
            key, _, value = words[0].partition("=")
            opts[key] = value or " ".join(words[1:])
    return opts


@pytest.mark.parametrize("name", ["multinode.sbatch", "pairwise.sbatch"])
def test_the_sbatch_scripts_ask_for_whole_nodes_one_task_each(name: str) -> None:
    script = SLURM / name
    assert script.read_text().startswith("#!/bin/bash\n")
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout
    # sbatch stops reading #SBATCH at the first command.
    lines = script.read_text().splitlines()
    first_code = lines.index(code_lines(script)[0])
    assert max(i for i, line in enumerate(lines) if line.startswith("#SBATCH ")) < first_code
    opts = sbatch_options(script)
    assert int(opts.get("-N") or opts["--nodes"]) >= 2
    assert opts["--ntasks-per-node"] == "1"  # preflight starts one rank per GPU itself
    assert opts.get("--gpus-per-node") == "8" or "--exclusive" in opts
    assert opts["--time"]


@pytest.fixture
def srun(recorders: Path) -> Path:
    """An `srun` that records its arguments and runs the command after its options
    on "gpu-01", as one task of a step would, and an `scontrol` that lists the nodes."""
    tmp = recorders.parent
    (recorders / "srun").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp}/srun.args"\n'
        'while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done\n'
        'SLURMD_NODENAME=gpu-01 exec "$@"\n')
    (recorders / "scontrol").write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "gpu-01\\ngpu-02\\ngpu-03\\n"\n')
    for f in ("srun", "scontrol"):
        (recorders / f).chmod(0o755)
    return recorders


def test_the_multinode_sbatch_runs_one_valid_preflight_per_node_and_passes_its_exit_code(srun: Path, tmp_path: Path) -> None:
    env = _env(srun, SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_NODELIST="gpu-[01-03]", FAKE_EXIT="1")
    done = subprocess.run(["bash", str(SLURM / "multinode.sbatch"), "--profile", "h100-sxm"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr  # srun's exit code: the highest of its tasks'
    srun_args = (tmp_path / "srun.args").read_text().splitlines()
    assert "--ntasks-per-node=1" in srun_args and "--kill-on-bad-exit=0" in srun_args
    args = (tmp_path / "preflight.args").read_text().splitlines()
    where = tmp_path / "preflight-4242"
    assert args == ["run", "--multi-node", "--report", f"{where}/gpu-01.json", "--profile", "h100-sxm"]
    parse(args)
    assert f"reports in {where}" in done.stdout


def test_the_multinode_sbatch_says_each_nodes_verdict(srun: Path, tmp_path: Path, reports: dict[str, Path]) -> None:
    d = tmp_path / "preflight-4242"
    d.mkdir()
    (d / "gpu-01.json").write_text(reports["pass"].read_text())
    (d / "gpu-02.json").write_text(reports["fail"].read_text())
    env = _env(srun, SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_NODELIST="gpu-[01-03]")
    done = subprocess.run(["bash", str(SLURM / "multinode.sbatch")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = done.stdout.splitlines()
    assert "gpu-01: pass" in said
    assert "gpu-02: fail: shm FAIL: /dev/shm is 64 MiB, below the 1 GiB floor" in said
    assert "gpu-03: no report (FileNotFoundError)" in said


def test_the_pairwise_sbatch_runs_a_valid_pairwise(recorders: Path, tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(SLURM / "pairwise.sbatch"), "--tolerance", "0.7"], env=_env(recorders, FAKE_EXIT="1"),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr  # pairwise's own
    args = (tmp_path / "preflight.args").read_text().splitlines()
    assert args[0] == "pairwise" and args[-2:] == ["--tolerance", "0.7"]
    parse(args)


# many-nodes.md's prose names subcommands and placeholders (`preflight run --nnodes N`); the deploy pages' give whole lines.
@pytest.mark.parametrize("page, at_least, prose", [
    ("many-nodes.md", 4, False), ("boot-gate.md", 8, True), ("slurm.md", 10, True), ("kubernetes.md", 4, True),
    ("prometheus.md", 3, True), ("upgrade.md", 4, True),
])
def test_every_preflight_command_in_the_how_to_pages_is_valid(page: str, at_least: int, prose: bool) -> None:
    section = (DOCS / page).read_text()
    found = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            # the command, not the unit, the checkout or the namespace (`kubectl -n preflight`)
            if "preflight" in words and words[0] not in ("cd", "systemctl", "journalctl", "kubectl"):
                found.append(words[words.index("preflight") + 1:])
    if prose:  # the command lines the prose gives in `code`, which a reader copies as well
        found += [shlex.split(span.replace("\n", " "))[1:] for span in re.findall(r"`(preflight [^`]+)`", section)]
    assert len(found) >= at_least, found
    for args in found:
        parse(args)
