"""The distribution as a user gets it: `python -m build` makes the sdist and
the wheel (the wheel from the sdist, so the sdist is complete), and the wheel
alone, in a fresh venv outside this checkout, runs README's dry run.

One module-scoped build and venv serve every test here: the install takes
about a minute, the dry run another.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _files(top: str) -> set[str]:
    """Every file under ROOT/top, relative to ROOT, as the repository has it."""
    out = set()
    for p in (ROOT / top).rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            out.add(p.relative_to(ROOT).as_posix())
    return out


def _clean_env(venv: Path) -> dict[str, str]:
    """The caller's environment minus anything that would let the checkout or
    the test venv leak into the fresh one."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build", reason="the test extra `build` is not installed: pip install -e '.[test]'")
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    assert len(found) == 1, f"{pattern}: {found}"
    return found[0]


def _cpu_extra() -> str:
    """The extra README's first command installs, e.g. `cpu` from `pip install -e '.[cpu]'`."""
    first = re.search(r"```sh\n(.*?)\n```", README.split("## Set up", 1)[1], re.S)
    assert first, "README's Set up has no sh block"
    m = re.search(r"pip install -e '\.\[([a-z,]+)\]' && preflight run --profile cpu", first.group(1))
    assert m, f"README's first command installs no extra with torch: {first.group(1)!r}"
    return m.group(1)


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the wheel and README's extra, as a user installs it."""
    where = tmp_path_factory.mktemp("fresh")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    wheel = _one(dist, "gpu_preflight-*.whl")
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[{_cpu_extra()}]"],
                          capture_output=True, text=True, timeout=600, cwd=where, env=_clean_env(venv))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return venv


def test_nothing_installs_preflight_or_gpu_preflight_from_an_index() -> None:
    """PyPI's `preflight` is a 2015 Django deploy checker, and nothing is published under
    `gpu-preflight` yet: no install line here may name either (a wheel file or a path may)."""
    assert re.search(r'^name = "gpu-preflight"$', (ROOT / "pyproject.toml").read_text(), re.M)
    install = re.compile(r"pip\S* install\b([^\n&;|#(`]*)")

    def names_bare(line: str) -> bool:
        for m in install.finditer(line):
            for token in m.group(1).split():
                name = re.match(r"[A-Za-z0-9._-]+", token.strip("'\""))
                if not token.startswith("-") and name and name.group(0).lower() in ("preflight", "gpu-preflight", "gpu_preflight"):
                    return True
        return False

    offenders = []
    for top in ("README.md", "docs", "examples", "systemd", "tests", ".ci"):
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for p in paths:
            if p.is_file() and p.suffix not in (".pyc", ".json", ".txt", ".log") and p != Path(__file__):
                for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                    if names_bare(line):
                        offenders.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "install lines naming `preflight` or `gpu-preflight` on an index:\n" + "\n".join(offenders)


def test_sdist_holds_the_source_the_wheel_is_built_from(dist: Path) -> None:
    sdist = _one(dist, "gpu_preflight-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    want = _files("preflight") | _files("checks") | _files("systemd") | _files("examples")
    assert not want - names, f"missing from the sdist: {sorted(want - names)}"
    assert {"pyproject.toml", "README.md"} <= names


def test_wheel_carries_profiles_workers_units_and_examples(dist: Path) -> None:
    with zipfile.ZipFile(_one(dist, "gpu_preflight-*.whl")) as whl:
        names = set(whl.namelist())
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = whl.read(meta).decode()
    assert "Name: gpu-preflight" in metadata
    want = {f"preflight/{f}" for f in _files("systemd") | _files("examples")}
    want |= {f"preflight/checks/{f.split('/', 1)[1]}" for f in _files("checks")}
    want |= {f for f in _files("preflight") if f.endswith((".py", ".toml"))}
    assert not want - names, f"missing from the wheel: {sorted(want - names)}"
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(_one(dist, "gpu_preflight-*.whl")) as whl:
        text = whl.read(entry_points).decode()
    for check in ("cuda", "topology", "pcie", "rdma", "shm", "nccl", "bandwidth", "train"):
        assert re.search(rf"^{check} = preflight\.checks\.{check}:", text, re.M), check


def test_the_wheel_alone_runs_the_cpu_dry_run(venv: Path, tmp_path: Path) -> None:
    """From a directory outside the checkout, so nothing is imported from it."""
    env = _clean_env(venv)
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [str(venv / "bin" / "preflight"), "run", "--profile", "cpu", "--report", str(report),
         "--lock-file", str(tmp_path / "lock")],
        capture_output=True, text=True, timeout=540, cwd=tmp_path, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(report.read_text())
    status = {r["check"]: r["status"] for r in doc["checks"]}
    assert status == {"shm": "PASS", "nccl": "PASS", "bandwidth": "PASS", "train": "PASS"}, status

    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import preflight; print(preflight.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(venv)), where.stdout


def test_version_says_where_the_units_and_examples_are(venv: Path, tmp_path: Path) -> None:
    proc = subprocess.run([str(venv / "bin" / "preflight"), "version"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env=_clean_env(venv))
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"^units and examples: (\S+)$", proc.stdout, re.M)
    assert m, proc.stdout
    files = Path(m.group(1))
    assert str(files).startswith(str(venv))
    assert (files / "systemd" / "preflight.service").is_file()
    assert (files / "examples" / "prometheus" / "preflight-rules.yml").is_file()


def test_the_containerfile_builds_the_daemonsets_image_from_the_wheel_this_checkout_makes(dist: Path) -> None:
    """examples/kubernetes/Containerfile: every file it copies exists (the wheel as the build
    names it), it installs the wheel it copied, and daemonset.yaml runs the image it tags."""
    from preflight import __version__

    text = (ROOT / "examples" / "kubernetes" / "Containerfile").read_text()
    wheel = _one(dist, "gpu_preflight-*.whl")
    assert wheel.name == f"gpu_preflight-{__version__}-py3-none-any.whl"
    copies = re.findall(r"^COPY\s+(\S+)\s+(\S+)$", text, re.M)
    assert copies, "the Containerfile copies nothing: the test is broken"
    for src, dest in copies:
        if src.startswith("dist/"):
            import fnmatch

            assert fnmatch.fnmatch(f"dist/{wheel.name}", src), f"COPY {src}: the wheel this checkout builds is {wheel.name}"
            assert f"pip install --no-cache-dir {dest.rstrip('/')}/{src.removeprefix('dist/')}" in text, "the wheel copied is the one installed"
        else:
            assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
    tag = re.search(r"podman build -f examples/kubernetes/Containerfile -t (\S+) \.$", text, re.M)
    assert tag and tag.group(1).endswith(f":{__version__}"), "the header's build line tags the image with the version"
    assert f"rm -rf dist && pip wheel --no-deps -w dist .      # makes dist/{wheel.name}" in text
    manifest = (ROOT / "examples" / "kubernetes" / "daemonset.yaml").read_text()
    assert re.findall(r"^\s+image: (\S+)$", manifest, re.M) == [tag.group(1)], "daemonset.yaml runs the image the Containerfile builds"
    assert re.search(r"^FROM \$\{CUDA_BASE\}$", text, re.M) and "ARG CUDA_BASE=nvcr.io/nvidia/cuda:" in text
