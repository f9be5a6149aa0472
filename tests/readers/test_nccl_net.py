"""The inter-node network judge on real NCCL logs (tests/fixtures/nccl/net-logs, sources in
tests/fixtures/nccl/SOURCE.md) with recorded facts, and the gatherer on recorded host roots."""

import pytest
from conftest import FIXTURES
from fakes import NVIDIA_OPEN_VERSION, NVIDIA_PROPRIETARY_VERSION, rdma_host
from pydantic import ValidationError

from preflight.pipeline import expectations, profiles
from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.readers.nccl.nccl_log import parse
from preflight.readers.nccl.nccl_net import NetFacts, gather, judge, network

NET = FIXTURES / "nccl" / "net-logs"
NODE1 = set(range(8, 16))  # the ib-gdrdma capture is the second node of 2x8 H100


def fixture(prefix: str) -> str:
    (path,) = NET.glob(prefix + "*.log")
    return path.read_text()


def run(prefix: str, facts: NetFacts, expect: str = "ib_gdrdma", local: set[int] | None = None, with_text: bool = True):
    text = fixture(prefix)
    return judge(parse(text), facts, expect, local, text if with_text else "")


# --- RDMA with GPUDirect RDMA: nothing to find -----------------------------------------------

@pytest.mark.parametrize("local", [NODE1, None])
def test_ib_with_gdrdma_to_every_peer_passes_and_names_each_peer(local):
    found, details = run("net-ib-gdrdma", NetFacts(), local=local)
    assert found == [] and details["judged"] and details["causes"] == []
    assert details["summary"] == "NET/IB with GDRDMA to 14 peers"
    assert details["peers"]["7->14"] == {"network": "IB", "gdrdma": True, "transport": "NET/IB/6/GDRDMA"}
    assert "8->15" not in details["peers"]  # P2P/IPC inside the node is the nccl check's business


def test_a_plugin_that_failed_while_nccl_fell_back_to_ib_is_not_a_finding():
    text = fixture("net-ib-gdrdma")
    assert "NET/OFI Invalid type of PCI bus returned 0" in text and "Using network IB" in text
    found, _ = run("net-ib-gdrdma", NetFacts(env={"NCCL_NET_PLUGIN": "libnccl-net.so"}), local=NODE1)
    assert found == []


# --- nothing crosses nodes: no finding, and no pass either ------------------------------------

def test_channels_between_local_ranks_only_leave_nothing_to_judge():
    found, details = run("net-ib-gdrdma", NetFacts(), local=set(range(16)))
    assert found == [] and details["judged"] is False and details["peers"] == {}
    assert "nothing to judge" in details["summary"]


def test_a_single_node_log_leaves_nothing_to_judge():
    (path,) = (FIXTURES / "nccl").glob("01a_*.log")  # 8 GPUs of one pod, P2P only
    found, details = judge(parse(path.read_text()), NetFacts(), "ib_gdrdma", None, path.read_text())
    assert found == [] and details["judged"] is False


def test_an_empty_log_leaves_nothing_to_judge():
    assert judge(parse(""), NetFacts(), "ib", None, "") == ([], {
        "judged": False, "expect": "ib", "peers": {},
        "summary": "no NCCL channel crosses nodes in the log (one node, or NCCL_DEBUG below INFO): nothing to judge"})


# --- IB without GPUDirect RDMA ------------------------------------------------------------------

def test_ib_without_gdrdma_fails_on_peermem_missing():
    (f,), details = run("net-ib-no-gdrdma", NetFacts(ib_devices=["mlx5_0"], active_ports={"mlx5_0": [1]}), local={1})
    assert f.status == Status.FAIL and "without GPUDirect RDMA (2 peers)" in f.summary
    assert details["causes"] == ["peermem"] and details["summary"] == "NET/IB without GDRDMA to 2 peers"
    assert details["peers"]["0->1"] == {"network": "IB", "gdrdma": False, "transport": "NET/IB/0"}
    assert "no GPUDirect RDMA peer-memory module is loaded" in f.cause and "modprobe nvidia_peermem" in f.remedy
    assert "dma-buf" in f.remedy


def test_peermem_loaded_but_nccl_said_disabled_quotes_nccl():
    facts = NetFacts(ib_devices=["mlx5_0"], active_ports={"mlx5_0": [1]}, peermem=["nvidia_peermem"])
    (f,), details = run("net-ib-no-gdrdma", facts)
    assert details["causes"] == ["gdr_off"]
    assert "although nvidia_peermem is loaded" in f.cause and "GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)" in f.cause
    assert "dmesg" in f.remedy and "NVIDIA/nccl#1676" in f.remedy


def test_nccl_older_than_2_23_does_not_see_nvidia_peermem():
    text = fixture("net-ib-no-gdrdma")
    log = parse(text).model_copy(update={"version": "2.14.3"})  # the version NVIDIA/nccl#899 states
    facts = NetFacts(peermem=["nvidia_peermem"])
    (f,), details = judge(log, facts, "ib_gdrdma", None, text)
    assert details["causes"] == ["old_nccl"] and "NVIDIA/nccl#1676" in f.cause and f.remedy == "use NCCL 2.23 or newer"
    (f,), details = judge(log.model_copy(update={"version": "2.23.4"}), facts, "ib_gdrdma", None, text)
    assert details["causes"] == ["gdr_off"]


def test_gdr_level_set_to_loc_is_named_first():
    (f,), details = run("net-ib-no-gdrdma", NetFacts(env={"NCCL_NET_GDR_LEVEL": "LOC"}))
    assert details["causes"][0] == "gdr_level" and "NCCL_NET_GDR_LEVEL=LOC in the job's environment" in f.cause


def test_no_reason_in_the_log_says_so_and_how_to_get_one():
    (f,), details = run("net-ib-no-gdrdma", NetFacts(peermem=["nvidia_peermem"]), with_text=False)
    assert details["causes"] == ["unknown"] and "NCCL_DEBUG_SUBSYS=INIT,ENV,NET" in f.remedy


@pytest.mark.parametrize("expect", ["ib", "any"])
def test_ib_without_gdrdma_is_enough_where_the_profile_asks_only_for_ib(expect):
    found, details = run("net-ib-no-gdrdma", NetFacts(), expect=expect)
    assert found == [] and details["judged"] and details["peers"]["1->0"]["gdrdma"] is False


# --- sockets -------------------------------------------------------------------------------------

def test_sockets_with_ib_disable_in_the_log_name_nccl_as_the_witness():
    (f,), details = run("net-socket-ib-disabled-no-device", NetFacts(), expect="ib", local={0})
    assert f.status == Status.FAIL and f.summary == "NCCL used TCP sockets between nodes (2 peers), not RDMA"
    assert details["causes"][0] == "ib_disabled" and details["summary"] == "NET/Socket to 2 peers"
    assert f.cause.startswith("InfiniBand is switched off: NCCL reports NCCL_IB_DISABLE=1")
    assert "unset NCCL_IB_DISABLE" in f.remedy and "profile nccl.network = ib" in f.cause


def test_ib_disable_in_the_jobs_environment_says_so_and_the_missing_verbs_library_follows():
    (f,), details = run("net-socket-ib-disabled-env-no-libibverbs", NetFacts(env={"NCCL_IB_DISABLE": "1"}), local={0})
    assert details["causes"][:2] == ["ib_disabled", "no_verbs"]
    assert "NCCL_IB_DISABLE=1 in the job's environment" in f.cause and "Failed to open libibverbs.so[.1]" in f.cause
    assert "rdma-core" in f.remedy


def test_ib_disable_0_does_not_count():
    (f,), details = run("net-socket-ib-disabled-env-no-libibverbs", NetFacts(env={"NCCL_IB_DISABLE": "0"}))
    assert "ib_disabled" not in details["causes"]


def test_nccl_net_socket_forced():
    (f,), details = run("net-socket-ib-disabled-env-no-libibverbs", NetFacts(env={"NCCL_NET": "Socket"}))
    assert details["causes"][0] == "net_forced" and "unset NCCL_NET" in f.remedy


def test_a_plugin_that_failed_to_initialize_is_named_before_the_missing_ib_device():
    (f,), details = run("net-socket-plugin-init-failed", NetFacts(), local={0})
    assert details["causes"] == ["plugin", "no_device"]
    assert f.cause.startswith("the network plugin libnccl-net.so failed:") and "aws-ofi-nccl initialization failed" in f.cause
    assert "fi_info -p efa" in f.remedy and "/dev/infiniband" in f.remedy
    assert details["peers"] == {"0->1": {"network": "Socket", "gdrdma": False, "transport": "NET/Socket/0"},
                                "3->0": {"network": "Socket", "gdrdma": False, "transport": "NET/Socket/0"}}


def test_no_device_although_the_host_has_active_ports_points_at_the_container():
    facts = NetFacts(ib_devices=["mlx5_0", "mlx5_1"], active_ports={"mlx5_0": [1], "mlx5_1": [1]})
    (f,), details = run("net-socket-plugin-init-failed", facts)
    assert details["causes"] == ["plugin", "no_device"] and "although the host has mlx5_0, mlx5_1" in f.cause


def test_no_device_with_nccl_ib_hca_set_blames_the_filter():
    facts = NetFacts(ib_devices=["mlx5_0"], active_ports={"mlx5_0": [1]}, env={"NCCL_IB_HCA": "mlx5_9"})
    (f,), details = run("net-socket-plugin-init-failed", facts)
    assert details["causes"] == ["plugin", "ib_hca"] and "NCCL_IB_HCA=mlx5_9 selects none" in f.cause


def test_rdma_ports_all_down():
    (f,), details = run("net-socket-plugin-init-failed", NetFacts(ib_devices=["mlx5_0"]))
    assert details["causes"] == ["plugin", "ports_down"] and "ibstat" in f.remedy


def test_sockets_for_no_reason_nccl_said_say_unknown():
    facts = NetFacts(ib_devices=["mlx5_0"], active_ports={"mlx5_0": [1]})
    (f,), details = run("net-socket-plugin-init-failed", facts, with_text=False)
    assert details["causes"] == ["unknown"] and "unknown reason" in f.cause and "NCCL_DEBUG_SUBSYS" in f.remedy


def test_any_only_reports():
    found, details = run("net-socket-plugin-init-failed", NetFacts(), expect="any")
    assert found == [] and details["summary"] == "NET/Socket to 2 peers" and details["causes"] == []


def test_network_names():
    assert [network(n) for n in ("IB", "IBext", "IBext_v8", "NCCL RDMA Plugin v9", "Socket", "AWS Libfabric", None)] == [
        "IB", "IB", "IB", "IB", "Socket", "AWS Libfabric", "unknown"]


# --- the gatherer -------------------------------------------------------------------------------

def test_gather_on_a_bare_root(tmp_path):
    facts = gather(Host(tmp_path), {"PATH": "/bin", "NCCL_DEBUG": "INFO"})
    assert facts == NetFacts() and facts.dmabuf_capable() is None


def test_gather_reads_ports_modules_kernel_and_env(tmp_path):
    rdma_host(tmp_path, ports={"mlx5_0": {1: "4: ACTIVE"}, "mlx5_1": {1: "1: DOWN"}, "mlx5_2": {1: "4: ACTIVE", 2: "2: INIT"}},
              modules=("nvidia_peermem",), osrelease="5.15.0-105-generic", nvidia_version=NVIDIA_OPEN_VERSION)
    env = {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}
    facts = gather(Host(tmp_path), env)
    assert facts.ib_devices == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert facts.active_ports == {"mlx5_0": [1], "mlx5_2": [1]}
    assert facts.peermem == ["nvidia_peermem"] and facts.memory_peers is False
    assert facts.kernel == "5.15.0-105-generic" and facts.nvidia_open is True and facts.dmabuf_capable() is True
    assert facts.env == {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "eth0"}


def test_gather_nv_peer_mem_and_a_proprietary_driver(tmp_path):
    rdma_host(tmp_path, modules=("nv_peer_mem",), memory_peers=True, osrelease="4.18.0-513.el8.x86_64",
              nvidia_version=NVIDIA_PROPRIETARY_VERSION)
    facts = gather(Host(tmp_path), {})
    assert facts.peermem == ["nv_peer_mem"] and facts.memory_peers and facts.nvidia_open is False
    assert facts.dmabuf_capable() is False and facts.ib_devices == []


@pytest.mark.parametrize(("kernel", "open_", "capable"), [("5.12.0", True, True), ("5.11.22", True, False), ("6.8.0-1015-nvidia", False, False)])
def test_dmabuf_needs_open_modules_and_linux_5_12(kernel, open_, capable):
    assert NetFacts(kernel=kernel, nvidia_open=open_).dmabuf_capable() is capable


def test_gathered_facts_feed_the_judge(tmp_path):
    rdma_host(tmp_path, ports={"mlx5_0": {1: "4: ACTIVE"}})
    (f,), details = run("net-ib-no-gdrdma", gather(Host(tmp_path), {}))
    assert details["causes"] == ["peermem"] and "kernel unknown" in f.cause


# --- the profile setting ------------------------------------------------------------------------

def test_network_other_than_any_needs_a_source():
    with pytest.raises(ValidationError, match="network = 'ib' needs network_source"):
        expectations.NcclExpect(init_source="x", network="ib")
    assert expectations.NcclExpect(init_source="x").network == "any"


@pytest.mark.parametrize("name", ["h100-sxm", "h200-sxm", "a100-sxm4-80gb"])
def test_hgx_profiles_expect_gdrdma_and_carry_internode_floors(name):
    p = profiles.load(profiles.find(name, None))
    assert p.nccl.network == "ib_gdrdma" and p.nccl.network_source
    assert p.floors["internode_allreduce_bus_bandwidth"].unit == "bytes_per_second"
    assert p.floors["internode_allreduce_latency"].bound == "max"


# --- NCCL_NET_GDR_READ=0: sends staged by the site's choice, receives still GPUDirect -------------

def _gdr_read_off_log() -> str:
    # Hand-made from NCCL's formats (src/transport/net.cc v2.30.7-1, "[send] via NET/%s/%d%s%s%s"): with
    # NCCL_NET_GDR_READ=0 (src/graph/paths.cc ncclTopoCheckGdr: "if (gdrReadParam == 0) return") the send
    # side stages through host memory and prints no /GDRDMA; the receive side still writes into the GPU.
    return "\n".join([
        "n1:10:10 [0] NCCL INFO NCCL_NET_GDR_READ set by environment to 0.",
        "n1:10:10 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0",
        "n1:10:10 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
        "n2:20:20 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [send] via NET/IB/0",
        "n2:20:20 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/IB/0/GDRDMA",
    ]) + "\n"


@pytest.mark.parametrize("where", ["log", "env"])
def test_sends_without_gdrdma_under_nccl_net_gdr_read_0_are_the_sites_choice_not_a_finding(where):
    text = _gdr_read_off_log()
    if where == "env":
        text = text.split("\n", 1)[1]
    facts = NetFacts(env={"NCCL_NET_GDR_READ": "0"} if where == "env" else {}, peermem=["nvidia_peermem"])
    for local in ({0}, None):
        found, details = judge(parse(text), facts, "ib_gdrdma", local, text)
        assert found == [] and all(p["gdrdma"] for p in details["peers"].values()), (local, details)


def test_receives_without_gdrdma_still_fail_under_nccl_net_gdr_read_0():
    text = _gdr_read_off_log().replace("[receive] via NET/IB/0/GDRDMA", "[receive] via NET/IB/0")
    (f,), details = judge(parse(text), NetFacts(), "ib_gdrdma", None, text)
    assert f.status == Status.FAIL and details["peers"]["0->8"]["gdrdma"] is False


def test_sends_without_gdrdma_fail_where_gdr_read_is_not_off():
    text = _gdr_read_off_log().split("\n", 1)[1]
    (f,), details = judge(parse(text), NetFacts(), "ib_gdrdma", None, text)
    assert f.status == Status.FAIL and details["peers"]["0->8"]["gdrdma"] is False
