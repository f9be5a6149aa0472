"""The rdma check: judges fed recorded facts, and the gather and the check on
the HGX H100 sysfs tree (tests/fixtures/sysfs) in three states: healthy, broken
(a port down, errors growing between the two reads, a flapping link, no
GPUDirect RDMA path) and not applicable (no RDMA device). The second read
comes after a `wait` that edits the tree: no test sleeps."""

import shutil
import threading
import time
from pathlib import Path

import pytest

from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.checkkit import rdma_judges, rdma_ports
from preflight.checks import rdma as r
from preflight.pipeline import profiles
from preflight.pipeline.check import Context
from preflight.pipeline.settings import Settings
from preflight.pipeline.shape import NodeShape
from preflight.readers.machine import ibports
from preflight.readers.machine.ibports import Port, RdmaFacts

FAIL, WARN, PASS, SKIP = Status.FAIL, Status.WARN, Status.PASS, Status.SKIP
TREE = Path(__file__).parents[1] / "fixtures" / "sysfs" / "hgx-h100"
IB = "sys/class/infiniband"


def resolved(name: str) -> profiles.ResolvedProfile:
    path = profiles.BUILTIN_DIR / f"{name}.toml"
    return profiles.resolve(profiles.load(path), path, {}, f"--profile {name}")


H100 = resolved("h100-sxm")


@pytest.fixture
def ndr_site(tmp_path) -> profiles.ResolvedProfile:
    """A site's own h100-sxm (/etc/preflight/profiles/h100-sxm.toml replaces the built-in) that
    holds its compute ports to its NDR fabric's 400 Gb/s."""
    text = (profiles.BUILTIN_DIR / "h100-sxm.toml").read_text()
    text = text.replace("[rdma]\n", '[rdma]\nrate_gbps = 400\nrate_source = "our fabric: NDR, 400 Gb/s per rail"\n', 1)
    path = tmp_path / "site" / "h100-sxm.toml"
    path.parent.mkdir()
    path.write_text(text)
    return profiles.resolve(profiles.load(path), path, {}, "--profile h100-sxm")


@pytest.fixture
def root(tmp_path) -> Path:
    dest = tmp_path / "root"
    shutil.copytree(TREE, dest, symlinks=True)
    return dest


def edit(root: Path, rel: str, text: str) -> None:
    (root / rel).write_text(text + "\n")


def counter(dev: str, name: str, port: int = 1) -> str:
    return f"{IB}/{dev}/ports/{port}/counters/{name}"


def then(root: Path, **files: str):
    """A wait that, instead of sleeping, writes ``files`` (relative path with / as __) into the tree."""
    def wait(seconds: float) -> None:
        for rel, text in files.items():
            edit(root, rel.replace("__", "/"), text)
    return wait


def port(dev="mlx5_0", state="ACTIVE", phys="LinkUp", rate="400 Gb/sec (4X NDR)", layer="InfiniBand", first=None, later=None) -> Port:
    first = first or {n: 0 for n in ibports.ERROR_COUNTERS}
    return Port(device=dev, port=1, state=state, phys_state=phys, rate=rate, link_layer=layer, counters=first,
                counters_later=later if later is not None else dict(first), state_later=state)


def facts(*ports: Port, **kw) -> RdmaFacts:
    base = dict(interval_seconds=3.0, peermem=["nvidia_peermem"], kernel="5.15.0-105-generic", driver="550.54.15", nvidia_open=False)
    return RdmaFacts(ports=list(ports), **{**base, **kw})


def found(f: RdmaFacts, expect=H100.rdma, gpus: int = 8):
    return [x for part in r.judge(f, expect, gpus).values() for x in part]


# ---- judging recorded facts -------------------------------------------------------


def test_healthy_ndr_ports_with_peermem_pass():
    assert found(facts(port(), port("mlx5_1"))) == []


def test_a_compute_port_down_fails_naming_device_and_port():
    out = found(facts(port(), port("mlx5_3", state="DOWN", phys="Polling")))
    assert [(x.status, x.summary) for x in out] == [(FAIL, "mlx5_3 port 1 DOWN")]
    assert "physical state Polling" in out[0].cause and "cable" in out[0].remedy


def test_a_port_in_init_points_at_the_subnet_manager():
    out = found(facts(port(state="INIT")))
    assert [x.summary for x in out] == ["mlx5_0 port 1 INIT"] and "subnet manager" in out[0].cause and "opensm" in out[0].remedy


def test_a_storage_ethernet_port_down_is_reported_not_judged():
    # It was a WARN: a port no job uses says nothing about the job (an uncabled spare is normal).
    f = facts(port(), port("mlx5_4", state="DOWN", phys="Disabled", layer="Ethernet", rate="200 Gb/sec (4X HDR)"))
    assert found(f) == [] and rdma_judges.other_ports(f, H100.rdma) == ["mlx5_4 port 1 (Ethernet) DOWN (physical state Disabled)"]


def test_an_infiniband_storage_port_away_from_the_gpus_is_no_compute_port():
    storage = port("mlx5_10", rate="200 Gb/sec (4X HDR)").model_copy(update={"near_gpu": False})
    f = facts(port().model_copy(update={"near_gpu": True}), storage)
    assert found(f) == [] and rdma_judges.other_ports(f, H100.rdma) == ["mlx5_10 port 1 (InfiniBand) at 200 Gb/sec (4X HDR)"]
    near = storage.model_copy(update={"near_gpu": True})  # beside a GPU: a rail, held to its peers' rate
    assert [x.summary for x in found(facts(port(), near))] == ["mlx5_10 port 1 at 200 Gb/sec (4X HDR), below mlx5_0 port 1's 400 Gb/sec (4X NDR)"]


@pytest.mark.parametrize("profile", ["a100-pcie", "h100-pcie", "h100-nvl"])
def test_the_unused_second_port_of_a_dual_port_card_passes_on_pcie_profiles(profile):
    spare = port(state="DOWN", phys="Polling").model_copy(update={"port": 2})
    f = facts(port(), spare)
    assert found(f, expect=resolved(profile).rdma) == [] and rdma_judges.other_ports(f, resolved(profile).rdma) == [
        "mlx5_0 port 2 (InfiniBand) DOWN (physical state Polling)"]
    # Both ports down is a cable fault on the card, not a spare.
    assert [x.summary for x in found(facts(port(state="DOWN", phys="Polling"), spare), expect=resolved(profile).rdma)] == [
        "mlx5_0 port 1 DOWN", "mlx5_0 port 2 DOWN"]


@pytest.mark.parametrize("spec, named", [
    ("mlx5_0", {"mlx5_0:1", "mlx5_0:2"}),  # a prefix: NCCL matches mlx5_0* too
    ("mlx5_1", {"mlx5_1:1", "mlx5_10:1"}),
    ("=mlx5_1", {"mlx5_1:1"}),
    ("mlx5_0:1,mlx5_1:1", {"mlx5_0:1", "mlx5_1:1", "mlx5_10:1"}),
    ("^mlx5_1", {"mlx5_0:1", "mlx5_0:2"}),
    ("^=mlx5_1", {"mlx5_0:1", "mlx5_0:2", "mlx5_10:1"}),
    ("^mlx5_0:2", {"mlx5_0:1", "mlx5_1:1", "mlx5_10:1"}),
    # As NCCL's parseStringList reads it: nothing stripped, so " mlx5_1" names no device...
    ("mlx5_0, mlx5_1", {"mlx5_0:1", "mlx5_0:2"}),
    (" ^mlx5_1", set()),  # ... and " ^" is no exclusion: a name no device starts with
    ("mlx5_0:2x", {"mlx5_0:2"}),  # the port by atoi
    ("", {"mlx5_0:1", "mlx5_0:2", "mlx5_1:1", "mlx5_10:1"}),  # a list of none: every device
])
def test_nccl_ib_hca_syntax(spec, named):
    ports = [("mlx5_0", 1), ("mlx5_0", 2), ("mlx5_1", 1), ("mlx5_10", 1)]
    assert {f"{d}:{p}" for d, p in ports if rdma_ports.hca_names(spec)(d, p)} == named


def test_nccl_ib_hca_decides_the_compute_ports():
    down = port("mlx5_1", state="DOWN", phys="LinkUp")
    assert [x.summary for x in found(facts(port(), down))] == ["mlx5_1 port 1 DOWN"]
    assert found(facts(port(), down, ib_hca=("=mlx5_0", "the environment"))) == []
    assert found(facts(port(), down, ib_hca=("^mlx5_1", "/etc/nccl.conf"))) == []


def test_a_prefix_in_nccl_ib_hca_names_no_storage_or_spare_port_the_job_would_lose():
    """Was: NCCL_IB_HCA=mlx5 (common in job scripts) made the storage card's uncabled port, or an
    HDR storage port away from the GPUs, a compute port: FAIL "DOWN", FAIL "below 400". NCCL skips
    a port that is not ACTIVE before it reads the list (nccl src/transport/net_ib/init.cc), and a
    storage port beside no GPU is no rail of the job's."""
    rails = [port(f"mlx5_{i}").model_copy(update={"near_gpu": True}) for i in range(2)]
    storage = port("mlx5_8", rate="200 Gb/sec (4X HDR)").model_copy(update={"near_gpu": False})
    uncabled = port("mlx5_9", state="DOWN", phys="Disabled", layer="Ethernet").model_copy(update={"near_gpu": False})
    spare = port("mlx5_0", state="DOWN", phys="Polling").model_copy(update={"port": 2, "near_gpu": True})
    prefix = ("mlx5", "the environment")
    assert found(facts(*rails, storage, uncabled, spare, ib_hca=prefix)) == []
    # A rail beside a GPU that the prefix catches is still the job's: down, it FAILs.
    down = port("mlx5_1", state="DOWN", phys="LinkUp").model_copy(update={"near_gpu": True})
    assert [x.summary for x in found(facts(rails[0], down, storage, ib_hca=prefix))] == ["mlx5_1 port 1 DOWN"]
    # A port the list names itself is held to it wherever it sits.
    assert [x.summary for x in found(facts(*rails, uncabled, ib_hca=("mlx5_0,mlx5_1,mlx5_9", "the environment")))] == ["mlx5_9 port 1 DOWN"]
    assert [x.summary for x in found(facts(*rails, spare, ib_hca=("=mlx5_0:2", "/etc/nccl.conf")))] == ["mlx5_0 port 2 DOWN"]


def pcie_tree(root: Path, devices: dict[str, str]) -> None:
    """A PCIe tree under ``root``: each device's bus id -> its path of bridges below the root complex."""
    (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    for bdf, path in devices.items():
        (root / "sys/devices/pci0000:00" / path).mkdir(parents=True)
        (root / "sys/bus/pci/devices" / bdf).symlink_to(root / "sys/devices/pci0000:00" / path)


@pytest.mark.parametrize("layout, why", [
    # GPUs and NICs each under a root port of their own: a switchless server, a Grace board.
    ({"0000:01:00.0": "0000:00:01.0/0000:01:00.0", "0000:02:00.0": "0000:00:02.0/0000:02:00.0", "0000:03:00.0": "0000:00:03.0/0000:03:00.0"},
     "no GPU sits behind a PCIe switch"),
    # GPUs behind a switch, every NIC on a root port: a dual-root PCIe server.
    ({"0000:01:00.0": "0000:00:01.0/0000:10:00.0/0000:11:00.0/0000:01:00.0", "0000:02:00.0": "0000:00:02.0/0000:02:00.0",
      "0000:03:00.0": "0000:00:03.0/0000:03:00.0"}, "no NIC shares a PCIe switch with a GPU"),
])
def test_where_the_pcie_tree_cannot_tell_a_rail_from_storage_every_port_is_judged_and_warns(tmp_path, layout, why):
    """It read as 'beside no GPU' for every NIC, so a rail down passed unseen. Now every port of the
    link layer is judged, and warns: the tree cannot say which is a storage port, and a gate never
    fails a node on a port it cannot say the job uses. NCCL_IB_HCA naming the rails makes them FAIL."""
    pcie_tree(tmp_path, layout)
    for dev, bdf in (("mlx5_0", "0000:02:00.0"), ("mlx5_1", "0000:03:00.0")):
        (tmp_path / IB / dev).mkdir(parents=True)
        (tmp_path / IB / dev / "device").symlink_to(tmp_path / "sys/bus/pci/devices" / bdf)
    rail, storage = port("mlx5_0", state="DOWN", phys="Polling"), port("mlx5_1", rate="200 Gb/sec (4X HDR)")
    assert ibports.near_gpus(Host(tmp_path), [rail, storage], ["0000:01:00.0"]) == why
    assert (rail.near_gpu, storage.near_gpu) == (None, None)
    for hca in (None, ("mlx5", "the environment")):
        out = found(facts(rail, storage, ib_hca=hca, roles_unknown=why, peermem=[]))
        assert [(x.status, x.summary) for x in out] == [(WARN, "GPUDirect RDMA not possible: no nvidia-peermem, no dma-buf"),
                                                        (WARN, "mlx5_0 port 1 DOWN")], hca
        assert why in out[1].cause and "NCCL_IB_HCA" in out[1].cause
    named = found(facts(rail, storage, ib_hca=("mlx5_0", "the environment"), roles_unknown=why))
    assert [(x.status, x.summary) for x in named] == [(FAIL, "mlx5_0 port 1 DOWN")]


def test_where_the_tree_cannot_tell_a_port_that_may_be_storage_sets_no_pace_for_the_named_rails():
    """NCCL_IB_HCA=mlx5_0,mlx5_1 (prefixes: mlx5_1 also catches mlx5_10) on a switchless node: the
    named rails at 200 Gb/s were held to mlx5_10's 400, a port the check itself says may be storage."""
    why = "no GPU sits behind a PCIe switch"
    rails = [port(f"mlx5_{i}", rate="200 Gb/sec (4X HDR)") for i in range(2)]
    storage = port("mlx5_10", rate="400 Gb/sec (4X NDR)")
    f = facts(*rails, storage, ib_hca=("mlx5_0,mlx5_1", "the environment"), roles_unknown=why)
    assert found(f) == []
    rate = {m.labels["device"]: m.floor for m in r.measurements(f, H100.rdma) if m.name == "rdma_port_rate"}
    assert rate == {"mlx5_0": 200.0, "mlx5_1": 200.0, "mlx5_10": None}  # no floor the check does not fail on
    slow = facts(rails[0], port("mlx5_1", rate="100 Gb/sec (2X HDR)"), storage, ib_hca=("mlx5_0,mlx5_1", "the environment"), roles_unknown=why)
    assert [(x.status, x.summary) for x in found(slow)] == [(FAIL, "mlx5_1 port 1 at 100 Gb/sec (2X HDR), below mlx5_0 port 1's 200 Gb/sec (4X HDR)")]
    assert why in rdma_ports.chosen_by(slow)


def test_a_dual_port_cards_port_that_was_up_since_boot_is_a_pulled_cable_not_a_spare():
    # Both ports of one card carry rails; one cable is pulled: its link_downed counts the fall.
    up = port("mlx5_0").model_copy(update={"pci": "0000:02:00.0"})
    pulled = port("mlx5_1", state="DOWN", phys="Polling", first={"link_downed": 1}).model_copy(update={"pci": "0000:02:00.1"})
    for hca in (None, ("mlx5", "the environment")):
        assert [x.summary for x in found(facts(up, pulled, ib_hca=hca))] == ["mlx5_1 port 1 DOWN"], hca
    never = pulled.model_copy(update={"counters": {**pulled.counters, "link_downed": 0}, "counters_later": {**pulled.counters, "link_downed": 0}})
    assert found(facts(up, never)) == []  # never up since the counters began: the card's unused port
    (f,) = found(facts(up, pulled))
    assert "reads as its card's spare once its counters are cleared" in f.remedy  # a port left unused on purpose
    alone = pulled.model_copy(update={"pci": "0000:05:00.0"})  # a card of its own: clearing changes nothing, so it is not said
    (f,) = found(facts(up, alone))
    assert f.summary == "mlx5_1 port 1 DOWN" and "its card's spare" not in f.remedy


def test_a_compute_port_below_the_sites_rate_fails(ndr_site):
    # It held to the built-in profile's rate, which is now the reference design's and no floor
    # (test_an_ndr200_fabric_...): the same judgement stands where a site profile sets the rate.
    out = found(facts(port(), port("mlx5_7", rate="200 Gb/sec (4X HDR)")), expect=ndr_site.rdma)
    assert [(x.status, x.summary) for x in out] == [(FAIL, "mlx5_7 port 1 at 200 Gb/sec (4X HDR), 400 Gb/sec expected")]
    assert "the site's profile holds its compute ports to (our fabric: NDR, 400 Gb/s per rail)" in out[0].cause


def test_a_site_on_ndr_fails_every_port_that_trained_at_ndr200(ndr_site):
    """The site's own rate judges as the built-in profiles once did: all eight at 2X NDR fail there."""
    out = found(facts(*[port(f"mlx5_{i}", rate="200 Gb/sec (2X NDR)") for i in range(8)]), expect=ndr_site.rdma)
    assert [x.summary for x in out] == [f"mlx5_{i} port 1 at 200 Gb/sec (2X NDR), 400 Gb/sec expected" for i in range(8)]


@pytest.mark.parametrize("profile, rate, reference", [("h100-sxm", "200 Gb/sec (2X NDR)", 400), ("h200-sxm", "200 Gb/sec (2X NDR)", 400),
                                                      ("a100-sxm4-80gb", "100 Gb/sec (2X HDR)", 200)])
def test_an_ndr200_or_hdr100_fabric_passes_and_is_said_below_the_reference_design(profile, rate, reference):
    """An HGX board cabled NDR200 (one leg of a 2x200G split cable per NIC) or HDR100: every compute
    port agrees at the site's rate, so nothing is wrong; the result says the rate, never a WARN."""
    expect = resolved(profile).rdma
    f = facts(*[port(f"mlx5_{i}", rate=rate) for i in range(8)])
    assert found(f, expect=expect) == []
    basis = rdma_judges.rate_basis(f, expect)
    assert basis["below_reference"] == (f"compute ports at {rate}, below the reference design's {reference} Gb/sec: the site's fabric "
                                        "(NDR200, HDR100 or the like), not a fault; the ports are held to each other "
                                        "(a site profile's [rdma] rate_gbps holds them to a rate)")
    assert basis["floor"].startswith("none: ") and basis["reference"].startswith(f"{reference} Gb/sec, not a floor (DGX ")
    assert found(facts(*[port(f"mlx5_{i}") for i in range(8)])) == [] and rdma_judges.rate_basis(facts(port()), H100.rdma)["below_reference"] is None


def test_a_compute_port_slower_than_its_peers_fails_naming_both_rates():
    """A port that trained at 2X of 4X (a bad cable) is a fault on any fabric: held to the node's fastest compute port."""
    rails = [port(f"mlx5_{i}") for i in range(7)] + [port("mlx5_7", rate="200 Gb/sec (2X NDR)")]
    out = found(facts(*rails))
    assert [(x.status, x.summary) for x in out] == [(FAIL, "mlx5_7 port 1 at 200 Gb/sec (2X NDR), below mlx5_0 port 1's 400 Gb/sec (4X NDR)")]
    assert "the node's fastest InfiniBand compute port" in out[0].cause and "reseat or replace the cable" in out[0].remedy
    # On an NDR200 fabric the same fault is one port at 1X of 2X.
    ndr200 = [port(f"mlx5_{i}", rate="200 Gb/sec (2X NDR)") for i in range(7)] + [port("mlx5_7", rate="100 Gb/sec (1X NDR)")]
    assert [x.summary for x in found(facts(*ndr200))] == ["mlx5_7 port 1 at 100 Gb/sec (1X NDR), below mlx5_0 port 1's 200 Gb/sec (2X NDR)"]
    # The profiles without a reference rate (PCIe boards) hold their compute ports to each other too.
    assert [x.summary for x in found(facts(*rails), expect=resolved("h100-pcie").rdma)] == [out[0].summary]


def test_ports_are_held_to_peers_of_their_own_link_layer_only():
    """NCCL_IB_HCA may name InfiniBand rails and a RoCE port: a 200 GbE port is no slower rail than a 400 Gb/s IB one."""
    roce = port("mlx5_8", rate="200 Gb/sec (4X HDR)", layer="Ethernet")
    assert found(facts(port(), port("mlx5_1"), roce, ib_hca=("mlx5", "the environment"))) == []
    down = port("mlx5_1", state="DOWN", phys="Polling", rate="10 Gb/sec (4X SDR)")  # a port down has no rate to be the fastest by
    assert [x.summary for x in found(facts(down, port("mlx5_2", rate="200 Gb/sec (2X NDR)")))] == ["mlx5_1 port 1 DOWN"]


def test_symbol_errors_growing_between_the_reads_fail_with_the_delta():
    grown = {**{n: 0 for n in ibports.ERROR_COUNTERS}, "symbol_error": 112, "port_rcv_errors": 2}
    out = found(facts(port("mlx5_2", first={**grown, "symbol_error": 12, "port_rcv_errors": 0}, later=grown)))
    assert [(x.status, x.summary) for x in out] == [(FAIL, "mlx5_2 port 1: symbol_error +100, port_rcv_errors +2 in 3 s")]
    assert "symbol_error at 33.3/s, past 10/s" in out[0].cause


def test_a_few_symbol_errors_on_a_pam4_link_are_no_fault_but_are_reported():
    """NDR and HDR links count raw bit errors that FEC corrects: 0.2/s at the IBTA's 1e-12 BER on
    200 Gb/s. A handful in the watch must not fail a healthy node; faster than 10/s does."""
    quiet = {n: 0 for n in ibports.ERROR_COUNTERS}
    f = facts(port("mlx5_2", first={**quiet, "symbol_error": 12}, later={**quiet, "symbol_error": 15}))
    assert found(f) == []
    assert rdma_judges.slow_symbol_errors(f.ports[0], H100.rdma, 3.0) == 1.0
    fast = facts(port("mlx5_2", first={**quiet, "symbol_error": 12}, later={**quiet, "symbol_error": 43}))
    assert [(x.status, x.summary) for x in found(fast)] == [(FAIL, "mlx5_2 port 1: symbol_error +31 in 3 s")]


def test_link_downed_growing_is_a_flapping_link():
    out = found(facts(port("mlx5_9", first={"link_downed": 1}, later={"link_downed": 3})))
    assert [(x.status, x.summary) for x in out] == [(FAIL, "mlx5_9 port 1 flapping: link_downed +2 in 3 s")]
    assert "from 1 to 3" in out[0].cause


def test_counts_since_boot_that_do_not_grow_are_no_finding_but_are_reported():
    f = facts(port(first={"symbol_error": 4000, "link_downed": 2}))
    assert found(f) == [] and r.since_boot(f) == ["mlx5_0 port 1 symbol_error 4000", "mlx5_0 port 1 link_downed 2"]


def test_a_storage_port_that_flaps_or_whose_counters_sit_at_their_ceiling_is_reported_not_judged():
    """Was: a storage or management Ethernet port bouncing while watched (a switch's maintenance, a
    bond reconfigured) FAILed "flapping", and one whose link_downed sat at 255 WARNed, though the
    rdma check calls the port no job's."""
    bounced = port("mlx5_4", layer="Ethernet", rate="200 Gb/sec (4X HDR)").model_copy(update={"state_later": "DOWN"})
    full = port("mlx5_5", layer="Ethernet", rate="200 Gb/sec (4X HDR)", first={"link_downed": 255})
    f = facts(port(), bounced, full)
    assert found(f) == []
    assert rdma_judges.other_ports(f, H100.rdma) == ["mlx5_4 port 1 (Ethernet) DOWN (physical state LinkUp)",
                                                     "mlx5_4 port 1 (Ethernet): flapping: ACTIVE -> DOWN",
                                                     "mlx5_5 port 1 (Ethernet) at 200 Gb/sec (4X HDR)",
                                                     "mlx5_5 port 1 (Ethernet): link_downed at the counter's ceiling"]
    # The same on a compute port stays a finding.
    rail = port("mlx5_1").model_copy(update={"state_later": "DOWN"})
    assert ("mlx5_1 port 1 flapping: ACTIVE -> DOWN", FAIL) in [(x.summary, x.status) for x in found(facts(port(), rail))]


def test_a_counter_stuck_at_its_ceiling_warns_since_growth_is_invisible():
    out = found(facts(port(first={"port_rcv_errors": 65535, "link_downed": 255})))
    assert [(x.status, x.summary) for x in out] == [(WARN, "mlx5_0 port 1: port_rcv_errors, link_downed at the counter's ceiling")]
    assert "perfquery -x" in out[0].remedy


def test_symbol_error_at_its_ceiling_is_no_warning_on_a_healthy_link():
    # Raw bit errors FEC corrects, tolerated at the profile's rate: at 0.2/s a healthy NDR link
    # fills the 16-bit counter in under four days, and every run after would warn.
    f = facts(port(first={"symbol_error": 65535, "link_downed": 1}))
    assert found(f) == []
    assert rdma_judges.at_ceiling(f.ports[0]) == ["symbol_error"]


def test_transmit_discards_at_their_ceiling_are_no_warning():
    # Congestion fills port_xmit_discards on a healthy link; it says nothing about the cable.
    assert found(facts(port(first={"port_xmit_discards": 65535}))) == []


def test_transmit_discards_growing_warn_as_congestion():
    out = found(facts(port(first={"port_xmit_discards": 5}, later={"port_xmit_discards": 900})))
    assert [(x.status, x.summary) for x in out] == [(WARN, "mlx5_0 port 1: port_xmit_discards +895 in 3 s")]


def test_no_peermem_and_no_dmabuf_fails_naming_both_fixes():
    out = found(facts(port(), peermem=[]))
    assert [(x.status, x.summary) for x in out] == [(FAIL, "GPUDirect RDMA not possible: no nvidia-peermem, no dma-buf")]
    assert "proprietary flavour" in out[0].cause
    assert "modprobe nvidia-peermem" in out[0].remedy and "open GPU kernel modules" in out[0].remedy and "NCCL_DMABUF_ENABLE" in out[0].remedy


def test_dmabuf_with_the_open_modules_on_a_new_kernel_is_enough():
    assert found(facts(port(), peermem=[], nvidia_open=True, kernel="6.8.0-45-generic")) == []


def test_open_modules_on_an_old_kernel_cannot_use_dmabuf():
    out = found(facts(port(), peermem=[], nvidia_open=True, kernel="5.4.0-150-generic"))
    assert [x.status for x in out] == [FAIL] and "kernel 5.4.0-150-generic is older than 5.12" in out[0].cause


def test_nccl_dmabuf_enable_0_turns_the_only_path_off():
    out = found(facts(port(), peermem=[], nvidia_open=True, kernel="6.8.0", dmabuf_setting=("0", "/etc/nccl.conf")))
    assert [x.summary for x in out] == ["GPUDirect RDMA off: NCCL_DMABUF_ENABLE=0"] and "/etc/nccl.conf" in out[0].cause


def test_gpudirect_is_not_judged_without_gpus_or_where_the_profile_does_not_ask():
    assert found(facts(port(), peermem=[]), gpus=0) == []
    assert found(facts(port(), peermem=[]), expect=resolved("h100-pcie").rdma) == []


def test_the_cpu_profile_does_not_list_rdma_and_every_gpu_profile_does_at_every_level():
    assert "rdma" not in resolved("cpu").checks
    for name in profiles.available(None):
        if name == "cpu":
            continue
        p = resolved(name)
        assert p.checks.index("topology") < p.checks.index("rdma") < p.checks.index("shm") and p.rdma is not None
        for level in ("quick", "standard", "full"):
            assert "rdma" in getattr(p.levels, level).checks, (name, level)


# ---- the gather and the check on recorded trees -----------------------------------


def ctx(root: Path, profile=H100, gpus: int = 8, **env: str) -> Context:
    shape = NodeShape(gpus=gpus, gpus_from="test", fabric="nvswitch", fabric_from="test")
    return Context(profile=profile, settings=Settings(), host=Host(root, environ=env), shape=shape, deadline=time.monotonic() + 30)


def run(root: Path, wait=lambda s: None, **kw):
    check = r.Rdma()
    check.wait = wait
    c = ctx(root, **kw)
    return check.applies(c) or check.run(c)


def test_the_healthy_tree_passes_with_peermem():
    res = run(TREE)
    assert res.status == PASS, res.cause
    assert res.summary == "12/12 RDMA ports ACTIVE, no error counter grew in 3 s; GPUDirect RDMA by nvidia-peermem"
    rates = {m.labels["device"]: (m.value, m.floor) for m in res.measurements if m.name == "rdma_port_rate"}
    assert rates["mlx5_0"] == (400, 400) and rates["mlx5_4"] == (200, None)
    assert res.details["parts"] == {"gpudirect": "PASS", "ports": "PASS", "counters": "PASS"}


COMPUTE = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9")


def test_the_hgx_tree_on_an_ndr200_fabric_passes_and_says_so(root):
    """The HGX H100 tree with every compute port on one leg of a 2x200G split cable, as a site on
    NDR200 cables it: PASS with no WARN, and the rate below the reference design said in a line."""
    for dev in COMPUTE:
        edit(root, f"{IB}/{dev}/ports/1/rate", "200 Gb/sec (2X NDR)")
    res = run(root)
    assert res.status == PASS, (res.summary, res.cause)
    note = ("compute ports at 200 Gb/sec (2X NDR), below the reference design's 400 Gb/sec: the site's fabric (NDR200, HDR100 or the like), "
            "not a fault; the ports are held to each other (a site profile's [rdma] rate_gbps holds them to a rate)")
    assert note in res.lines and res.details["rate"]["below_reference"] == note
    rates = {m.labels["device"]: (m.value, m.floor) for m in res.measurements if m.name == "rdma_port_rate"}
    assert rates["mlx5_0"] == (200, 200)
    # One of them at 1X: the bad cable, named with its peer's rate.
    edit(root, f"{IB}/mlx5_6/ports/1/rate", "100 Gb/sec (1X NDR)")
    res = run(root)
    assert res.status == FAIL and res.summary == "mlx5_6 port 1 at 100 Gb/sec (1X NDR), below mlx5_0 port 1's 200 Gb/sec (2X NDR)", res.summary


def test_a_site_profile_s_rate_fails_the_ndr200_tree(root, ndr_site):
    for dev in COMPUTE:
        edit(root, f"{IB}/{dev}/ports/1/rate", "200 Gb/sec (2X NDR)")
    res = run(root, profile=ndr_site)
    assert res.status == FAIL and res.summary == "mlx5_0 port 1 at 200 Gb/sec (2X NDR), 400 Gb/sec expected (+7 more)", res.summary
    assert res.details["rate"]["floor"] == "400 Gb/sec, the site's (our fabric: NDR, 400 Gb/s per rail)"


def test_nics_beside_the_gpus_are_the_compute_ports_in_a_recorded_tree(tmp_path):
    """The HGX tree with resolved PCI paths (tests/fixtures/pcie/pass): mlx5_4/5/10/11 sit under
    their own root ports (storage), the other eight share a switch with a GPU."""
    root = tmp_path / "pass"
    shutil.copytree(TREE.parent.parent / "pcie" / "pass", root, symlinks=True)
    for dev in (root / IB).iterdir():
        (dev / "ports/1/counters").mkdir(parents=True)
        storage = dev.name in ("mlx5_4", "mlx5_5", "mlx5_10", "mlx5_11")
        for name, text in {"state": "1: DOWN" if dev.name == "mlx5_11" else "4: ACTIVE", "phys_state": "5: LinkUp",
                           "rate": "200 Gb/sec (4X HDR)" if storage else "400 Gb/sec (4X NDR)", "link_layer": "InfiniBand"}.items():
            (dev / "ports/1" / name).write_text(text + "\n")
    h = Host(root)
    from preflight.pipeline.shape import pci_nvidia
    f = ibports.gather(h, 0, lambda s: None, pci_nvidia(h).gpus)
    assert rdma_judges.judge_ports(f, H100.rdma) == []
    assert rdma_judges.other_ports(f, H100.rdma) == ["mlx5_10 port 1 (InfiniBand) at 200 Gb/sec (4X HDR)",
                                           "mlx5_11 port 1 (InfiniBand) DOWN (physical state LinkUp)",
                                           "mlx5_4 port 1 (InfiniBand) at 200 Gb/sec (4X HDR)", "mlx5_5 port 1 (InfiniBand) at 200 Gb/sec (4X HDR)"]
    assert rdma_ports.chosen_by(f) == "the profile's link_layer and a PCIe switch shared with a GPU"
    edit(root, f"{IB}/mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)")
    f = ibports.gather(h, 0, lambda s: None, pci_nvidia(h).gpus)
    assert [x.summary for x in rdma_judges.judge_ports(f, H100.rdma)] == ["mlx5_0 port 1 at 200 Gb/sec (4X HDR), below mlx5_1 port 1's 400 Gb/sec (4X NDR)"]


def test_ports_of_another_link_layer_leave_gpudirect_unjudged_and_unclaimed(root):
    # RoCE where the profile expects InfiniBand: no port carries the job's traffic as the profile
    # knows it, so nothing vouches for GPUDirect RDMA, even where it could not work.
    for dev in (root / IB).iterdir():
        edit(root, f"{IB}/{dev.name}/ports/1/link_layer", "Ethernet")
    shutil.rmtree(root / "sys/module/nvidia_peermem")
    edit(root, "proc/modules", "")
    res = run(root)
    assert res.status == PASS, res.cause
    assert "GPUDirect RDMA by" not in res.summary
    assert res.summary.endswith("; no port carries the job's traffic (details.compute_ports): GPUDirect RDMA not judged"), res.summary
    assert res.details["compute_ports"]["ports"] == []
    assert res.details["gpudirect"] == f"not judged: no port carries the job's traffic (chosen by {res.details['compute_ports']['chosen_by']})"


def test_peermem_seen_in_proc_modules_alone(root):
    shutil.rmtree(root / "sys/module/nvidia_peermem")
    assert ibports.gather(Host(root), 3, lambda s: None).peermem == ["nvidia_peermem"]


def test_a_port_down_in_the_tree_fails(root):
    edit(root, f"{IB}/mlx5_6/ports/1/state", "1: DOWN")
    edit(root, f"{IB}/mlx5_6/ports/1/phys_state", "2: Polling")
    res = run(root)
    assert (res.status, res.summary) == (FAIL, "mlx5_6 port 1 DOWN") and "11/12" not in res.summary


def test_symbol_errors_growing_in_the_tree_between_the_reads_fail(root):
    edit(root, counter("mlx5_1", "symbol_error"), "3")
    res = run(root, then(root, **{counter("mlx5_1", "symbol_error").replace("/", "__"): "151"}))
    assert (res.status, res.summary) == (FAIL, "mlx5_1 port 1: symbol_error +148 in 3 s")


def test_a_few_symbol_errors_in_the_tree_pass_and_are_reported(root):
    edit(root, counter("mlx5_1", "symbol_error"), "3")
    res = run(root, then(root, **{counter("mlx5_1", "symbol_error").replace("/", "__"): "5"}))
    assert res.status == PASS and "symbol_error grew on 1 port(s) within 10/s" in res.summary
    assert res.details["slow_symbol_errors"] == {"mlx5_1 port 1": "0.667/s, within 10/s"}


def test_a_link_that_flaps_between_the_reads_fails(root):
    res = run(root, then(root, **{counter("mlx5_8", "link_downed").replace("/", "__"): "1",
                                  counter("mlx5_8", "link_error_recovery").replace("/", "__"): "1"}))
    assert res.status == FAIL and res.summary == "mlx5_8 port 1 flapping: link_downed +1 in 3 s (+1 more)"
    assert "link_error_recovery +1" in res.cause


def test_no_peermem_and_the_proprietary_driver_fail(root):
    shutil.rmtree(root / "sys/module/nvidia_peermem")
    edit(root, "proc/modules", "nvidia 54001664 310 - Live 0x0000000000000000 (POE)")
    res = run(root)
    assert (res.status, res.summary) == (FAIL, "GPUDirect RDMA not possible: no nvidia-peermem, no dma-buf")


def test_the_open_modules_on_a_new_kernel_pass_by_dmabuf_until_nccl_is_told_not_to(root):
    shutil.rmtree(root / "sys/module/nvidia_peermem")
    edit(root, "proc/modules", "nvidia 54001664 310 - Live 0x0000000000000000 (OE)")
    edit(root, "proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
         "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:15:33 UTC 2024")
    edit(root, "proc/sys/kernel/osrelease", "6.8.0-45-generic")
    res = run(root)
    assert res.status == PASS and res.summary.endswith("GPUDirect RDMA by dma-buf")
    assert run(root, NCCL_DMABUF_ENABLE="0").summary == "GPUDirect RDMA off: NCCL_DMABUF_ENABLE=0"


def test_no_rdma_device_skips_with_the_reason(root):
    shutil.rmtree(root / IB)
    assert run(root) == r.NO_DEVICE == "no InfiniBand/RoCE device in /sys/class/infiniband"


def test_a_stray_entry_under_ports_is_no_port(root):
    (root / IB / "mlx5_0/ports/README").write_text("not a port\n")
    assert len(ibports.read_ports(Host(root))) == 12


def test_an_unlisted_ports_directory_is_said_not_raised(root, monkeypatch):
    # Root reads anything: the permission error a non-root run or a masked /sys gives is raised here.
    listing = Path.iterdir

    def iterdir(self):
        if self.name == "ports" and self.parent.name == "mlx5_3":
            raise PermissionError(13, "Permission denied")
        return listing(self)
    monkeypatch.setattr(Path, "iterdir", iterdir)
    res = run(root)
    assert res.status == PASS and res.details["unjudged"] == {"ports": "/sys/class/infiniband/mlx5_3/ports could not be listed (Permission denied)"}
    assert "not judged: the ports under /sys/class/infiniband/mlx5_3/ports" in res.summary and "11/11 RDMA ports" in res.summary


def test_an_unlisted_rdma_class_skips_saying_so(root, monkeypatch):
    listing = Path.iterdir
    monkeypatch.setattr(Path, "iterdir", lambda self: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
                        if self.name == "infiniband" else listing(self))
    assert run(root) == "RDMA ports not judged: /sys/class/infiniband could not be listed (Permission denied)"


def test_gpudirect_is_not_judged_on_a_node_without_gpus(root):
    shutil.rmtree(root / "sys/module/nvidia_peermem")
    edit(root, "proc/modules", "")
    res = run(root, gpus=0)
    assert res.status == PASS and res.details["gpudirect"] == "not judged: no GPU on this node"


def test_the_wait_is_the_profiles_interval_and_stays_inside_the_deadline():
    asked = []
    check = r.Rdma()
    check.wait = asked.append
    c = ctx(TREE)
    check.run(c)
    c.deadline = time.monotonic() + 1.5
    check.run(c)
    assert asked[0] == 3 and asked[1] <= 0.5


def test_the_first_read_is_the_one_taken_as_the_run_began(root):
    """begin() reads the counters as the run starts; what grew before the check's turn counts."""
    edit(root, counter("mlx5_1", "symbol_error"), "3")
    check, c = r.Rdma(), ctx(root)
    check.begin(c)
    c.readings["rdma"].thread.join()  # the first read done (in its thread), then the checks before rdma ran
    edit(root, counter("mlx5_1", "symbol_error"), "151")
    asked = []
    check.wait = asked.append
    res = check.run(c)
    assert (res.status, res.summary) == (FAIL, "mlx5_1 port 1: symbol_error +148 in 3 s")
    assert asked[0] <= 3 and c.readings == {}  # only what is left of the interval; the reading is used once


def test_ports_that_changed_since_the_first_read_get_a_first_read_of_their_own(root, tmp_path):
    # A boot gate runs while the node settles: an adapter's driver bound after the run began.
    (tmp_path / "ib").mkdir()
    shutil.move(root / IB / "mlx5_11", tmp_path / "ib" / "mlx5_11")
    check, c = r.Rdma(), ctx(root)
    check.begin(c)
    c.readings["rdma"].thread.join()
    shutil.move(tmp_path / "ib" / "mlx5_11", root / IB / "mlx5_11")
    asked = []
    check.wait = asked.append
    res = check.run(c)
    assert res.status == PASS and res.summary.startswith("12/12 RDMA ports ACTIVE, no error counter grew in 3 s")
    assert asked == [3]
    # The whole RDMA driver loaded after the run began: no early read (begin saw no device), one at the check's turn.
    shutil.move(root / IB, tmp_path / "ib" / "infiniband")
    check.begin(c)
    shutil.move(tmp_path / "ib" / "infiniband", root / IB)
    asked.clear()
    res = check.run(c)
    assert res.status == PASS and res.summary.startswith("12/12 RDMA ports ACTIVE, no error counter grew in 3 s")
    assert asked == [3]


def test_a_first_read_that_hangs_holds_neither_the_runs_start_nor_the_check_past_its_deadline(root, monkeypatch):
    """A counter read goes to the adapter's firmware; a wedged one answers at the driver's timeout."""
    release = threading.Event()
    real = ibports.first_read

    def first_read(host):
        if threading.current_thread().name == "rdma-first-read":
            release.wait(30)  # the wedged adapter
        return real(host)
    monkeypatch.setattr(ibports, "first_read", first_read)
    check, c = r.Rdma(), ctx(root)
    check.begin(c)
    early = c.readings["rdma"]
    try:
        assert early.thread.is_alive()  # begin returned; the read is still held
        c.deadline = time.monotonic() + 1.2
        res = check.run(c)  # waits for it until a second before its deadline, then reads at its turn
        assert res.status == PASS and early.first is None, res.summary
    finally:
        release.set()


def test_the_second_read_comes_at_least_the_interval_after_the_first(root, monkeypatch):
    """On the real clock: the first read as the run begins, other work between, and the second
    read no sooner than the profile's interval after the first read's last counter."""
    profile = H100.model_copy(update={"rdma": H100.rdma.model_copy(update={"interval_seconds": 0.3})})
    reads = []
    scan = ibports.scan

    def timed_scan(host):
        started = time.monotonic()
        found = scan(host)
        reads.append((started, time.monotonic()))
        return found
    monkeypatch.setattr(ibports, "scan", timed_scan)
    check, c = r.Rdma(), ctx(root, profile=profile)
    check.begin(c)
    c.readings["rdma"].thread.join()
    time.sleep(0.2)  # the checks before rdma
    asked = []
    check.wait = lambda s: (asked.append(s), time.sleep(s))
    res = check.run(c)
    assert res.status == PASS, res.cause
    (_, first_done), (second_started, _) = reads[0], reads[-1]
    assert second_started - first_done >= 0.3 and res.details["interval_seconds"] >= 0.3
    assert asked[0] <= 0.1 + 1e-9  # the 0.2 s of other work was not waited again


# ---- a real node's recorded tree (tests/fixtures/rdma/SOURCE.md) ----------------------------

GPUD_H100 = Path(__file__).parents[1] / "fixtures" / "rdma" / "gpud-h100"


def test_a_real_h100_nodes_ports_are_up_and_its_counters_at_their_ceiling_warn():
    """Eight NDR ports at 400 Gb/s and a 200 Gb/s Ethernet bond, as gpud recorded them. The
    recording holds no GPU or module files, so the ports are judged alone (gpus=0). Every
    port's 4-bit excessive_buffer_overrun_errors sits at 15 and mlx5_1's link_downed at 255:
    growth there cannot be seen, which is a WARN with the way to clear them, never a pass in silence."""
    res = run(GPUD_H100, gpus=0)
    assert res.status == WARN and res.details["parts"] == {"gpudirect": "PASS", "ports": "PASS", "counters": "WARN"}, (res.summary, res.cause)
    assert res.summary == "mlx5_0 port 1: excessive_buffer_overrun_errors at the counter's ceiling (+7 more)"
    # The bond's counter too, reported only: it is no compute port (it was the eighth more).
    assert "mlx5_bond_0 port 1 (Ethernet): excessive_buffer_overrun_errors at the counter's ceiling" in res.details["other_ports"]
    assert "link_downed = 255, excessive_buffer_overrun_errors = 15 on mlx5_1 port 1" in res.cause and "perfquery -x" in res.remedy
    assert "mlx5_7 port 1 port_rcv_errors 14" in res.details["since_boot"]
    assert "link_downed" in res.details["at_ceiling"]["mlx5_1 port 1"] and len(res.details["at_ceiling"]) == 9
    assert res.details["compute_ports"]["ports"] == [f"mlx5_{i} port 1" for i in (0, 1, 4, 5, 6, 7, 8, 9)]  # the bond is Ethernet: not a compute port


def test_a_real_h100_nodes_port_whose_errors_grow_between_the_reads_fails(tmp_path):
    tree = tmp_path / "gpud"
    shutil.copytree(GPUD_H100, tree)
    res = run(tree, then(tree, **{counter("mlx5_7", "port_rcv_errors").replace("/", "__"): "19"}), gpus=0)
    assert res.status == FAIL and res.summary.startswith("mlx5_7 port 1: port_rcv_errors +5 in 3 s"), res.summary


# ---- a node still settling: ports the subnet manager brings up as the run begins ----------


def test_state_and_rate_are_judged_from_the_second_read(ndr_site):
    came_up = port(state="INIT").model_copy(update={"state_later": "ACTIVE"})
    retrained = port(rate="200 Gb/sec (4X HDR)").model_copy(update={"rate_later": "400 Gb/sec (4X NDR)"})
    assert found(facts(came_up, retrained)) == []
    slowed = port().model_copy(update={"rate_later": "200 Gb/sec (4X HDR)"})
    assert [x.summary for x in found(facts(slowed), expect=ndr_site.rdma)] == ["mlx5_0 port 1 at 200 Gb/sec (4X HDR), 400 Gb/sec expected"]
    assert [x.summary for x in found(facts(slowed, port("mlx5_1")))] == ["mlx5_0 port 1 at 200 Gb/sec (4X HDR), below mlx5_1 port 1's 400 Gb/sec (4X NDR)"]


def test_a_port_that_leaves_active_while_watched_still_flaps():
    dropped = port().model_copy(update={"state_later": "INIT"})
    assert [x.summary for x in rdma_judges.judge_counters(facts(dropped), H100.rdma)] == ["mlx5_0 port 1 flapping: ACTIVE -> INIT"]
    went_down = port().model_copy(update={"state_later": "DOWN"})
    assert [x.summary for x in rdma_judges.judge_counters(facts(went_down), H100.rdma)] == ["mlx5_0 port 1 flapping: ACTIVE -> DOWN"]
    lost_early = port(state="DOWN", phys="Polling").model_copy(update={"state_early": "ACTIVE", "state_later": "DOWN"})
    out = rdma_judges.judge_counters(facts(lost_early), H100.rdma)
    assert [x.summary for x in out] == ["mlx5_0 port 1 flapping: ACTIVE -> DOWN"] and "since the run began" in out[0].cause
    bounced = port(state="INIT").model_copy(update={"state_early": "ACTIVE", "state_later": "ACTIVE"})
    out = rdma_judges.judge_counters(facts(bounced), H100.rdma)
    assert [x.summary for x in out] == ["mlx5_0 port 1 flapping: ACTIVE -> INIT -> ACTIVE"] and "since the run began" in out[0].cause


def test_a_port_climbing_from_down_to_active_is_coming_up_not_flapping():
    """At boot a port is DOWN (phys Polling) while its link trains, then INIT, ARMED, ACTIVE as the
    subnet manager configures it, and network-online.target waits for none of it. DOWN -> ACTIVE
    between the reads was once expected to flap: that was a wrong expectation (a climb that never
    leaves ACTIVE is a port coming up); its end state is what judge_ports judges."""
    down_up = port(state="DOWN", phys="Polling").model_copy(update={"state_later": "ACTIVE"})
    assert rdma_judges.judge_counters(facts(down_up), H100.rdma) == [] and found(facts(down_up)) == []
    assert rdma_judges.came_up(down_up) == "DOWN -> ACTIVE"
    climbed = port(state="INIT").model_copy(update={"state_early": "DOWN", "state_later": "ACTIVE"})
    assert found(facts(climbed)) == [] and rdma_judges.came_up(climbed) == "DOWN -> INIT -> ACTIVE"
    sm_at_work = port(state="ARMED").model_copy(update={"state_early": "INIT", "state_later": "INIT"})
    assert rdma_judges.judge_counters(facts(sm_at_work), H100.rdma) == []  # not a flap; INIT at the end is judge_ports' FAIL
    assert [x.summary for x in rdma_judges.judge_ports(facts(sm_at_work), H100.rdma)] == ["mlx5_0 port 1 INIT"]
    # A link that went down and came back while up is still a flap, coming up or not.
    downed = port(state="INIT", first={"link_downed": 0}, later={"link_downed": 1}).model_copy(update={"state_later": "ACTIVE"})
    assert [x.summary for x in rdma_judges.judge_counters(facts(downed), H100.rdma)] == ["mlx5_0 port 1 flapping: link_downed +1 in 3 s"]


def test_a_port_that_came_up_while_watched_is_said_in_details_and_lines(root):
    edit(root, f"{IB}/mlx5_6/ports/1/state", "1: DOWN")
    edit(root, f"{IB}/mlx5_6/ports/1/phys_state", "2: Polling")
    res = run(root, then(root, **{f"{IB}/mlx5_6/ports/1/state".replace("/", "__"): "4: ACTIVE",
                                  f"{IB}/mlx5_6/ports/1/phys_state".replace("/", "__"): "5: LinkUp"}))
    assert res.status == PASS, (res.summary, res.cause)
    assert res.details["came_up"] == {"mlx5_6 port 1": "DOWN -> ACTIVE"}
    assert "came up while watched, not a flap: mlx5_6 port 1 DOWN -> ACTIVE" in res.lines


def test_a_port_init_as_the_run_began_and_active_at_the_checks_turn_passes_on_a_full_interval(root):
    """The boot gate starts before the subnet manager has configured the port: INIT at the early
    read, ACTIVE by rdma's turn. The early read is dropped and the interval measured whole."""
    edit(root, f"{IB}/mlx5_6/ports/1/state", "2: INIT")
    check, c = r.Rdma(), ctx(root)
    check.begin(c)
    c.readings["rdma"].thread.join()
    edit(root, f"{IB}/mlx5_6/ports/1/state", "4: ACTIVE")
    asked = []
    check.wait = asked.append
    res = check.run(c)
    assert res.status == PASS and res.summary.startswith("12/12 RDMA ports ACTIVE"), (res.summary, res.cause)
    assert asked == [3] and "mlx5_6 port 1 INIT -> ACTIVE since the run began" in res.details["first_read"]


def test_one_port_coming_up_keeps_the_early_read_of_every_other_port(root):
    """mlx5_6 turns ACTIVE after the early read, so it gets a first read of the full interval at
    the check's turn; mlx5_2's link went down and came back since the run began: its early read
    stands, and its growth is a flap, not lost with mlx5_6's early read."""
    edit(root, f"{IB}/mlx5_6/ports/1/state", "2: INIT")
    check, c = r.Rdma(), ctx(root)
    check.begin(c)
    c.readings["rdma"].thread.join()
    edit(root, f"{IB}/mlx5_6/ports/1/state", "4: ACTIVE")
    was = int((root / counter("mlx5_2", "link_downed")).read_text())
    edit(root, counter("mlx5_2", "link_downed"), str(was + 1))
    asked = []
    check.wait = asked.append
    res = check.run(c)
    assert res.status == FAIL and res.summary.startswith("mlx5_2 port 1 flapping: link_downed +1 in "), (res.summary, res.cause)
    assert asked == [3] and "mlx5_6 port 1 INIT -> ACTIVE since the run began" in res.details["first_read"]
    ports = {f"{p['device']} port {p['port']}": p for p in res.details["ports"]}
    assert ports["mlx5_6 port 1"]["state_early"] == "INIT" and ports["mlx5_2 port 1"]["state_early"] is None
    assert ports["mlx5_2 port 1"]["interval_seconds"] >= ports["mlx5_6 port 1"]["interval_seconds"] == res.details["interval_seconds"]


def test_a_port_that_trained_faster_since_the_run_began_is_judged_at_its_rate_now(root):
    edit(root, f"{IB}/mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)")
    check, c = r.Rdma(), ctx(root)
    check.begin(c)
    c.readings["rdma"].thread.join()
    edit(root, f"{IB}/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)")
    asked = []
    check.wait = asked.append
    res = check.run(c)
    assert res.status == PASS and asked == [3], (res.summary, res.cause)


def test_a_port_that_came_up_between_the_two_reads_passes(root):
    edit(root, f"{IB}/mlx5_6/ports/1/state", "3: ARMED")
    res = run(root, then(root, **{f"{IB}/mlx5_6/ports/1/state".replace("/", "__"): "4: ACTIVE"}))
    assert res.status == PASS, (res.summary, res.cause)


def test_the_early_read_stands_where_nothing_changed(root):
    check, c = r.Rdma(), ctx(root)
    check.begin(c)
    c.readings["rdma"].thread.join()
    res = check.run(c)
    assert res.status == PASS and res.details["first_read"] == "as the run began"


def test_begin_starts_no_thread_on_a_node_without_rdma_ports(root):
    shutil.rmtree(root / IB)
    check, c = r.Rdma(), ctx(root)
    check.begin(c)
    assert c.readings == {} and check.applies(c) == r.NO_DEVICE
    (root / IB).mkdir()
    check.begin(c)
    assert c.readings == {}


def test_a_port_that_moved_down_a_step_while_watched_is_said_as_changed_never_as_coming_up():
    # INIT -> DOWN as the subnet manager retrains a link at boot is no flap (it never was ACTIVE),
    # but it did not come up either: said as it is, and judged by where it ended.
    retrained = port(state="INIT").model_copy(update={"state_later": "DOWN"})
    assert rdma_judges.came_up(retrained) is None and rdma_judges.changed(retrained) == "INIT -> DOWN"
    assert rdma_judges.judge_counters(facts(retrained), H100.rdma) == []
    lost = port(state="DOWN").model_copy(update={"state_early": "ARMED", "state_later": "ACTIVE"})
    assert rdma_judges.came_up(lost) is None and rdma_judges.changed(lost) == "ARMED -> DOWN -> ACTIVE"
    sm_at_work = port(state="ARMED").model_copy(update={"state_early": "INIT", "state_later": "INIT"})
    assert rdma_judges.came_up(sm_at_work) is None and rdma_judges.changed(sm_at_work) == "INIT -> ARMED -> INIT"
    climbed = port(state="INIT").model_copy(update={"state_early": "DOWN", "state_later": "ACTIVE"})
    assert rdma_judges.came_up(climbed) == "DOWN -> INIT -> ACTIVE" and rdma_judges.changed(climbed) is None
