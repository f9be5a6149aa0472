"""The NVML seam, with a fake `pynvml` in a child process: causes, remedies, deadline."""

import time

import psutil
import pytest

import fakes
from preflight import nvml
from preflight.nvml import NvmlUnavailable


@pytest.fixture
def fake_nvml(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))

    def mode(value: str) -> None:
        monkeypatch.setenv("FAKE_NVML", value)

    return mode


def test_names_in_index_order(fake_nvml):
    fake_nvml("names:NVIDIA H100 80GB HBM3,NVIDIA H100 80GB HBM3")
    assert nvml.gpu_names() == ["NVIDIA H100 80GB HBM3"] * 2


@pytest.mark.parametrize(
    "mode, cause, remedy",
    [
        ("nodriver", "no NVIDIA driver", "--profile cpu for a dry run"),
        ("noperm", "no permission on /dev/nvidia*", "give its user access"),
        ("lost:1:A,B,C", "NVML failed: GPU is lost", "reset the GPU"),
        ("crash", "the NVML query died", "reset the GPU"),
    ],
)
def test_each_failure_has_its_own_cause_and_remedy(fake_nvml, mode, cause, remedy):
    fake_nvml(mode)
    with pytest.raises(NvmlUnavailable) as e:
        nvml.gpu_names()
    assert cause in e.value.cause and remedy in e.value.remedy
    if not mode.startswith("nodriver"):
        assert "--profile cpu" not in e.value.remedy  # never steer a broken GPU node to a dry run


def test_a_wedged_driver_cannot_hang_the_agent(fake_nvml):
    fake_nvml("hang")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    with pytest.raises(NvmlUnavailable, match=r"NVML did not answer within 1 s: the driver is wedged"):
        nvml.gpu_names(timeout=1.0)
    assert time.monotonic() - start < 5
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before


def test_a_pynvml_in_the_working_directory_is_never_imported(tmp_path, monkeypatch):
    # Running preflight as root from a directory someone else controls must not run their code.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pynvml.py").write_text("raise SystemExit('imported from the working directory')\n")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    try:
        names = nvml.gpu_names()
    except NvmlUnavailable as e:
        assert "working directory" not in e.cause
    else:
        assert isinstance(names, list)
