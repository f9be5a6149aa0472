"""The NCCL settings judges (preflight/checkkit/nccl_settings.py), on recorded facts: the
debugging switches of the environment and NCCL's conf files against the node's GPU pairs and
RDMA devices, and *_SOCKET_IFNAME against the node's interfaces. No processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.checkkit import nccl_settings as nccl  # the tests' bodies as they were in tests/checks/test_nccl_judge.py
from preflight.pipeline.check import Result
from preflight.readers.nccl import nccl_env

FAIL, WARN = Status.FAIL, Status.WARN
ENV = nccl_env.ENVIRONMENT


# --- judge_env: debugging switches ---------------------------------------------


def test_shm_disable_in_the_environment_warns_with_its_cost():
    (f,) = nccl.judge_env({"NCCL_SHM_DISABLE": [("1", ENV)]})
    assert f.status is WARN
    assert f.summary == "NCCL_SHM_DISABLE=1 is set"
    assert "14x" in f.cause and "the environment" in f.cause and "shared-memory" in f.cause
    assert "unset NCCL_SHM_DISABLE" in f.remedy


def test_p2p_disable_only_in_a_conf_file_warns_naming_the_file():
    (f,) = nccl.judge_env({"NCCL_P2P_DISABLE": [("1", "/etc/nccl.conf")]})
    assert f.status is WARN and f.summary == "NCCL_P2P_DISABLE=1 is set"
    assert "/etc/nccl.conf" in f.cause and "NVLink" in f.cause
    assert "unset NCCL_P2P_DISABLE" in f.remedy and "/etc/nccl.conf" in f.remedy


def test_p2p_disable_costs_what_p2p_level_loc_costs():
    # NCCL reads NCCL_P2P_DISABLE=1 as level LOC (src/graph/paths.cc ncclGetLevel). A site-wide
    # /etc/nccl.conf on a one-GPU node, or on GPUs that cannot do P2P by design, cuts nothing.
    env = {"NCCL_P2P_DISABLE": [("1", "/etc/nccl.conf")]}
    loc = {"NCCL_P2P_LEVEL": [("LOC", "/etc/nccl.conf")]}
    assert nccl.judge_env(env, pairs={}) == [] == nccl.judge_env(loc, pairs={})
    assert "this run has one GPU" in nccl.env_without_cost(env, pairs={})["NCCL_P2P_DISABLE"]
    assert nccl.judge_env(env, pairs={frozenset((0, 1)): nccl.BY_DESIGN}) == []
    # Pairs through the CPU: NCCL's default stops at PXB on Intel and ARM (and on AMD past two GPUs
    # since 2.23), so the switch cuts nothing there, and both switches say so alike.
    cpu = {frozenset((0, 1)): "SYS", frozenset((0, 2)): "PHB"}
    assert nccl.judge_env(env, pairs=cpu) == [] == nccl.judge_env(loc, pairs=cpu)
    # Where NCCL's default reaches them (an AMD host with two GPUs), both warn.
    for switch in (env, loc):
        (f,) = nccl.judge_env(switch, pairs=cpu, cpu_too=True)
        assert f.status is WARN and "GPU 0 and GPU 1 (SYS)" in f.cause, switch
    # Where a pair is joined nearer, it warns naming those pairs.
    (f,) = nccl.judge_env(env, pairs={frozenset((0, 1)): "NVL", frozenset((0, 2)): "SYS"})
    assert f.status is WARN and f.summary == "NCCL_P2P_DISABLE=1 is set"
    assert "1 GPU pair(s)" in f.cause and "GPU 0 and GPU 1 (NVL)" in f.cause and "GPU 0 and GPU 2" not in f.cause


@pytest.mark.parametrize("vendor, gpus, version, reaches", [
    ("AuthenticAMD", 2, "2.27.5", True),  # from 2.23: SYS on AMD x86 with two GPUs or fewer
    ("AuthenticAMD", 8, "2.27.5+cuda12.9", False),  # ... PXB past that
    ("AuthenticAMD", 8, "2.21.5", True),  # before 2.23: SYS but on ARM, Intel and Zhaoxin
    ("AuthenticAMD", 8, None, False),  # version unknown: the newer rule
    ("GenuineIntel", 2, "2.21.5", False),
    ("Shanghai", 4, "2.21.5", False),  # Zhaoxin
    ("HygonGenuine", 4, "2.21.5", True),  # a vendor NCCL did not lower the level for
    ("HygonGenuine", 2, "2.27.5", False),  # from 2.23: AMD's alone
    ("POWER", 4, "2.21.5", True),
    ("ARM", 2, "2.21.5", False),
    (None, 2, "2.21.5", False),  # unknown: no cost claimed
])
def test_nccls_default_p2p_level_through_the_cpu(vendor, gpus, version, reaches):
    # NVIDIA/nccl src/graph/paths.cc ncclTopoCheckP2p, v2.22.3-1 and v2.23.4-1 on.
    assert nccl.reaches_cpu(vendor, gpus, version) is reaches


def test_a_p2p_level_with_the_pairs_unknown_is_judged_by_where_nccls_default_stops():
    env = {"NCCL_P2P_LEVEL": [("PXB", ENV)]}
    assert nccl.judge_env(env) == [] and "stops on this host" in nccl.env_without_cost(env)["NCCL_P2P_LEVEL"]
    (f,) = nccl.judge_env(env, cpu_too=True)  # an AMD host with two GPUs: NCCL's default reaches SYS
    assert f.status is WARN and "through a host bridge (PHB)" in f.cause


def test_the_cpu_vendor_is_read_from_proc_cpuinfo(tmp_path):
    from preflight.readers.system.cpu_vendor import cpu_vendor

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert cpu_vendor(Host(tmp_path)) == "AuthenticAMD"
    (tmp_path / "proc" / "cpuinfo").write_text("processor\t: 0\nvendor_id\t:   Shanghai  \n")  # Zhaoxin's, spaced
    assert cpu_vendor(Host(tmp_path)) == "Shanghai"
    (tmp_path / "proc" / "cpuinfo").write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n")
    assert cpu_vendor(Host(tmp_path)) == "ARM"
    (tmp_path / "proc" / "cpuinfo").write_text("processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\n")
    assert cpu_vendor(Host(tmp_path)) == "POWER"
    assert cpu_vendor(Host(tmp_path / "none")) is None


def test_shm_disable_costs_nothing_where_every_pair_is_joined_by_p2p():
    # NCCL takes SHM only for a pair P2P cannot join (it tries P2P first): on an NVSwitch board, or with one GPU,
    # a site's NCCL_SHM_DISABLE=1 (a workaround for a small /dev/shm) moves nothing to sockets.
    env = {"NCCL_SHM_DISABLE": [("1", ENV)]}
    nvswitch = {frozenset((a, b)): "NVL" for a in range(8) for b in range(a + 1, 8)}
    assert nccl.judge_env(env, pairs=nvswitch) == [] == nccl.judge_env(env, pairs={})
    assert "joined by NVLink" in nccl.env_without_cost(env, pairs=nvswitch)["NCCL_SHM_DISABLE"]
    assert "one GPU" in nccl.env_without_cost(env, pairs={})["NCCL_SHM_DISABLE"]
    # A pair through the CPU, one that cannot do P2P by design, or one under a PCIe switch (where ACS, an IOMMU
    # or a hypervisor can forbid P2P) may use SHM: there it costs.
    for kind in ("SYS", "PIX", nccl.BY_DESIGN):
        (f,) = nccl.judge_env(env, pairs={frozenset((0, 1)): "NVL", frozenset((0, 2)): kind})
        assert f.summary == "NCCL_SHM_DISABLE=1 is set" and "14x" in f.cause
    # So it does where P2P is switched off too (E14: both set, the ranks talk over a socket).
    both = {**env, "NCCL_P2P_DISABLE": [("1", ENV)]}
    assert [f.summary for f in nccl.judge_env(both, pairs=nvswitch)] == ["NCCL_SHM_DISABLE=1 is set", "NCCL_P2P_DISABLE=1 is set"]
    assert [f.summary for f in nccl.judge_env({**env, "NCCL_P2P_LEVEL": [("LOC", ENV)]}, pairs=nvswitch)][0] == "NCCL_SHM_DISABLE=1 is set"
    assert nccl.judge_env(env) != []  # the pairs unknown: as before
    assert nccl.judge_env({"NCCL_P2P_LEVEL": [("NVL", ENV)]}, pairs={frozenset((0, 1)): nccl.BY_DESIGN}) == []  # no P2P to cut


@pytest.mark.parametrize("name", ["NCCL_SHM_DISABLE", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE"])
def test_a_disable_switch_set_to_0_is_nothing(name):
    assert nccl.judge_env({name: [("0", ENV)]}) == []
    assert nccl.judge_env({name: [(" 0 ", "/etc/nccl.conf")]}) == []


@pytest.mark.parametrize("name", ["NCCL_SHM_DISABLE", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_P2P_LEVEL"])
def test_an_empty_value_is_nothing(name):
    # NCCL ignores an empty setting (ncclLoadParam reads a value only when strlen > 0;
    # NCCL_P2P_LEVEL="" matches no level name), so nothing is switched off.
    assert nccl.judge_env({name: [("", ENV)]}) == []


def test_p2p_level_nearer_than_pcie_switches_warns_where_the_pairs_are_unknown():
    (f,) = nccl.judge_env({"NCCL_P2P_LEVEL": [("NVL", ENV)]})
    assert f.status is WARN and f.summary == "NCCL_P2P_LEVEL=NVL is set"
    assert "caps the distance" in f.cause and "unset NCCL_P2P_LEVEL" in f.remedy
    assert "GPU pairs under one PCIe switch (PIX) or across PCIe switches (PXB) go through host memory" in f.cause


@pytest.mark.parametrize("value", ["SYS", "4", "5"])
def test_p2p_level_sys_allows_every_path_and_is_nothing(value):
    # SYS: P2P even across the SMP interconnect between NUMA nodes, the widest level (old numbering: 4 and up).
    assert nccl.judge_env({"NCCL_P2P_LEVEL": [(value, "/etc/nccl.conf")]}) == []
    assert nccl.judge_env({"NCCL_P2P_LEVEL": [(value, ENV)]}, pairs={frozenset((0, 1)): "SYS"}) == []


@pytest.mark.parametrize("value", ["PXB", "PHB", "3"])
def test_p2p_level_past_the_pcie_switches_cuts_only_paths_through_the_cpu_and_is_nothing(value):
    env = {"NCCL_P2P_LEVEL": [(value, ENV)]}
    assert nccl.judge_env(env) == []
    assert "cuts only paths through the CPU" in nccl.env_without_cost(env)["NCCL_P2P_LEVEL"]


def test_p2p_level_names_the_pairs_of_this_node_it_cuts():
    pairs = {frozenset((0, 1)): "NVL", frozenset((0, 2)): "PIX", frozenset((1, 2)): "PXB", frozenset((0, 3)): "SYS"}
    (f,) = nccl.judge_env({"NCCL_P2P_LEVEL": [("NVL", "/etc/nccl.conf")]}, pairs=pairs)
    assert f.status is WARN and "2 GPU pair(s)" in f.cause and "GPU 0 and GPU 2 (PIX), GPU 1 and GPU 2 (PXB)" in f.cause
    assert "GPU 0 and GPU 1" not in f.cause and "GPU 0 and GPU 3" not in f.cause  # NVLink kept; SYS not the node's need
    (off,) = nccl.judge_env({"NCCL_P2P_LEVEL": [("LOC", ENV)]}, pairs=pairs)
    assert "GPU 0 and GPU 1 (NVL)" in off.cause  # LOC turns P2P off, NVLink too


def test_p2p_level_that_cuts_no_pair_of_this_node_is_nothing_and_says_why():
    nvswitch = {frozenset((a, b)): "NVL" for a in range(8) for b in range(a + 1, 8)}
    env = {"NCCL_P2P_LEVEL": [("NVL", ENV)]}
    assert nccl.judge_env(env, pairs=nvswitch) == []
    assert "no NVLink or PCIe-switch pair of this node's GPUs is farther" in nccl.env_without_cost(env, pairs=nvswitch)["NCCL_P2P_LEVEL"]


def test_the_pairs_are_read_from_the_topology_check_s_matrix():
    links = {"0-1": "NV18", "0-2": "PIX", "0-3": "NODE", "1-2": "SYS", "1-3": "PHB"}
    topology = Result(check="topology", status=Status.PASS, summary="ok", details={"matrix": {"links": links}})
    assert nccl.gpu_pairs(topology) == {frozenset((0, 1)): "NVL", frozenset((0, 2)): "PIX", frozenset((0, 3)): "PHB",
                                        frozenset((1, 2)): "SYS", frozenset((1, 3)): "PHB"}
    assert nccl.gpu_pairs(None) is None


def test_ib_disable_warns_about_sockets_between_nodes():
    (f,) = nccl.judge_env({"NCCL_IB_DISABLE": [("1", ENV)]})  # the node's RDMA devices unknown (a saved log)
    assert f.status is WARN and "TCP sockets" in f.cause
    (f,) = nccl.judge_env({"NCCL_IB_DISABLE": [("1", ENV)]}, rdma=["mlx5_0", "mlx5_1"], spans_nodes=True)
    assert f.status is WARN and "InfiniBand/RoCE (mlx5_0, mlx5_1)" in f.cause and "TCP sockets" in f.cause


def test_ib_disable_on_a_node_without_rdma_devices_is_nothing():
    env = {"NCCL_IB_DISABLE": [("1", ENV)]}
    assert nccl.judge_env(env, rdma=[], spans_nodes=True) == []
    assert "no RDMA device" in nccl.env_without_cost(env, rdma=[])["NCCL_IB_DISABLE"]


def test_unrelated_settings_are_nothing():
    assert nccl.judge_env({"NCCL_DEBUG": [("INFO", ENV)], "NCCL_SOCKET_IFNAME": [("eth0", ENV)]}) == []
    assert nccl.judge_env({}) == []


def test_the_environment_wins_over_a_conf_file():
    assert nccl.judge_env({"NCCL_P2P_DISABLE": [("0", ENV), ("1", "/etc/nccl.conf")]}) == []
    (f,) = nccl.judge_env({"NCCL_SHM_DISABLE": [("1", ENV), ("0", "/etc/nccl.conf")]})
    assert "in the environment" in f.cause and "/etc/nccl.conf" not in f.cause


def test_the_environment_wins_when_read_from_a_recorded_host(tmp_path: Path):
    conf = tmp_path / "conf" / "nccl.conf"
    conf.parent.mkdir()
    # As NCCL reads a file (misc/param.cc setEnvFile): "NCCL_P2P_DISABLE = 1" would set a name with a space, read by no one.
    conf.write_text("# site tuning\nNCCL_SHM_DISABLE=1\n# left from a debugging session\nNCCL_P2P_DISABLE=1\n")
    host = Host(tmp_path, environ={"NCCL_CONF_FILE": "/conf/nccl.conf", "NCCL_SHM_DISABLE": "0"})
    env = nccl_env.read(host)
    assert nccl_env.effective(env)["NCCL_SHM_DISABLE"] == ("0", ENV)
    (f,) = nccl.judge_env(env)
    assert f.summary == "NCCL_P2P_DISABLE=1 is set" and "/conf/nccl.conf" in f.cause


# --- judge_ifnames: *_SOCKET_IFNAME against the node's interfaces ---------------

NICS: dict[str, list[str] | None] = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.2"], "ib0": []}
RECORDED: dict[str, list[str] | None] = {"lo": None, "eth0": None, "ib0": None}  # names from sysfs, addresses unknown


def ifname(value: str, var: str = "NCCL_SOCKET_IFNAME", nics=NICS, where: str = ENV):
    return nccl.judge_ifnames({var: [(value, where)]}, nics)


@pytest.mark.parametrize("value", ["eth", "eth0", "=eth0", "e", "^docker,lo", "lo", "eth,ib"])
def test_nccl_socket_ifname_that_selects_an_addressed_interface_is_fine(value):
    assert ifname(value) == []


def test_nccl_socket_ifname_selecting_only_an_interface_without_an_address_fails():
    (f,) = ifname("ib")
    assert f.status is FAIL
    assert f.summary == "NCCL_SOCKET_IFNAME selects an interface without an address"
    assert "ib0" in f.cause and "no IP address" in f.cause and "the environment" in f.cause
    assert "eth0, ib0, lo" in f.remedy


def test_nccl_socket_ifname_naming_a_missing_prefix_fails_and_lists_the_interfaces():
    (f,) = ifname("enp", where="/etc/nccl.conf")
    assert f.status is FAIL and f.summary == "NCCL_SOCKET_IFNAME names a missing interface"
    assert "NCCL_SOCKET_IFNAME=enp" in f.cause and "(enp)" in f.cause and "/etc/nccl.conf" in f.cause
    assert "it has eth0, ib0, lo" in f.cause
    assert "set NCCL_SOCKET_IFNAME to an interface this node has (eth0, ib0, lo)" in f.remedy


def test_nccl_socket_ifname_exact_match_needs_the_whole_name():
    (f,) = ifname("=eth")
    assert f.status is FAIL and f.summary == "NCCL_SOCKET_IFNAME names a missing interface" and "(eth)" in f.cause


def test_nccl_socket_ifname_list_entry_matching_nothing_is_named():
    # A list NCCL reads as "any of these": eth0 is there, so NCCL runs on it (ncclFindInterfaces
    # fails only when no entry matches). The entry that matches nothing may be worth a word,
    # but it must not fail a node on which every rank can open its sockets.
    found = ifname("eth0,nosuch")
    assert [f.status for f in found if f.status is FAIL] == []
    assert all("nosuch" in f.cause for f in found)


def test_nccl_socket_ifname_list_where_no_entry_matches_fails_naming_both():
    (f,) = ifname("enp,nosuch")
    assert f.status is FAIL and "(enp, nosuch)" in f.cause


def test_an_exclusion_that_leaves_nothing_fails():
    (f,) = ifname("^lo,eth,ib")
    assert f.status is FAIL and f.summary == "NCCL_SOCKET_IFNAME names a missing interface"


def test_an_exact_exclusion_excludes_only_the_exact_names():
    # NCCL reads "^=" as: exclude exactly these names ("eth" is no interface, so eth0 stays).
    assert ifname("^=lo,eth") == []


@pytest.mark.parametrize("value", ["", "x"])
def test_a_nccl_socket_ifname_of_under_two_characters_is_ignored_as_nccl_does(value):
    # ncclFindInterfaces: `if (env && strlen(env) > 1)` uses the setting, else picks by itself.
    assert ifname(value) == []


def test_gloo_socket_ifname_takes_exact_names_only():
    (f,) = ifname("eth", var="GLOO_SOCKET_IFNAME")
    assert f.status is FAIL and f.summary == "GLOO_SOCKET_IFNAME names a missing interface"
    assert "GLOO_SOCKET_IFNAME=eth" in f.cause and "eth0, ib0, lo" in f.cause
    assert ifname("eth0", var="GLOO_SOCKET_IFNAME") == []


def test_gloo_socket_ifname_fails_on_any_missing_name_in_its_list():
    # gloo opens one device per listed name: a missing one fails the process group.
    (f,) = ifname("eth0,nosuch", var="GLOO_SOCKET_IFNAME")
    assert f.status is FAIL and "nosuch" in f.cause


def test_gloo_socket_ifname_without_an_address_fails():
    (f,) = ifname("ib0", var="GLOO_SOCKET_IFNAME")
    assert f.status is FAIL and "without an address" in f.summary


def test_both_variables_are_judged():
    found = nccl.judge_ifnames({"NCCL_SOCKET_IFNAME": [("enp", ENV)], "GLOO_SOCKET_IFNAME": [("enp1s0", ENV)]}, NICS)
    assert [f.summary.split()[0] for f in found] == ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"]


def test_unset_variables_and_unread_interfaces_are_nothing():
    assert nccl.judge_ifnames({}, NICS) == []
    assert ifname("enp", nics=None) == []
    assert ifname("enp", var="GLOO_SOCKET_IFNAME", nics=None) == []


def test_unknown_addresses_never_claim_a_missing_address():
    assert ifname("ib", nics=RECORDED) == []
    assert ifname("ib0", var="GLOO_SOCKET_IFNAME", nics=RECORDED) == []
    assert ifname("^docker,lo", nics=RECORDED) == []
    (f,) = ifname("enp", nics=RECORDED)  # a missing name is still missing
    assert f.status is FAIL and "names a missing interface" in f.summary


def test_a_node_with_no_interfaces_says_none():
    (f,) = ifname("eth0", nics={})
    assert "it has none" in f.cause


def test_the_environment_wins_for_socket_ifname_too():
    assert nccl.judge_ifnames({"NCCL_SOCKET_IFNAME": [("eth0", ENV), ("enp", "/etc/nccl.conf")]}, NICS) == []
