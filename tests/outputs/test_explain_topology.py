"""`preflight explain` of `nvidia-smi topo -m`: the same judges and facts as
`preflight topology --from`, as findings, and the same refusal of a damaged matrix."""

import json
import os
import subprocess
import sys

import pytest
import fakes
from conftest import FIXTURES, assert_index_facts, needs_root
from topology_cases import SPLIT, TOPO
from typer.testing import CliRunner

from preflight.base.errors import UsageError
from preflight.cli.app import app
from preflight.outputs.explain import explain_topology
from preflight.pipeline import profiles

SEVERITY = {"FAIL": "fail", "ERROR": "fail", "WARN": "warn"}


def profile(name: str) -> profiles.ResolvedProfile:
    path = profiles.find(name, None)
    return profiles.resolve(profiles.load(path), path, {}, f"--profile {name}")


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("name", sorted(p.name for p in TOPO.glob("*.txt")))
def test_each_capture_gives_its_index_facts_and_the_topology_commands_findings(name):
    path = TOPO / name
    e = explain_topology.explain(path.read_text(), str(path), None)
    assert (e.kind, e.title) == ("topology", "nvidia-smi topo -m")
    assert_index_facts(e.facts, name)
    said = json.loads(cli("topology", "--from", str(path), "--json").stdout)
    assert [(i.severity, i.summary, i.cause, i.fix) for i in e.findings] == [
        (SEVERITY.get(f["status"], "info"), f["summary"], f["cause"], f["remedy"]) for f in said["findings"]]
    assert e.facts["advice"] == said["advice"] and e.facts["profile"] is None


def test_a_4_4_split_warns_and_carries_the_pinning_advice():
    e = explain_topology.explain(SPLIT.read_text(), "topo.txt", None)
    (warn,) = e.findings
    assert (warn.severity, warn.summary) == ("warn", "GPUs span 2 NUMA nodes (node 0: GPU 0-3; node 1: GPU 4-7)")
    assert e.facts["spans_numa"] is True and e.facts["numa_nodes"] == [0, 1] and not e.failed
    assert "torchrun --numa-binding=node --nproc-per-node=8 train.py" in " ".join(e.facts["advice"]["launch"])
    assert e.facts["judged_against"] == "no profile (only what needs no SKU is judged)"


def test_a_named_profile_fails_what_the_sku_does_not_allow():
    path = TOPO / "18_rtx3090-2x_nv4-bridge_single-numa_gpu-numa-id.txt"
    e = explain_topology.explain(path.read_text(), str(path), profile("h100-sxm"))
    assert e.failed and {i.summary for i in e.findings if i.severity == "fail"} == {
        "NVLink below NV18 between 1 GPU pair(s)", "no NIC in the GPU topology"}
    said = json.loads(cli("topology", "--from", str(path), "--profile", "h100-sxm", "--json").stdout)
    assert [i.summary for i in e.findings] == [f["summary"] for f in said["findings"]]
    assert e.facts["profile"] == "h100-sxm" and e.facts["judged_against"] == "profile h100-sxm"


@pytest.mark.parametrize("text_of", [
    lambda: (TOPO / "malformed" / "M1_h100-8x_nv18_12nic_PASTE-CORRUPTED-PIXNODE.txt").read_text(),
    lambda: "",
    lambda: "# preflight\n\nDecide, in seconds, whether this GPU node will run a job.\n",
])
def test_a_damaged_matrix_is_refused_in_the_topology_commands_words(tmp_path, text_of):
    path = tmp_path / "capture.txt"
    path.write_text(text_of())
    with pytest.raises(UsageError) as e:
        explain_topology.explain(path.read_text(), str(path), None)
    r = cli("topology", "--from", str(path))
    assert r.exit_code == 2 and r.stderr == f"preflight: error: --from {e.value}\n"


@needs_root
def test_as_root_a_python_another_user_can_change_is_refused_before_the_layout_asks_it(tmp_path):
    # The layout asks the workers' torchrun whether it binds NUMA (--python's, from the config or
    # PREFLIGHT_PYTHON): as root, that interpreter is judged as `run` judges it, before it runs.
    python = tmp_path / "python"
    ran = tmp_path / "ran-as-root"
    python.write_text(f'#!/bin/sh\ntouch "{ran}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    os.chown(python, 65534, 65534)
    env = {**os.environ, "PREFLIGHT_PYTHON": str(python), "PREFLIGHT_NVML_FAKE": str(FIXTURES / "nvml" / "h100-sxm-8x-healthy.json")}
    p = subprocess.run([*fakes.PREFLIGHT, "topology"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"the workers' Python {python} would run as root, and another user decides what it does" in p.stderr
    assert not ran.exists()


def test_a_matrix_pasted_through_github_with_its_header_underline_half_left_is_explained_as_topology():
    # sglang issue 26039 (tests/fixtures/topo/SOURCE.md, escapes-lost/): "[4mGPU0 ... GPU NUMA ID[0m".
    from preflight.outputs.explain import kinds
    (path,) = (TOPO / "escapes-lost").glob("E1_*.txt")
    assert kinds.guess(path.read_text()) == "topology"
    e = explain_topology.explain(path.read_text(), str(path), None)
    assert e.kind == "topology" and len(e.facts["gpus"]) == 8
