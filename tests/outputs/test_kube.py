"""`preflight kube-label`: the decision held to a cluster (the cap, the node as read), the
API client, then the real command against FakeKubeApi with report files a real `preflight run`
wrote. The pure decision on recorded nodes: tests/outputs/test_kube_decide.py."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import fakes
from conftest import clean_env
from preflight.outputs.schedulers import kube, kube_api, kube_cap
from preflight.base.errors import UsageError
from preflight.pipeline.report import DEFAULT_REPORT_PATH
from test_kube_decide import FAILED, GPU_NODE, OTHER_TAINTS, OUR_TAINT, PASSED, node_json
from test_systemd import parse_command_line


# --- the decision held to the cluster and the node as read ---------------------------


def cluster(tainted: int, total: int) -> dict[str, dict[str, Any]]:
    nodes = {"gpu-node-17": node_json(label="pass")}
    for i in range(total - 1):
        other = node_json(label="fail" if i < tainted else "pass", ours=OUR_TAINT if i < tainted else None)
        other["metadata"]["name"] = f"gpu-node-{100 + i}"
        nodes[f"gpu-node-{100 + i}"] = other
    return nodes


def test_no_taint_past_the_share_of_the_cluster_preflight_may_hold_and_one_within_it() -> None:
    with fakes.FakeKubeApi(cluster(tainted=1, total=10)) as api:
        change = kube.apply(kube_api.Api(api.url), FAILED, "gpu-node-17", taint=True)
        held = "would taint: 1 of 10 nodes already tainted by preflight, past the cap (10% of the nodes, at least 1: --taint-cap)"
        # Labelled, not tainted, and the node says why where `kubectl describe node` shows it.
        assert change.patch == {"metadata": {"labels": {"preflight/result": "fail"}, "annotations": {"preflight/held-back": held}}}
        assert held in change.what
        assert api.nodes["gpu-node-17"]["spec"]["taints"] == OTHER_TAINTS
        assert api.nodes["gpu-node-17"]["metadata"]["annotations"] == {"preflight/held-back": held}
        assert kube.apply(kube_api.Api(api.url), FAILED, "gpu-node-17", taint=True).patch is None  # said once, not at every round
    with fakes.FakeKubeApi(cluster(tainted=1, total=20)) as api:
        kube.apply(kube_api.Api(api.url), FAILED, "gpu-node-17", taint=True)
        assert api.nodes["gpu-node-17"]["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]
    with fakes.FakeKubeApi(cluster(tainted=1, total=10)) as api:  # a site that allows more
        kube.apply(kube_api.Api(api.url), FAILED, "gpu-node-17", taint=True, cap=0.5)
        assert api.nodes["gpu-node-17"]["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]


def test_the_textfile_says_a_held_taint_each_round_and_its_lifting(reports: dict[str, Path], tmp_path: Path) -> None:
    # As the DaemonSet runs it, with node_exporter's textfile directory: the alert in
    # examples/prometheus/preflight-kube-rules.yml reads what it writes.
    with fakes.FakeKubeApi(cluster(tainted=1, total=10)) as api:
        done = kube_label(api, reports["fail"], "--taint", "--textfile-dir", str(tmp_path))
        assert done.returncode == 1 and "would taint: 1 of 10 nodes already tainted by preflight, past the cap" in done.stdout
        text = (tmp_path / "preflight-kube.prom").read_text()
        assert 'preflight_kube_taint_held{node="gpu-node-17"} 1' in text and 'preflight_kube_tainted_by_preflight{node="gpu-node-17"} 1' in text
        assert api.nodes["gpu-node-17"]["spec"]["taints"] == OTHER_TAINTS
        api.nodes["gpu-node-100"]["spec"]["taints"] = OTHER_TAINTS  # that node is mended: the cap has room again
        again = kube_label(api, reports["fail"], "--taint", "--textfile-dir", str(tmp_path))
        assert again.returncode == 1 and api.nodes["gpu-node-17"]["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]
        assert "preflight/held-back" not in api.nodes["gpu-node-17"]["metadata"]["annotations"]  # tainted now: nothing held back
        assert 'preflight_kube_taint_held{node="gpu-node-17"} 0' in (tmp_path / "preflight-kube.prom").read_text()


def test_the_cap_counts_gpu_nodes_only() -> None:
    # Ten GPU nodes (one tainted) and thirty CPU and control-plane nodes: 10% of the cluster would be 4
    # taints, every GPU node but six; of the GPU nodes it is one, held already.
    nodes = cluster(tainted=1, total=10)
    for i in range(30):
        cpu = copy.deepcopy(GPU_NODE)
        cpu["metadata"].update(name=f"cpu-{i}", labels={"kubernetes.io/hostname": f"cpu-{i}"})
        nodes[f"cpu-{i}"] = cpu
    with fakes.FakeKubeApi(nodes) as api:
        change = kube.apply(kube_api.Api(api.url), FAILED, "gpu-node-17", taint=True)
        assert "would taint: 1 of 10 nodes already tainted by preflight, past the cap" in " ".join(change.what)
        assert change.counted == kube_cap.Count(1, 10, 1)


def test_a_conflict_retried_says_the_device_plugins_shortfall_once() -> None:
    short = node_json(label="pass")
    short["status"] = {"allocatable": {"nvidia.com/gpu": "7"}}
    with fakes.FakeKubeApi({"gpu-node-17": short}) as api:
        api.conflicts = 1
        change = kube.apply(kube_api.Api(api.url), PASSED._replace(gpus=8), "gpu-node-17", taint=False)
        assert change.standing is not None and change.standing.reason.count("device plugin advertises") == 1


def test_a_node_list_it_may_not_read_keeps_the_taint_off_and_says_why() -> None:
    with fakes.FakeKubeApi(cluster(tainted=0, total=3)) as api:
        api.list_fail = 403
        change = kube.apply(kube_api.Api(api.url), FAILED, "gpu-node-17", taint=True)
        assert api.nodes["gpu-node-17"]["spec"]["taints"] == OTHER_TAINTS
        (said,) = [w for w in change.what if w.startswith("not tainted")]
        assert "could not be counted for the cap" in said and "not allowed to get the node list" in said and "nodes: get, list, patch" in said


def test_the_scheduler_view_through_the_cli(reports: dict[str, Path], tmp_path: Path) -> None:
    report = json.loads(reports["pass"].read_text())
    report["shape"] = {"gpus": 8, "gpus_from": "the PCI bus and /dev/nvidia0-7"}
    (path := tmp_path / "r.json").write_text(json.dumps(report))
    short = node_json(label="pass")
    short["status"] = {"allocatable": {"nvidia.com/gpu": "7"}}
    with fakes.FakeKubeApi({"gpu-node-17": short}) as api:
        done = kube_label(api, path, "--taint")
        assert done.returncode == 1, done.stderr
        assert "NOT vouched (device plugin advertises 7 of 8 GPUs (nvidia.com/gpu allocatable))" in done.stdout
        labels = api.nodes["gpu-node-17"]["metadata"]["labels"]
        assert (labels["preflight/result"], labels["preflight/action"]) == ("fail", "drain")
        assert api.nodes["gpu-node-17"]["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]


# --- the API client ------------------------------------------------------------


def test_in_cluster_config_from_the_kubelets_environment() -> None:
    assert kube_api.Api.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}).base == "https://10.96.0.1:443"
    assert kube_api.Api.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "6443"}).base == "https://[fd00:10:96::1]:6443"
    with pytest.raises(UsageError, match="KUBERNETES_SERVICE_HOST is not set"):
        kube_api.Api.in_cluster({})


def test_a_conflict_reads_the_node_again_and_patches_the_fresh_copy() -> None:
    with fakes.FakeKubeApi({"gpu-node-17": node_json(label="pass")}) as api:
        api.conflicts = 1  # another controller wrote between our GET and PATCH
        change = kube.apply(kube_api.Api(api.url), FAILED, "gpu-node-17", taint=True)
        assert change.what == ("label preflight/result=fail", "taint preflight/failed=true:NoSchedule")
        assert api.count("GET", "gpu-node-17") == 2 and len(api.patches) == 2
        assert api.patches[1][1]["metadata"]["resourceVersion"] == "81735"  # the fresh copy's
        assert api.nodes["gpu-node-17"]["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]


def test_an_api_server_that_does_not_answer_is_a_timeout_line() -> None:
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}) as api:
        api.stall = 20.0
        started = time.monotonic()
        with pytest.raises(kube_api.KubeError, match=r"did not answer GET within 0.3 s"):
            kube_api.Api(api.url, timeout=0.3).get_node("gpu-node-17")
        assert time.monotonic() - started < 10  # its own deadline, not the server's 20 s (loose: a busy machine stalls too)


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if not shutil.which("openssl"):
        pytest.skip("needs openssl to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


def test_in_cluster_https_sends_the_token_read_afresh_each_time(tls_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    shutil.copy(tls_pair[0], sa / "ca.crt")
    (sa / "token").write_text("first-token\n")
    monkeypatch.setattr(kube_api, "SA_DIR", sa)
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}, tls=tls_pair) as api:
        port = api.url.rsplit(":", 1)[1]
        client = kube_api.Api.in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port})
        kube.apply(client, PASSED, "gpu-node-17", taint=False)
        (sa / "token").write_text("rotated-token\n")  # the kubelet rotates it under a running pod
        client.get_node("gpu-node-17")
        assert [auth for _, _, auth in api.requests] == ["Bearer first-token", "Bearer first-token", "Bearer rotated-token"]
        shutil.copy(Path(__file__), sa / "ca.crt")  # not a certificate
        with pytest.raises(kube_api.KubeError, match="cannot load the cluster CA"):
            client.get_node("gpu-node-17")


def test_a_certificate_from_another_ca_is_refused(tls_pair: tuple[Path, Path], tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other",
                    "-keyout", str(other / "key.pem"), "-out", str(other / "ca.crt")], check=True, capture_output=True)
    (other / "token").write_text("t")
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}, tls=tls_pair) as api:
        with pytest.raises(kube_api.KubeError, match=r"TLS with the API server at https://127.0.0.1:\d+ failed .*CERTIFICATE_VERIFY_FAILED"):
            kube_api.Api(api.url, sa_dir=other).get_node("gpu-node-17")


# --- the command, end to end -------------------------------------------------------


def kube_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if not k.startswith("KUBERNETES_") and k != "NODE_NAME"}
    return {**env, **extra}


def kube_label(api: fakes.FakeKubeApi, report: Path, *args: str, node_name: str = "gpu-node-17") -> subprocess.CompletedProcess:
    return subprocess.run([*fakes.PREFLIGHT, "kube-label", "--api-server", api.url, "--report", str(report), *args],
                          env=kube_env(NODE_NAME=node_name), capture_output=True, text=True, timeout=60)


def test_pass_labels_once_and_then_leaves_the_node_alone(reports: dict[str, Path]) -> None:
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}) as api:
        first = kube_label(api, reports["pass"])
        assert first.returncode == 0, first.stderr
        assert api.patches == [("application/strategic-merge-patch+json", {"metadata": {"labels": {"preflight/result": "pass"}}})]
        assert "vouched (passed" in first.stdout and "label preflight/result=pass" in first.stdout
        again = kube_label(api, reports["pass"], "--taint")
        assert again.returncode == 0 and len(api.patches) == 1
        assert "preflight/result=pass already, nothing to change" in again.stdout
        assert api.requests[0][2] is None  # no token over plain http


def test_fail_with_taint_then_pass_again(reports: dict[str, Path]) -> None:
    with fakes.FakeKubeApi({"gpu-node-17": node_json(label="pass")}) as api:
        failed = kube_label(api, reports["fail"], "--taint")
        assert failed.returncode == 1
        assert "NOT vouched (shm FAIL: /dev/shm is 64 MiB" in failed.stdout
        now = api.nodes["gpu-node-17"]
        assert now["metadata"]["labels"]["preflight/result"] == "fail"
        assert now["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]
        assert now["metadata"]["labels"]["preflight/action"] == "drain"  # the host's small /dev/shm: the node's setup
        assert {k: v for k, v in now["metadata"]["labels"].items() if not k.startswith("preflight/")} == GPU_NODE["metadata"]["labels"]
        passed = kube_label(api, reports["pass"], "--taint")
        assert passed.returncode == 0, passed.stderr
        assert now["metadata"]["labels"]["preflight/result"] == "pass" and "preflight/action" not in now["metadata"]["labels"]
        assert now["spec"]["taints"] == OTHER_TAINTS
        assert [ctype for ctype, _ in api.patches] == ["application/strategic-merge-patch+json"] * 2


def test_fail_without_taint_only_labels(reports: dict[str, Path]) -> None:
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}) as api:
        done = kube_label(api, reports["fail"])
        assert done.returncode == 1
        assert api.patches == [("application/strategic-merge-patch+json", {"metadata": {"labels": {"preflight/result": "fail", "preflight/action": "drain"}}})]
        assert api.nodes["gpu-node-17"]["spec"]["taints"] == OTHER_TAINTS


def test_dry_run_reads_but_never_writes(reports: dict[str, Path]) -> None:
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}) as api:
        done = kube_label(api, reports["fail"], "--taint", "--dry-run")
        # The node, then the node list the cap is counted on.
        assert done.returncode == 1 and api.patches == [] and api.count("GET", "gpu-node-17") == 1 and api.count("GET") == 2
        line, request, body = done.stdout.splitlines()
        assert line.endswith("would label preflight/result=fail, label preflight/action=drain, taint preflight/failed=true:NoSchedule")
        # The very PATCH the real round sends: the node's own taints back, with the resourceVersion read.
        assert request == "PATCH /api/v1/nodes/gpu-node-17 (application/strategic-merge-patch+json)"
        assert json.loads(body) == {"metadata": {"labels": {"preflight/result": "fail", "preflight/action": "drain"}, "resourceVersion": "81734"},
                                    "spec": {"taints": [*OTHER_TAINTS, OUR_TAINT]}}


def test_dry_run_outside_a_cluster_shows_the_patch_for_the_node_it_names(reports: dict[str, Path]) -> None:
    # On the host, by hand: no KUBERNETES_SERVICE_HOST, no API server, no NODE_NAME.
    done = subprocess.run([*fakes.PREFLIGHT, "kube-label", "--dry-run", "--taint", "--report", str(reports["fail"]), "--node", "gpu-node-17"],
                          env=kube_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == "", done.stderr
    line, request, body = done.stdout.splitlines()
    assert line.startswith("gpu-node-17: NOT vouched (shm FAIL: /dev/shm is 64 MiB")
    assert "would label preflight/result=fail, label preflight/action=drain, taint preflight/failed=true:NoSchedule (node not read: not in a pod, KUBERNETES_SERVICE_HOST is not set" in line
    assert request == "PATCH /api/v1/nodes/gpu-node-17 (application/strategic-merge-patch+json)"
    assert json.loads(body)["spec"]["taints"][-1] == OUR_TAINT
    # No name given: the kubelet's default, the hostname, said on stderr.
    done = subprocess.run([*fakes.PREFLIGHT, "kube-label", "--dry-run", "--report", str(reports["pass"])],
                          env=kube_env(), capture_output=True, text=True, timeout=60)
    host = os.uname().nodename.lower()
    assert done.returncode == 0, done.stderr
    assert f"the node name is taken from the hostname, {host}" in done.stderr
    assert done.stdout.startswith(f"{host}: vouched (passed") and f"PATCH /api/v1/nodes/{host} " in done.stdout


def test_dry_run_with_the_api_server_unreachable_still_previews(reports: dict[str, Path]) -> None:
    with fakes.FakeKubeApi({}) as api:
        url = api.url  # closed on leaving: nothing listens there now
    done = subprocess.run([*fakes.PREFLIGHT, "kube-label", "--api-server", url, "--dry-run", "--report", str(reports["fail"]), "--node", "n"],
                          env=kube_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == ""
    line, _, body = done.stdout.splitlines()
    assert f"would label preflight/result=fail, label preflight/action=drain (node not read: cannot reach the API server at {url}: Connection refused; this is the most it would change)" in line
    assert json.loads(body) == {"metadata": {"labels": {"preflight/result": "fail", "preflight/action": "drain"}}}


def test_forbidden_names_the_rbac_to_grant(reports: dict[str, Path]) -> None:
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}) as api:
        api.fail = 403
        done = kube_label(api, reports["pass"])
        assert done.returncode == 1 and api.patches == []
        assert done.stderr.count("\n") == 1
        assert "not allowed to get node gpu-node-17: grant the ServiceAccount a ClusterRole with nodes: get, list, patch" in done.stderr


def test_an_unknown_node_name_says_where_the_name_comes_from(reports: dict[str, Path]) -> None:
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}) as api:
        done = kube_label(api, reports["pass"], node_name="gpu-node-17.cluster.local")
        assert done.returncode == 1
        assert "no node named 'gpu-node-17.cluster.local'" in done.stderr and "spec.nodeName" in done.stderr


def test_no_api_server_is_one_line_and_exit_1(reports: dict[str, Path]) -> None:
    with fakes.FakeKubeApi({}) as api:
        url = api.url
    done = subprocess.run([*fakes.PREFLIGHT, "kube-label", "--api-server", url, "--report", str(reports["pass"]), "--node", "n"],
                          env=kube_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == f"preflight: error: cannot reach the API server at {url}: Connection refused; node n left as it is"


@pytest.mark.parametrize(("args", "env", "said"), [
    ([], {}, "no node name: set NODE_NAME from the downward API"),
    (["--node", "n"], {}, "KUBERNETES_SERVICE_HOST is not set"),
    (["--node", "n", "--every", "0"], {}, "--every 0: give a number of seconds above 0"),
    (["--node", "n", "--api-server", "127.0.0.1:8001"], {}, "--api-server 127.0.0.1:8001: give a URL"),
    (["--node", "n", "--taint-cap", "0"], {}, "--taint-cap 0: give the share of the cluster's nodes preflight may have tainted at once"),
    (["--node", "n", "--taint-cap", "1.5"], {}, "--taint-cap 1.5: give the share"),
    (["--node", "n", "--api-server", "http://127.0.0.1:9", "--textfile-dir", "/nonexistent/dir"], {}, "--textfile-dir /nonexistent/dir is not a directory"),
])
def test_usage_errors_exit_2_with_one_line(args: list[str], env: dict[str, str], said: str) -> None:
    done = subprocess.run([*fakes.PREFLIGHT, "kube-label", *args], env=kube_env(**env), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and said in done.stderr


def wait_for(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_every_rereads_survives_errors_writes_only_on_change_and_stops_on_sigterm(reports: dict[str, Path], tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    shutil.copy(reports["fail"], report)
    with fakes.FakeKubeApi({"gpu-node-17": node_json()}) as api:
        api.fail = 403  # RBAC not applied yet: the loop must log and carry on
        proc = subprocess.Popen([*fakes.PREFLIGHT, "kube-label", "--api-server", api.url, "--report", str(report), "--taint", "--every", "0.1"],
                                env=kube_env(NODE_NAME="gpu-node-17"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: api.count("GET") >= 3)
            api.fail = None
            wait_for(lambda: len(api.patches) == 1)
            gets = api.count("GET")
            wait_for(lambda: api.count("GET") >= gets + 5)
            assert len(api.patches) == 1  # already right: no write every round
            assert api.nodes["gpu-node-17"]["spec"]["taints"] == [*OTHER_TAINTS, OUR_TAINT]
            shutil.copy(reports["pass"], report)  # the recheck timer wrote a pass
            wait_for(lambda: len(api.patches) == 2)
            assert api.nodes["gpu-node-17"]["spec"]["taints"] == OTHER_TAINTS
            assert proc.poll() is None
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0
    assert time.monotonic() - sent < 10  # not a whole --every round plus a stalled call: it stops at once
    assert err.count("not allowed to get node gpu-node-17") == 1, err  # said once, not every round
    lines = out.splitlines()
    assert len(lines) == 2, out
    assert "taint preflight/failed=true:NoSchedule" in lines[0] and "remove taint preflight/failed" in lines[1]


# --- the GPU Operator gate (examples/kubernetes/check-daemonset.yaml) ----------------------

MANIFESTS = Path(__file__).parents[2] / "examples" / "kubernetes"


def check_pod() -> dict[str, Any]:
    (ds,) = [d for d in yaml.safe_load_all((MANIFESTS / "check-daemonset.yaml").read_text()) if d]
    return ds


def test_the_gpu_operator_gate_sees_every_gpu_without_holding_one_and_writes_the_hosts_report() -> None:
    ds = check_pod()
    pod = ds["spec"]["template"]["spec"]
    labeler = next(d for d in yaml.safe_load_all((MANIFESTS / "daemonset.yaml").read_text()) if d["kind"] == "DaemonSet")
    assert ds["metadata"]["namespace"] == labeler["metadata"]["namespace"]
    assert pod["nodeSelector"] == labeler["spec"]["template"]["spec"]["nodeSelector"]
    assert pod["runtimeClassName"] == "nvidia"  # the GPU Operator's RuntimeClass
    assert {"key": "preflight/failed", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    wait, gate = pod["initContainers"]
    (recheck,) = pod["containers"]
    assert "/run/nvidia/validations/toolkit-ready" in wait["command"][-1]
    for c in (gate, recheck):
        # A request for nvidia.com/gpu would hold GPUs from jobs for as long as the pod runs.
        assert not any(k.startswith("nvidia.com/") for part in c.get("resources", {}).values() for k in part)
        assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in c["env"]
        params = parse_command_line(c["args"])
        assert params["report"] == DEFAULT_REPORT_PATH and params["if_idle"] is True
        assert params["textfile_dir"] == Path("/var/lib/preflight/textfile")  # where the systemd units put it
        assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        # Every capability dropped but the kernel log's: the Xids since boot are judged.
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert parse_command_line(gate["args"])["skip"] in (None, [], ())  # the gate runs every check
    assert parse_command_line(gate["args"])["level"] == "standard" and parse_command_line(recheck["args"])["level"] == "quick"
    assert "preflight status --report=/var/lib/preflight/report.json" in recheck["command"][2]
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host["state"] == "/var/lib/preflight" and host["textfile"] == "/var/lib/preflight/textfile"


def manifest_sh(container: dict[str, Any], state: Path, *extra: str) -> list[str]:
    """The container's command line to run here: the host's /var/lib/preflight is ``state``."""
    return [a.replace("/var/lib/preflight", str(state)) for a in [*container["command"], *container["args"], *extra]]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    (tmp_path / "textfile").mkdir()
    (tmp_path / "weak.toml").write_text("[floors]\nshm_min_bytes = 1048576\n")  # any /dev/shm passes: a fast pass
    (tmp_path / "strict.toml").write_text("[floors]\nshm_min_bytes = 1125899906842624\n")  # 1 PiB: a real FAIL
    return tmp_path


def sh_env() -> dict[str, str]:
    # `preflight` as the image has it: this interpreter's console script on PATH.
    return {**clean_env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def test_the_gpu_operator_gates_verdict_lets_the_pod_go_on_and_a_broken_config_does_not(state: Path) -> None:
    _, gate = check_pod()["spec"]["template"]["spec"]["initContainers"]
    fast = ["--profile=cpu", "--only=shm"]
    failed = subprocess.run(manifest_sh(gate, state, *fast, f"--config={state / 'strict.toml'}"), env=sh_env(), capture_output=True, text=True, timeout=120)
    assert failed.returncode == 0, failed.stderr  # the pod goes on, and kube-label reads the FAIL
    assert json.loads((state / "report.json").read_text())["verdict"] == "fail"
    assert "preflight_run_passed 0.0" in (state / "textfile" / "preflight.prom").read_text()
    broken = subprocess.run(manifest_sh(gate, state, *fast, "--profile=no-such-gpu"), env=sh_env(), capture_output=True, text=True, timeout=120)
    assert broken.returncode == 2, broken.stderr  # Init:CrashLoopBackOff: a config to fix, not a verdict


def test_the_gpu_operator_recheck_runs_only_while_the_gate_stands_passed(state: Path) -> None:
    _, gate = check_pod()["spec"]["template"]["spec"]["initContainers"]
    (recheck,) = check_pod()["spec"]["template"]["spec"]["containers"]
    assert "while sleep 3600;" in recheck["command"][2]
    recheck = {**recheck, "command": [a.replace("sleep 3600", "sleep 0.2") for a in recheck["command"]]}
    report = state / "report.json"

    def finished() -> str:
        return json.loads(report.read_text())["finished_at"]

    def recheck_for(seconds: float) -> float:
        """Run the recheck loop until it rewrites the report or ``seconds`` pass; how long that took."""
        before, started = finished(), time.monotonic()
        proc = subprocess.Popen(manifest_sh(recheck, state, "--profile=cpu", "--only=shm", f"--config={state / 'weak.toml'}"),
                                env=sh_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            while finished() == before and time.monotonic() - started < seconds:
                time.sleep(0.1)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        return time.monotonic() - started

    def gate_with(config: str) -> None:
        subprocess.run(manifest_sh(gate, state, "--profile=cpu", "--only=shm", f"--config={state / config}"), env=sh_env(), timeout=120, check=True)

    gate_with("weak.toml")
    passed = finished()
    took = recheck_for(60)
    assert finished() != passed  # the gate stands passed: the recheck ran
    gate_with("strict.toml")
    failed = finished()
    recheck_for(max(1.5 * took, 2.0))  # long enough for the loop to have rechecked, were it going to
    assert finished() == failed  # a failed gate is never overwritten by a lighter recheck's pass
