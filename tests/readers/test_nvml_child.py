"""NVML's child started by `preflight run` before its settings are read
(preflight/readers/nvidia/nvml_child.py): when it starts, and that it answers as the
run's reading would. The child runs for real against the stand-in pynvml (tests/fakes.py)."""

from __future__ import annotations

from pathlib import Path

import fakes
import psutil
import pytest

from preflight.readers.nvidia import nvml, nvml_child

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvml"


@pytest.mark.parametrize(("profile", "fake", "environ"), [
    ("cpu", None, {}),
    ("h100-sxm", None, {}),
    (None, None, {"PREFLIGHT_PROFILE": "cpu"}),
    (None, None, {"preflight_profile": "generic"}),  # pydantic-settings reads the name in any case
    (None, Path("/tmp/facts.json"), {}),
    (None, None, {"PREFLIGHT_NVML_FAKE": "/tmp/facts.json"}),
    ("auto", None, {"Preflight_Nvml_Fake": "/tmp/facts.json"}),
])
def test_no_child_starts_early_where_a_profile_or_a_fake_is_named(profile, fake, environ):
    # A named profile may have no GPUs (known only once loaded): the head start decides then.
    assert nvml_child.early(profile, fake, environ) is None


@pytest.mark.parametrize(("profile", "environ"), [(None, {}), ("auto", {}), (" AUTO ", {}), (None, {"PREFLIGHT_PROFILE": "auto"})])
def test_where_the_run_will_surely_read_nvml_its_child_starts_at_once_and_is_the_runs_reading(tmp_path, monkeypatch, profile, environ):
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML", "")
    monkeypatch.setenv("FAKE_NVML_FACTS", str(FIXTURES / "h100-sxm-8x-healthy.json"))
    started = nvml_child.early(profile, None, environ)
    assert started is not None
    reading = nvml.Shared(started=started)
    assert reading.pending and len(reading.get().gpus) == 8 and not reading.pending


def test_an_early_child_a_fake_file_makes_needless_is_ended_unread(tmp_path, monkeypatch):
    # A config file that names a fake NVML: its facts are read where asked, never this node's.
    monkeypatch.setenv("PYTHONPATH", str(fakes.install_fake_pynvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML", "hang")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = nvml_child.early(None, None, {})
    assert started is not None and started.proc.pid not in before
    reading = nvml.Shared(FIXTURES / "h100-sxm-8x-healthy.json", started=started)
    assert not reading.pending and started.proc.poll() is not None
    assert len(reading.get().gpus) == 8
