"""The settle loop on recorded inventories (tests/fixtures/nvml: GPU 5's fabric registration
IN_PROGRESS, then every GPU's COMPLETED) with a stand-in clock: no test sleeps."""

import time
from pathlib import Path

import fakes
import pytest

from preflight.checkkit import settle
from preflight.pipeline import profiles
from preflight.pipeline.check import Context
from preflight.pipeline.settings import Settings
from preflight.base.host import Host
from preflight.readers.nvidia import nvml, nvml_facts
from preflight.readers.nvidia.nvml import FakeNvml

NVML = Path(__file__).parents[1] / "fixtures" / "nvml"
IN_PROGRESS = FakeNvml(NVML / "h100-sxm-gpu5-fabric-in-progress.json")
COMPLETED = FakeNvml(NVML / "h100-sxm-8x-fabric-completed.json")


class Clock:
    """time.monotonic and time.sleep for the loop: a sleep moves the clock, as does each read."""

    def __init__(self, read_costs: float = 0.5):
        self.now = 100.0
        self.read_costs = read_costs
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def reads(self, *answers):
        """A read returning ``answers`` in turn (an exception is raised), each costing ``read_costs``."""
        left = list(answers)
        asked = []

        def read(timeout: float):
            asked.append(timeout)
            self.now += self.read_costs
            answer = left.pop(0) if len(left) > 1 else left[0]
            if isinstance(answer, Exception):
                raise answer
            return answer
        read.asked = asked
        return read


def test_nothing_in_progress_reads_nothing_again():
    clock = Clock()
    out = settle.settle(COMPLETED, clock.reads(COMPLETED), 20, clock, clock.sleep)
    assert out.inventory is COMPLETED and out.reads == 0 and clock.slept == [] and out.describe() is None


def test_a_registration_that_completes_is_judged_on_the_completed_reading():
    clock = Clock()
    read = clock.reads(IN_PROGRESS, IN_PROGRESS, COMPLETED)
    out = settle.settle(IN_PROGRESS, read, 20, clock, clock.sleep)
    assert out.inventory is COMPLETED and out.pending == [] and out.reads == 3
    assert clock.slept == [1.0, 1.0, 1.0] and out.waited == 4.5
    assert out.describe() == "fabric registration was in progress; read NVML 3 more time(s) over 4.5 s: every GPU's registration done"


def test_one_that_stays_in_progress_is_given_the_limit_and_no_more():
    clock = Clock()
    read = clock.reads(IN_PROGRESS)
    out = settle.settle(IN_PROGRESS, read, 20, clock, clock.sleep)
    assert out.inventory is IN_PROGRESS and out.pending == [5]
    assert 19 <= out.waited <= 20 and clock.now - 100 <= 20 and all(t <= settle.READ_TIMEOUT for t in read.asked)
    assert "GPU 5 still in progress" in out.describe()


def test_no_time_left_reads_nothing_again():
    clock = Clock()
    out = settle.settle(IN_PROGRESS, clock.reads(COMPLETED), 0, clock, clock.sleep)
    assert out.inventory is IN_PROGRESS and out.reads == 0 and clock.slept == []
    assert out.describe() == "fabric registration in progress on GPU 5; no time left before the check's deadline to read NVML again"


def test_a_read_that_fails_meanwhile_leaves_the_last_reading_standing():
    # The reader's trouble, not the node's: judge what was read, and say why the wait stopped.
    clock = Clock()
    out = settle.settle(IN_PROGRESS, clock.reads(nvml.NvmlUnavailable("NVML timed out", "fix")), 20, clock, clock.sleep)
    assert out.inventory is IN_PROGRESS and out.reads == 0 and "NVML timed out" in out.unread
    assert "the wait stopped: NVML did not answer a later read" in out.describe()


# ---- in a run: the shared inventory -----------------------------------------------------


def ctx(**settings) -> Context:
    path = profiles.BUILTIN_DIR / "h100-sxm.toml"
    profile = profiles.resolve(profiles.load(path), path, {}, "--profile h100-sxm")
    return Context(profile=profile, settings=Settings(**settings), host=Host(), deadline=time.monotonic() + 30)


def test_the_reading_waited_for_replaces_the_runs_shared_one_and_is_waited_for_once(monkeypatch):
    monkeypatch.setattr(settle.nvml_settle, "EVERY_SECONDS", 0.0)
    asked = fakes.nvml_readings(monkeypatch, IN_PROGRESS, COMPLETED)
    c = ctx()
    out = settle.settled_inventory(c, 20)
    assert out.inventory is COMPLETED and out.reads == 1 and c.inventory() is COMPLETED and len(asked) == 2
    assert settle.settled_inventory(c, 20) is out and len(asked) == 2  # fabric after topology: the same reading, no second wait


def test_a_fake_inventory_is_judged_as_it_is(monkeypatch):
    # --nvml-fake's facts never change: waiting on them would only add the limit to the run.
    asked = fakes.nvml_readings(monkeypatch, COMPLETED)
    c = ctx(nvml_fake=NVML / "h100-sxm-gpu5-fabric-in-progress.json")
    out = settle.settled_inventory(c, 20)
    assert out.pending == [5] and out.reads == 0 and asked == []


def test_facts_given_to_the_run_are_judged_as_they_are(monkeypatch):
    # A report built from a recording: this machine's NVML must never stand in for the recorded node.
    asked = fakes.nvml_readings(monkeypatch, COMPLETED)
    c = ctx()
    c.shared_inventory = nvml.Shared(facts=IN_PROGRESS)
    out = settle.settled_inventory(c, 20)
    assert out.inventory is IN_PROGRESS and out.reads == 0 and asked == []


def test_the_wait_stays_inside_the_checks_deadline(monkeypatch):
    asked = fakes.nvml_readings(monkeypatch, IN_PROGRESS)
    c = ctx()
    c.deadline = time.monotonic() + settle.MARGIN_SECONDS - 1
    out = settle.settled_inventory(c, 20)
    assert out.reads == 0 and out.pending == [5] and len(asked) == 1
    assert "no time left" in out.describe()


@pytest.mark.gpu
def test_the_loop_reads_real_nvml_again_until_registration_is_done():
    """On a real node: a first reading with GPU 0 marked registering, NVML read again for real.
    A settled node answers at the first read again (no GPU in progress, or no fabric state at all)."""
    real = nvml.inventory()
    g0 = real.gpus[0].model_copy(update={"fabric": nvml_facts.GpuFabric(state="in_progress")})
    first = real.model_copy(update={"gpus": [g0, *real.gpus[1:]]})
    started = time.monotonic()
    out = settle.settle(first, lambda t: nvml.inventory(None, t), 10)
    assert out.reads == 1 and out.pending == [] and out.unread is None, out.describe()
    assert [g.uuid for g in out.inventory.gpus] == [g.uuid for g in real.gpus]
    print(f"one settle round on {len(real.gpus)} GPU(s): {time.monotonic() - started:.2f} s")


def test_a_last_read_the_limit_cut_short_is_said_as_the_limit_not_as_a_wedged_driver():
    clock = Clock()
    out = settle.settle(IN_PROGRESS, clock.reads(nvml.NvmlUnavailable("NVML did not answer within 1 s: the driver is wedged", "fix")),
                        1.5, clock, clock.sleep)
    assert out.inventory is IN_PROGRESS and "the wait's limit came before NVML's next answer" in out.unread
    assert "wedged" not in out.describe()
