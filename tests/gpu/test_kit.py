"""The GPU acceptance kit's parts that run without a GPU: run.sh's syntax and
budgets, its refusal of an OUT or SITE_DIR another user could plant, its
captures on this machine, the plain reference loop's dry run on
CPU, the site profile it writes, and the summary read from the H200 node's
own reports (tests/fixtures/node/h200-1x-vm). No figure is measured here."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

from preflight.pipeline import profiles

KIT = Path(__file__).parent
RUN = KIT / "run.sh"
NODE = FIXTURES / "node" / "h200-1x-vm"
sys.path.insert(0, str(KIT))
import kit  # noqa: E402  the kit's helper, run by path on the node as here


def budgets() -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^B_([A-Z]+)=(\d+)$", RUN.read_text(), re.M)}


def test_run_sh_is_valid_bash_and_passes_shellcheck_where_installed():
    subprocess.run(["bash", "-n", str(RUN)], check=True, timeout=30)
    if shellcheck := shutil.which("shellcheck"):
        p = subprocess.run([shellcheck, str(RUN), str(KIT / "prepare.sh")], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout


def test_the_step_budgets_add_up_to_at_most_8_minutes_and_every_step_has_one():
    b = budgets()
    assert set(b) == {"SETUP", "CAPTURES", "REFERENCE", "VERDICT", "FULL", "GENERIC", "PYTEST", "SUMMARY"}
    assert sum(b.values()) <= 480, b
    text = RUN.read_text()
    for name in b:
        assert re.search(rf'^step {name.lower()} "\$B_{name}" do_{name.lower()}$', text, re.M), name


def test_the_captures_seconds_fit_their_step_and_every_child_runs_under_a_deadline():
    text = RUN.read_text()
    caps = [int(s) for s in re.findall(r"^  cap \S+ (\d+) ", text, re.M)]
    assert len(caps) == 8 and sum(caps) <= budgets()["CAPTURES"]
    body = text[text.index("within() {"):]
    for line in body.splitlines():
        if re.search(r"\b(python3|nvidia-smi|torch\.distributed\.run)\b", line) and "within" not in line and "cap " not in line:
            assert re.match(r"\s*(#|echo|name=|builtin=|python3 -c 'import pytest'|python3 \"\$repo/tests/gpu/kit.py\" site-profile|n=\$\(within)", line), line


def kit_env(tmp_path: Path) -> dict:
    # This interpreter as the image's python3, and no wheels: the setup step is not chosen.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}


def venv_python3(tmp_path: Path) -> None:
    """kit_env's python3 as this interpreter itself (its venv, with torch and preflight), not a
    link to it, which would leave the venv behind: for the steps that run preflight."""
    python3 = tmp_path / "bin" / "python3"
    python3.unlink()
    python3.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python3.chmod(0o755)


def test_the_captures_step_bundles_what_this_machine_has_bytes_untouched(tmp_path):
    p = subprocess.run(["bash", str(RUN)], env={**kit_env(tmp_path), "STEPS": "captures"}, capture_output=True, text=True, timeout=120)
    out = tmp_path / "out"
    index = (out / "captures" / "INDEX.txt").read_text()
    for name in ("nvidia-smi-q.txt", "nvidia-smi-topo-m.txt", "nvidia-smi-q-d-performance-clock-power.txt", "lspci-vvv.txt",
                 "dmesg-tail.txt", "df-dev-shm.txt", "mount-dev-shm.txt", "numactl-H.txt"):
        assert re.search(rf"^{re.escape(name)}: (exit \d+|\S+ not found)", index, re.M), (name, index)
    if not shutil.which("nvidia-smi"):
        assert "nvidia-smi-q.txt: nvidia-smi not found" in index
    df = subprocess.run(["df", "-B1", "/dev/shm"], capture_output=True, timeout=30).stdout
    assert (out / "captures" / "df-dev-shm.txt").read_bytes().splitlines()[0] == df.splitlines()[0]
    assert " /dev/shm " in (out / "captures" / "mount-dev-shm.txt").read_text()
    steps = (out / "steps.tsv").read_text().splitlines()
    assert [row.split("\t")[0] for row in steps] == ["captures", "summary"]
    assert p.returncode == 1  # no level ran: not accepted
    assert "== captures (budget 35 s)" in p.stdout and (out / "kit.log").exists()


def test_the_reference_loop_dry_runs_on_cpu_with_the_keys_the_summary_reads(tmp_path):
    out = tmp_path / "reference.json"
    p = subprocess.run([sys.executable, str(KIT / "reference.py"), "--device", "cpu", "--gemm-n", "64", "--copy-bytes", str(1 << 20),
                        "--host-bytes", str(1 << 20), "--repeats", "2", "--warmup-seconds", "0", "--seconds", "0.05", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    keys = {row[2] for row in kit.BESIDE}
    assert keys <= set(doc) and all(doc[k] > 0 for k in keys)
    assert doc["method"]["gemm_n"] == 64 and doc["device"] == "cpu (dry run)"
    # The node's recorded plain loop has the keys of the figures it measured.
    recorded = json.loads((NODE / "reference-torch.json").read_text())
    assert {"d2d_copy_rw_Bps", "h2d_Bps", "d2h_Bps", "gemm_bf16_8192_Fps"} <= set(recorded)


def test_the_site_profile_shortens_burnin_and_memtest_and_loads_as_the_same_profile(tmp_path):
    src = profiles.find("h200-sxm", None)
    dest = tmp_path / "h200-sxm.toml"
    kit.site_profile(src, dest, {"burnin": 45, "memtest": 30})
    p = profiles.load(dest)
    assert (p.name, p.burnin.seconds, p.memtest.seconds) == ("h200-sxm", 45, 30)
    original = profiles.load(src)
    assert p.floors == original.floors and p.checks == original.checks
    with pytest.raises(SystemExit, match=r"no seconds in \[memtest_typo\]"):
        kit.site_profile(src, dest, {"burnin": 45, "memtest_typo": 30})


def node_out(tmp_path: Path) -> Path:
    """The H200 node's recorded reports laid out as run.sh leaves them."""
    out = tmp_path / "out"
    out.mkdir()
    for name, src in (("quick.json", "report-quick-keep-going.json"), ("standard.json", "report-standard-keep-going.json"),
                      ("full.json", "report-full-burnin-memtest-45s.json"), ("reference.json", "reference-torch.json")):
        shutil.copy(NODE / src, out / name)
    (out / "steps.tsv").write_text("torchrun1\t0\t10.7\t0\ntorchrun2\t0\t11.2\t0\nquick\t30\t3.5\t1\nstandard\t110\t41.0\t1\n")
    return out


def test_the_summary_of_the_h200_node_as_0_2_0_saw_it_lists_every_warn_and_fail_and_the_ratios(tmp_path):
    doc, lines = kit.summary(node_out(tmp_path))
    text = "\n".join(lines)
    assert doc["accepted"] is False and text.endswith("NOT ACCEPTED: see the findings above")
    found = {(f["level"], f["check"], f["status"]) for f in doc["findings"]}
    assert found == {("quick", "topology", "FAIL"), ("quick", "shm", "WARN"), ("standard", "topology", "FAIL"),
                     ("standard", "shm", "WARN"), ("standard", "bandwidth", "WARN")}
    assert "WARN shm: /dev/shm (128 GiB) is larger than physical memory (125.8 GiB)" in text
    ratios = {row["what"]: row["ratio"] for row in doc["figures"]}
    assert ratios["HBM copy (read + write)"] == pytest.approx(4.1029 / 4.2145, abs=1e-3)
    assert ratios["H2D pinned"] == pytest.approx(0.9994, abs=1e-3)
    assert ratios["train GEMM / sustained randn loop"] == pytest.approx(673.88 / 747.61, abs=1e-3)  # the 0.90 of issue 33
    assert ratios["burn-in GEMM / sustained [1, 2) loop"] is None  # the recorded loop did not measure it
    assert "burn-in GEMM / sustained [1, 2) loop: the plain loop gave no figure" in text
    assert "train GEMM / sustained randn loop: 673.9 T / 747.6 T = 0.901, DISAGREES (beyond 5%)" in text
    assert "HBM copy (read + write): 4.103 T / 4.214 T = 0.974, agrees" in text
    assert "  burn-in GPU 0: SM clock 1665-1695 MHz (min-median, top 1980), 692.454 W median, 57 C max" in lines
    assert "bare torchrun: 10.7 s, 11.2 s" in text and "standard: 41.0 s wall (3.83x the bare torchrun), 39.9 s of checks" in text
    assert "  full (burnin, memtest): 68.7 s of checks" in lines and "torchrun1" not in text


def test_the_summary_accepts_only_a_pass_at_every_level_with_no_warn(tmp_path):
    out = node_out(tmp_path)
    shutil.copy(out / "standard.json", out / "generic.json")
    for name in ("quick.json", "standard.json", "full.json", "generic.json"):
        doc = json.loads((out / name).read_text())
        for c in doc["checks"]:
            c["status"] = "SKIP" if c["status"] == "SKIP" else "PASS"
        doc["verdict"] = "pass"
        doc["profile"] = "generic" if name == "generic.json" else doc["profile"]
        (out / name).write_text(json.dumps(doc))
    assert kit.main(["summary", str(out)]) == 0
    assert json.loads((out / "acceptance.json").read_text())["accepted"] is True
    generic = json.loads((out / "generic.json").read_text())
    (out / "generic.json").write_text(json.dumps({**generic, "profile": "h200-sxm"}))  # a pass under another profile proves nothing of generic
    doc, lines = kit.summary(out)
    assert doc["accepted"] is False and "  standard, profile generic: verdict pass, 0 WARN/FAIL/ERROR, but it ran under profile 'h200-sxm'" in lines
    (out / "generic.json").write_text(json.dumps(generic))
    (out / "full.json").unlink()  # a level that left no report is no pass
    doc, lines = kit.summary(out)
    assert doc["accepted"] is False and "  full (burnin, memtest): no report" in lines


def test_the_summary_takes_the_bare_torchrun_and_the_levels_walls_from_the_verdict_step(tmp_path):
    out = node_out(tmp_path)
    (out / "steps.tsv").write_text("verdict\t180\t121.3\t1\n")
    bench = {"rounds": 3, "seconds": {"bare torchrun": [10.7, 11.2], "standard": [41.0, 43.0], "quick": [3.5, 3.7]},
             "exit_codes": {"bare torchrun": [0, 0, 1], "standard": [1, 1, 1], "quick": [1, 1, 1]},
             "checks": {"standard": [{"check": "cuda", "seconds": 9.4, "share": 0.236}, {"check": "train", "seconds": 11.0, "share": 0.276}]}}
    (out / "verdict.json").write_text(json.dumps(bench))
    doc, lines = kit.summary(out)
    text = "\n".join(lines)
    assert doc["bare_torchrun_seconds"] == [10.7, 11.2]  # the bench times only the bare runs that succeeded
    assert "bare torchrun: 10.7 s, 11.2 s" in text and "standard: 42.0 s wall (3.93x the bare torchrun), 39.9 s of checks" in text
    assert "quick: 3.6 s wall" in text
    assert "  standard, each check's share (median of 3 rounds): cuda 9.4 s (24%), train 11.0 s (28%)" in lines
    assert doc["time_to_verdict"] == bench and doc["steps"]["verdict"]["budget"] == 180
    assert "  total budget 180 s, spent 121.3 s" in lines


def test_the_verdict_step_runs_the_bench_and_leaves_the_levels_reports_for_the_summary(tmp_path):
    """One real round on this machine's CPUs (gloo, the cpu profile): the kit's glue, not its figures."""
    env = {**kit_env(tmp_path), "STEPS": "verdict", "PROFILE": "cpu", "VERDICT_ROUNDS": "1"}
    venv_python3(tmp_path)
    p = subprocess.run(["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=300)
    out = tmp_path / "out"
    assert [row.split("\t")[0] for row in (out / "steps.tsv").read_text().splitlines()] == ["verdict", "summary"], p.stdout
    bench = json.loads((out / "verdict.json").read_text())
    assert (bench["backend"], bench["ranks"], bench["profile"], bench["rounds"]) == ("gloo", 2, "cpu", 1)
    assert [row["check"] for row in bench["checks"]["standard"]] == ["shm", "nccl", "bandwidth", "train"]
    for level in ("quick", "standard"):
        assert json.loads((out / f"{level}.json").read_text())["level"] == level
    acceptance = json.loads((out / "acceptance.json").read_text())
    assert acceptance["bare_torchrun_seconds"] == bench["seconds"]["bare torchrun"] and acceptance["time_to_verdict"] == bench
    assert "where the standard run's time goes" in p.stdout and "standard, each check's share (median of 1 rounds)" in p.stdout


def test_the_generic_step_runs_the_standard_level_under_the_generic_profile_for_the_summary(tmp_path):
    """This machine has no GPU: generic FAILs it, and the summary says so; the kit's glue, not a GPU's verdict."""
    env = {**kit_env(tmp_path), "STEPS": "generic"}
    venv_python3(tmp_path)
    p = subprocess.run(["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=120)
    out = tmp_path / "out"
    assert [row.split("\t")[0] for row in (out / "steps.tsv").read_text().splitlines()] == ["generic", "summary"], p.stdout
    report = json.loads((out / "generic.json").read_text())
    assert (report["profile"], report["level"], report["keep_going"]) == ("generic", "standard", True)
    assert "== generic (budget 35 s)" in p.stdout and "  standard, profile generic: verdict fail" in p.stdout
    assert "FAIL cuda: no NVIDIA driver" in p.stdout and p.returncode == 1


def as_nobody(path: Path) -> Path:
    """PATH as another user's, as a user without root would plant it in /tmp."""
    if os.geteuid() != 0:
        pytest.skip("handing a directory to another user needs root")
    nobody = pwd.getpwnam("nobody")
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    return path


def planted(tmp_path: Path, case: str) -> dict[str, str]:
    """The environment of a run whose OUT or SITE_DIR another user could use against root."""
    d = tmp_path / "planted"
    if case == "OUT another user's":
        d.mkdir()
        return {"OUT": str(as_nobody(d))}
    if case == "OUT writable by others":
        d.mkdir(mode=0o777)
        d.chmod(0o777)
        return {"OUT": str(d)}
    if case == "OUT with a verdict in it":
        d.mkdir(mode=0o700)
        (d / "verdict.json").write_text('{"seconds": {"bare torchrun": [1.0]}}')
        return {"OUT": str(d)}
    if case == "OUT a link":
        (tmp_path / "mine").mkdir(mode=0o700)
        d.symlink_to(tmp_path / "mine")
        return {"OUT": str(d)}
    if case == "OUT under another user's directory":
        d.mkdir(mode=0o755)
        as_nobody(d)
        return {"OUT": str(d / "out")}
    if case == "SITE_DIR another user's":
        d.mkdir()
        (d / "sitecustomize.py").write_text("open(__file__ + '.ran', 'w')\n")
        return {"SITE_DIR": str(as_nobody(d))}
    if case == "SITE_DIR writable by others":
        d.mkdir()
        d.chmod(0o1777)  # sticky keeps others from removing it, not from planting a sitecustomize.py in it
        return {"SITE_DIR": str(d)}
    if case == "WHEEL_DIR another user's":
        d.mkdir()
        (d / "preflight-0-py3-none-any.whl").write_text("a wheel root would install")
        return {"WHEEL_DIR": str(as_nobody(d))}
    if case == "WHEEL_DIR writable by others, named with a trailing slash":
        d.mkdir()
        d.chmod(0o1777)
        return {"WHEEL_DIR": str(d) + "/"}
    if case == "WHEEL_DIR not there yet":
        return {"WHEEL_DIR": str(d / "wheels")}
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["OUT another user's", "OUT writable by others", "OUT with a verdict in it", "OUT a link",
                                  "OUT under another user's directory", "SITE_DIR another user's", "SITE_DIR writable by others",
                                  "WHEEL_DIR another user's", "WHEEL_DIR writable by others, named with a trailing slash", "WHEEL_DIR not there yet"])
def test_run_sh_refuses_an_out_or_site_dir_another_user_could_plant_before_writing_or_importing_anything(tmp_path, case):
    env = {**kit_env(tmp_path), "STEPS": " ", **planted(tmp_path, case)}
    before = sorted(p.name for p in (tmp_path / "planted").iterdir()) if (tmp_path / "planted").is_dir() else None
    p = subprocess.run(["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=60)
    name = case.split()[0]
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stdout == "" and len(p.stderr.splitlines()) == 1 and p.stderr.startswith(f"run.sh: refusing {name}="), p.stderr
    after = sorted(p.name for p in (tmp_path / "planted").iterdir()) if (tmp_path / "planted").is_dir() else None
    assert after == before  # no kit.log, no steps.tsv, no captures: nothing written
    assert not (tmp_path / "planted" / "out").exists() and not (tmp_path / "planted" / "sitecustomize.py.ran").exists()


def test_run_sh_takes_an_empty_out_of_its_own_and_makes_a_new_one_and_its_site_0700(tmp_path):
    bin_dir = tmp_path / "bin"
    env = kit_env(tmp_path)
    (bin_dir / "python3").unlink()  # a python3 that says which PYTHONPATH each child got
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "$PYTHONPATH" >> {tmp_path}/pythonpath\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    (tmp_path / "empty").mkdir(mode=0o700)
    for out in (tmp_path / "empty", tmp_path / "new" / "out"):
        p = subprocess.run(["bash", str(RUN)], env={**env, "STEPS": " ", "OUT": str(out)}, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and (out / "acceptance.json").exists(), (p.stdout, p.stderr)  # no level ran: not accepted
        assert out.stat().st_mode & 0o777 == 0o700
    site = (tmp_path / "pythonpath").read_text().splitlines()[0].split(":")[0]
    assert site != "/tmp/site" and re.fullmatch(r"/tmp/preflight-site\.\w{6}", site), site  # fresh, from mktemp -d (0700)
    assert not Path(site).exists()  # and removed at the end


def test_the_setup_step_looks_for_the_checkouts_wheels_from_the_scratch_directory_it_runs_in(tmp_path):
    # The steps run from a scratch directory: a relative .whl/ would be looked for there, and the
    # kit would test whatever preflight the image has instead of this checkout's.
    if (RUN.parents[2] / ".whl").exists():
        pytest.skip("this checkout has wheels (tests/gpu/prepare.sh ran): the step would install them")
    p = subprocess.run(["bash", str(RUN)], env={**kit_env(tmp_path), "STEPS": "setup"}, capture_output=True, text=True, timeout=120)
    assert f"run.sh: no wheels in {RUN.parents[2] / '.whl'} " in p.stdout, p.stdout
