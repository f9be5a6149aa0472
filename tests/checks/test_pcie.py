"""The pcie check: the judges on recorded facts, the gatherer on recorded sysfs
trees (tests/fixtures/pcie: pass, fail, a VM), the lspci parser on real output."""

import shutil
import struct
import subprocess
import time
from pathlib import Path

import fakes
import pytest
from conftest import make_ctx, needs_root

from preflight.base.findings import Status
from preflight.base.host import Host
from preflight.checks import pcie as check
from preflight.pipeline.report import Report
from preflight.pipeline.shape import pci_nvidia
from preflight.readers.machine import pcie
from preflight.readers.machine.layout import PciLink
from preflight.readers.machine.pcie import Acs, Bridge, Endpoint, PcieFacts

FIXTURES = Path(__file__).parents[1] / "fixtures" / "pcie"
FAIL, WARN = Status.FAIL, Status.WARN
NVML = Path(__file__).parents[1] / "fixtures" / "nvml" / "h100-sxm-8x-healthy.json"


def gathered(root: Path, path: str = "", as_root: bool | None = None) -> PcieFacts:
    h = Host(root, environ={"PATH": path})
    return pcie.gather(h, pci_nvidia(h).gpus or [], root=as_root)


@pytest.fixture
def tree(tmp_path):
    """A copy of a recorded tree that a test may edit."""
    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(FIXTURES / name, dest, symlinks=True)
        return dest
    return copy


# ---- the judges, on facts written here ---------------------------------------------------------


def gpu(bdf: str, bridges: list[str] | None, kind: str = "GPU", name: str | None = None, iommu: str | None = None) -> Endpoint:
    return Endpoint(kind=kind, name=name or bdf, bdf=bdf, bridges=bridges, iommu_type=iommu)


def facts(ctl_between: int = 0, **kw) -> PcieFacts:
    """Two GPUs under one switch (ports d1, d2) on root port rp."""
    bridges = {b: Bridge(bdf=b, acs=Acs(cap=0x7F, ctl=ctl, source="config space"))
               for b, ctl in [("rp", 0x1D), ("up", 0), ("d1", ctl_between), ("d2", 0)]}
    return PcieFacts(gpus=[gpu("g1", ["rp", "up", "d1"]), gpu("g2", ["rp", "up", "d2"])], bridges=bridges, **kw)


def test_acs_redirect_on_a_port_between_two_gpus_fails_naming_it_and_the_pair():
    found, why = check.judge_acs(facts(ctl_between=0x0C))  # ReqRedir+ CmpltRedir+
    assert why is None and [f.status for f in found] == [FAIL]
    assert "d1 (ACSCtl ReqRedir+ CmpltRedir+) between GPU g1 and GPU g2" in found[0].cause
    assert "ECAP_ACS+0x6.w=0000" in found[0].remedy


def test_acs_on_the_shared_root_port_alone_is_no_fault():
    # Linux sets SV/RR/CR/UF on the root port (0x1D) too; traffic below a shared switch never crosses it.
    assert check.judge_acs(facts()) == ([], None)


def test_source_validation_alone_is_no_finding_and_is_reported_in_the_details():
    # SrcValid checks a request's Requester ID; it routes nothing away from the switch, so P2P still turns there.
    f = facts(ctl_between=0x01)
    assert check.judge_acs(f) == ([], None)
    assert check.acs_without_redirect(f) == {"d1": "ACSCtl SrcValid+"}


def test_ports_left_by_disable_acs_redir_with_source_validation_and_upstream_forwarding_are_no_finding():
    # pci=disable_acs_redir=<ports> clears ReqRedir, CmpltRedir and EgressCtrl (drivers/pci/pci.c
    # pci_disable_acs_redir) and leaves SrcValid and UpstreamFwd on: P2P between the GPUs crosses the switch.
    sv_uf = (1 << pcie.ACS_BITS["SrcValid"]) | (1 << pcie.ACS_BITS["UpstreamFwd"])
    f = facts(cmdline="BOOT_IMAGE=/vmlinuz ro pci=disable_acs_redir=0000:17:00.0;0000:17:01.0")
    for port in ("d1", "d2"):
        f.bridges[port] = Bridge(bdf=port, acs=Acs(cap=0x7F, ctl=sv_uf, source="config space"))
    parts, unjudged = check.judge(f)
    assert parts["acs"] == [] and "acs" not in unjudged
    assert check.acs_without_redirect(f) == {"d1": "ACSCtl SrcValid+ UpstreamFwd+", "d2": "ACSCtl SrcValid+ UpstreamFwd+"}


@pytest.mark.parametrize("bit", ["ReqRedir", "CmpltRedir", "EgressCtrl"])
def test_each_redirect_bit_beside_source_validation_still_fails(bit):
    found, _ = check.judge_acs(facts(ctl_between=1 << pcie.ACS_BITS["SrcValid"] | 1 << pcie.ACS_BITS[bit]))
    assert [x.status for x in found] == [FAIL] and f"d1 (ACSCtl SrcValid+ {bit}+)" in found[0].cause


def test_only_the_ports_where_the_paths_part_are_judged():
    # g1 sits below a second, one-device switch under d1: its ports lead to g1 alone.
    f = facts()
    f.gpus[0] = gpu("g1", ["rp", "up", "d1", "up2", "d3"])
    f.bridges.update({b: Bridge(bdf=b, acs=Acs(cap=0x7F, ctl=0x0C, source="config space")) for b in ("up2", "d3")})
    assert check.shared_switch_ports(*f.gpus) == ["d1", "d2"]
    assert check.judge_acs(f) == ([], None)
    f.bridges["d1"] = Bridge(bdf="d1", acs=Acs(cap=0x7F, ctl=0x0C, source="config space"))
    found, _ = check.judge_acs(f)
    assert [x.summary for x in found] == ["ACS redirects peer traffic on 1 switch port between GPUs/NICs"]
    assert "d1 (ACSCtl ReqRedir+ CmpltRedir+) between GPU g1 and GPU g2" in found[0].cause


def test_acs_between_a_gpu_and_a_management_nic_is_no_fault_but_an_rdma_nic_s_is():
    # One GPU, and under its switch a NIC: a management port moves no peer traffic to the GPU.
    bridges = {b: Bridge(bdf=b, acs=Acs(cap=0x7F, ctl=ctl, source="config space")) for b, ctl in [("rp", 0x1D), ("up", 0), ("d1", 0x0C), ("d2", 0)]}
    nic = Endpoint(kind="NIC", name="eno1", bdf="n1", bridges=["rp", "up", "d2"])
    f = PcieFacts(gpus=[gpu("g1", ["rp", "up", "d1"])], nics=[nic], bridges=bridges)
    assert check.judge_acs(f) == ([], None)
    f.nics[0] = nic.model_copy(update={"name": "mlx5_0", "rdma": True})  # GPUDirect RDMA crosses d1
    found, _ = check.judge_acs(f)
    assert [x.status for x in found] == [FAIL] and "between GPU g1 and NIC mlx5_0" in found[0].cause


def test_devices_under_different_root_ports_share_no_switch_port():
    a, b = gpu("g1", ["rp1", "up1", "d1"]), gpu("g2", ["rp2", "up2", "d2"])
    assert check.shared_switch_ports(a, b) == []


def test_unread_acs_on_a_shared_port_is_said_not_guessed():
    f = facts()
    f.bridges["d1"] = Bridge(bdf="d1", acs_unread="only 64 bytes of its config space are readable")
    found, why = check.judge_acs(f)
    assert found == [] and why == "ACS not read on 1 switch port (d1): only 64 bytes of its config space are readable"


@pytest.mark.parametrize("types, cmdline, groups, want", [
    (["identity", "identity"], "intel_iommu=on iommu=pt", 40, []),
    ([None, None], "ro quiet", 0, []),  # no IOMMU groups: DMA is not remapped
    (["DMA-FQ", "DMA-FQ"], "intel_iommu=on", 40, ["IOMMU translates DMA for 2 GPU/NICs"]),
    ([None, None], "intel_iommu=on", 40, ["IOMMU on in translated mode (intel_iommu=on, no iommu=pt)"]),
    ([None, None], "ro", 40, ["IOMMU on, mode unknown"]),
    ([None, None], "amd_iommu=on iommu=pt", 40, []),
])
def test_iommu_mode(types, cmdline, groups, want):
    f = PcieFacts(gpus=[gpu(f"g{i}", ["rp"], iommu=t) for i, t in enumerate(types)], cmdline=cmdline, iommu_groups=groups)
    found = check.judge_iommu(f)
    assert [x.summary for x in found] == want and all(x.status == WARN and "iommu=pt" in x.remedy for x in found)


def test_iommu_is_not_judged_without_a_gpu_peer_or_rdma_path():
    # One GPU and a management NIC (a net device, no RDMA): no DMA crosses between devices.
    lone = PcieFacts(gpus=[gpu("g0", ["rp"], iommu="DMA-FQ")], nics=[gpu("n0", ["rp2"], kind="NIC", name="eno1", iommu="DMA-FQ")],
                     cmdline="intel_iommu=on", iommu_groups=40)
    parts, unjudged = check.judge(lone)
    assert parts["iommu"] == [] and unjudged == {"iommu": "no GPU peer or RDMA path"}
    # The same GPU beside an RDMA NIC has a GPUDirect RDMA path: judged, the management NIC left out.
    rdma = gpu("n1", ["rp3"], kind="NIC", name="mlx5_0", iommu="DMA-FQ").model_copy(update={"rdma": True})
    with_rdma = lone.model_copy(update={"nics": lone.nics + [rdma]})
    parts, unjudged = check.judge(with_rdma)
    assert [x.summary for x in parts["iommu"]] == ["IOMMU translates DMA for 2 GPU/NICs"] and "iommu" not in unjudged
    assert "eno1" not in parts["iommu"][0].cause


def test_a_narrow_switch_link_fails_and_an_endpoint_link_is_not_judged_here():
    full = PciLink(speed="32.0 GT/s PCIe", width=16, max_speed="32.0 GT/s PCIe", max_width=16)
    narrow = full.model_copy(update={"width": 8})
    idle = full.model_copy(update={"speed": "2.5 GT/s PCIe"})  # the port above an idle GPU
    f = PcieFacts(gpus=[gpu("g1", ["rp", "up", "down"])],
                  bridges={"rp": Bridge(bdf="rp", link=narrow), "up": Bridge(bdf="up", link=narrow), "down": Bridge(bdf="down", link=idle)})
    assert [x.summary for x in check.judge_links(f)] == ["switch link rp -> up runs at x8 of x16"]
    slow = full.model_copy(update={"speed": "16.0 GT/s PCIe"})
    f.bridges["up"] = Bridge(bdf="up", link=slow)
    assert [x.summary for x in check.judge_links(f)] == ["switch link rp -> up runs at 16 of 32 GT/s"]
    # A port that can do less than the other end is not downtrained: the link runs at what both allow.
    f.bridges["up"] = Bridge(bdf="up", link=PciLink(speed="16.0 GT/s PCIe", width=8, max_speed="16.0 GT/s PCIe", max_width=8))
    assert check.judge_links(f) == []


def test_switch_links_follow_the_port_types_where_config_space_tells_them():
    # A non-switch bridge (a retimer's or a PCIe-to-PCI bridge's) between the root port and the
    # switch breaks the positions' rhythm: by position the switch's downstream port and the GPU's
    # idle link would be judged; by type, the link into the switch is.
    full = PciLink(speed="32.0 GT/s PCIe", width=16, max_speed="32.0 GT/s PCIe", max_width=16)
    idle = full.model_copy(update={"speed": "2.5 GT/s PCIe"})  # the port above an idle GPU
    kinds = {"rp": "root", "br": "pci-to-pcie", "up": "upstream", "down": "downstream"}
    f = PcieFacts(gpus=[gpu("g1", ["rp", "br", "up", "down"])],
                  bridges={b: Bridge(bdf=b, link=idle if b == "down" else full, port_type=t) for b, t in kinds.items()})
    assert check.switch_links(f) == [("br", "up")] and check.judge_links(f) == []
    f.bridges["up"] = f.bridges["up"].model_copy(update={"link": full.model_copy(update={"width": 8})})
    assert [x.summary for x in check.judge_links(f)] == ["switch link br -> up runs at x8 of x16"]
    f.bridges["br"] = f.bridges["br"].model_copy(update={"port_type": None})  # one unknown: positions, as before
    assert check.switch_links(f) == [("rp", "br"), ("up", "down")]


def test_the_port_type_is_read_from_the_pci_express_capability():
    config = bytearray(256)
    struct.pack_into("<H", config, 0x06, 0x10)  # Status: a capability list
    config[0x34] = 0x40
    config[0x40:0x42] = bytes([0x01, 0x60])  # power management, next at 0x60
    config[0x60:0x62] = bytes([0x10, 0x00])  # PCI Express, the last
    struct.pack_into("<H", config, 0x62, 0x0052)  # version 2, Device/Port Type 5: a switch upstream port
    assert pcie.port_type(bytes(config)) == "upstream"
    struct.pack_into("<H", config, 0x62, 0x0042)
    assert pcie.port_type(bytes(config)) == "root"
    assert pcie.port_type(bytes(64)) is None  # no capability list
    config[0x40:0x42] = bytes([0x01, 0x40])  # a loop: stops
    assert pcie.port_type(bytes(config)) is None


# ---- config space and lspci ----------------------------------------------------------------------


def test_the_acs_register_is_found_by_walking_the_extended_capabilities():
    config = bytearray(4096)
    struct.pack_into("<I", config, 0x100, 0x0001 | 1 << 16 | 0x1C0 << 20)  # AER, next at 0x1c0
    struct.pack_into("<I", config, 0x1C0, 0x000B | 1 << 16 | 0x2A0 << 20)  # vendor-specific, next 0x2a0
    struct.pack_into("<IHH", config, 0x2A0, 0x000D | 1 << 16, 0x7F, 0x0D)
    acs = pcie.acs_from_config(bytes(config))
    assert acs is not None and acs.on() == ["SrcValid", "ReqRedir", "CmpltRedir"]
    struct.pack_into("<I", config, 0x1C0, 0x000B | 1 << 16 | 0x100 << 20)  # a loop back to 0x100: stops
    assert pcie.acs_from_config(bytes(config)) is None and pcie.acs_from_config(bytes(64)) is None


def test_lspci_output_of_a_real_root_port_parses():
    acs, denied = pcie.parse_lspci((FIXTURES / "lspci" / "comet-lake-root-port-acs-on.txt").read_text())
    assert denied == set() and list(acs) == ["0000:00:14.0", "0000:00:1b.0"]
    assert acs["0000:00:14.0"] is None  # no ACS capability
    port = acs["0000:00:1b.0"]
    assert port is not None and port.on() == ["SrcValid", "ReqRedir", "CmpltRedir"] and port.cap == 0x0F


# ---- the gatherer and judge on recorded trees ---------------------------------------------------


def test_the_healthy_hgx_tree_passes():
    f = gathered(FIXTURES / "pass")
    assert len(f.gpus) == 8 and len(f.nics) == 12
    assert f.gpus[0].bridges == ["0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:01.0"]
    assert {n.name for n in f.nics} >= {"mlx5_0", "mlx5_11"} and f.gpus[0].iommu_type == "identity"
    assert all(n.rdma == n.name.startswith("mlx5_") for n in f.nics)
    assert check.not_applicable(f) is None
    parts, unjudged = check.judge(f)
    assert parts == {"acs": [], "iommu": [], "links": []} and unjudged == {}
    assert len(check.switch_links(f)) == 12  # root port -> upper switch, upper -> each lower, per complex


def test_the_faulty_hgx_tree_names_the_port_the_link_and_the_iommu_mode():
    parts, _ = check.judge(gathered(FIXTURES / "fail"))
    assert [f.summary for f in parts["acs"]] == ["ACS redirects peer traffic on 1 switch port between GPUs/NICs"]
    assert "0000:12:01.0 (ACSCtl SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+) between GPU 0000:1b:00.0 and GPU 0000:43:00.0" in parts["acs"][0].cause
    assert [f.summary for f in parts["links"]] == ["switch link 0000:12:01.0 -> 0000:15:00.0 runs at x8 of x16"]
    assert [(f.status, f.summary) for f in parts["iommu"]] == [(WARN, "IOMMU translates DMA for 20 GPU/NICs")]
    assert "DMA-FQ" in parts["iommu"][0].cause and "intel_iommu=on" in parts["iommu"][0].cause


def test_a_vm_without_visible_bridges_is_not_applicable():
    assert check.not_applicable(gathered(FIXTURES / "vm")) == check.NOT_VISIBLE


def test_no_gpu_on_the_bus_is_not_applicable(tree):
    root = tree("pass")
    for dev in (root / "sys/bus/pci/devices").iterdir():
        if (dev / "vendor").read_text().strip() == "0x10de":
            (dev / "vendor").write_text("0x1af4\n")
    assert check.not_applicable(gathered(root)) == "no NVIDIA GPU on the PCI bus"


def test_config_space_cut_to_64_bytes_skips_acs_with_the_reason(tree):
    root = tree("fail")  # a non-root run: sysfs gives 64 bytes of config space
    for config in (root / "sys/devices").rglob("config"):
        config.write_bytes(config.read_bytes()[:64])
    parts, unjudged = check.judge(gathered(root, as_root=False))
    assert parts["acs"] == [] and "extended capabilities (ACS among them) are shown to root only" in unjudged["acs"]
    assert parts["links"]  # the rest is still judged


def test_a_256_byte_config_space_read_as_root_is_a_bridge_without_acs(tree):
    root = tree("fail")
    for config in (root / "sys/devices").rglob("config"):
        config.write_bytes(config.read_bytes()[:256])
    f = gathered(root, as_root=True)
    parts, unjudged = check.judge(f)
    assert parts["acs"] == [] and "acs" not in unjudged  # a conventional bridge cannot redirect: judged, fine
    bridge = f.bridges["0000:12:01.0"]
    assert bridge.acs_unread is None and bridge.no_acs and "no extended configuration space, so no ACS capability" in bridge.no_acs
    assert "shown to root only" in check.judge(gathered(root, as_root=False))[1]["acs"]


def test_a_host_booted_with_disable_acs_redir_passes_and_says_where_acs_is_on(tree):
    root = tree("pass")
    sv_uf = (1 << pcie.ACS_BITS["SrcValid"]) | (1 << pcie.ACS_BITS["UpstreamFwd"])
    ports = ["0000:12:00.0", "0000:12:01.0"]  # the upper switch's ports where GPU 0000:1b:00.0's and 0000:43:00.0's paths part
    for port in ports:
        config = next((root / "sys/devices").rglob(f"{port}/config"))
        data = bytearray(config.read_bytes())
        data[0x148 + 6:0x148 + 8] = sv_uf.to_bytes(2, "little")  # ACS Control, as the kernel left it
        config.write_bytes(bytes(data))
    (root / "proc/cmdline").write_text(f"BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt pci=disable_acs_redir={';'.join(ports)}\n")
    r = check.Pcie().run(make_ctx(host=Host(root, environ={"PATH": ""})))
    assert r.status == Status.PASS, (r.summary, r.cause)
    assert "no ACS redirect on shared switch ports" in r.summary
    assert r.details["acs_without_redirect"] == dict.fromkeys(ports, "ACSCtl SrcValid+ UpstreamFwd+")


def test_lspci_that_cannot_be_started_leaves_acs_unjudged_saying_so(tree, tmp_path):
    root = tree("fail")
    for config in (root / "sys/devices").rglob("config"):
        config.unlink()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    lspci = bin_dir / "lspci"
    lspci.write_text("#!/nonexistent/interpreter\n")  # on PATH, executable, but exec fails: OSError
    lspci.chmod(0o755)
    parts, unjudged = check.judge(gathered(root, path=str(bin_dir)))
    assert parts["acs"] == [] and "lspci unavailable (No such file or directory)" in unjudged["acs"]
    assert "its sysfs config file could not be read" in unjudged["acs"]


# ---- preflight run, for real -----------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("name, rc, status", [("pass", 0, "PASS"), ("fail", 1, "FAIL"), ("vm", 0, "SKIP")])
def test_run_only_pcie_on_a_recorded_node(tmp_path, name, rc, status):
    """The recorded tree bind-mounted over /sys and its kernel command line over
    /proc/cmdline in a private mount namespace; NVML's word from the fake."""
    tree = FIXTURES / name
    report = tmp_path / "report.json"
    cmd = (f"mount --bind {tree / 'sys'} /sys && mount --bind {tree / 'proc/cmdline'} /proc/cmdline && "
           f"exec {' '.join(fakes.PREFLIGHT)} run --profile h100-sxm --only pcie --nvml-fake {NVML} "
           f"--report {report} --lock-file {tmp_path / 'lock'}")
    p = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert p.returncode == rc, p.stderr
    result = Report.model_validate_json(report.read_text()).checks[0]
    assert result.check == "pcie" and result.status == status, result.summary
    if name == "pass":
        assert result.summary.startswith("8 GPUs, 12 NICs, 42 bridges on their paths: no ACS redirect")
        assert result.details["parts"] == {"acs": "PASS", "iommu": "PASS", "links": "PASS"}
    elif name == "fail":
        assert result.details["parts"] == {"acs": "FAIL", "iommu": "WARN", "links": "FAIL"}
        assert "0000:12:01.0" in result.cause and "iommu=pt" in result.remedy
    else:
        assert result.summary == check.NOT_VISIBLE


# ---- lspci's output unreadable: named, sysfs still answers the links ------------------------------------


@pytest.mark.parametrize("bad, why", [
    (dict(prints=b""), "lspci printed nothing"),
    (dict(prints=fakes.BAD_OUTPUT["garbage"]), "lspci printed no PCI device (garbage, or not `lspci -vvv` output)"),
    (dict(prints=fakes.BAD_OUTPUT["binary"]), "lspci printed no PCI device (garbage, or not `lspci -vvv` output)"),
    (dict(prints=b"", exit_code=1), "lspci exited 1"),
    (dict(hang=True), "lspci did not answer within "),
], ids=["nothing", "garbage", "binary", "exit-1", "hang"])
def test_an_unreadable_lspci_is_named_and_the_node_is_judged_on_sysfs(tree, tmp_path, bad, why):
    root = tree("fail")  # one switch link trained at x8 of x16: a fault of the node
    for config in (root / "sys/devices").rglob("config"):
        config.unlink()
    bin_dir = fakes.tool(tmp_path / "bin", "lspci", **bad)
    ctx = make_ctx(host=Host(root, environ={"PATH": str(bin_dir)}))
    ctx.deadline = time.monotonic() + 5  # leaves lspci 3 s
    started = time.monotonic()
    r = check.Pcie().run(ctx)
    assert time.monotonic() - started < 3 + 4  # lspci's deadline, and the kill's grace
    assert list(r.details["unread"]) == ["lspci -vvv"] and r.details["unread"]["lspci -vvv"].startswith(why)
    assert r.details["sources"] == {"bridges and links": "sysfs"}
    assert r.details["parts"]["acs"] == "SKIP" and r.details["unread"]["lspci -vvv"] in r.details["unjudged"]["acs"]
    assert [(m.labels["tool"], m.labels["fallback"]) for m in r.measurements if m.name == "tool_unreadable"] == [("lspci -vvv", "none")]
    assert r.status == FAIL and r.details["parts"]["links"] == FAIL  # the node's own fault still fails, with its cause
    assert any(line.startswith("unreadable output, not the node's fault: lspci -vvv") for line in r.lines)
