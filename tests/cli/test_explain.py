"""`preflight explain FILE` through the CLI: every real capture placed as its kind and
judged (exit 1 where a finding fails), the JSON's shape, and bad input refused in
one line with exit 2. The readers and explainers are tested on the same files in
tests/readers and tests/outputs, with the captures' INDEX facts."""

import json
import time
from pathlib import Path

import pytest
from conftest import run_preflight
from topology_cases import ALL_TOPO, H200_TOPO, driver_580
from typer.testing import CliRunner

from preflight.cli.app import app

FIX = Path(__file__).parents[1] / "fixtures"

# (capture, the kind it is taken for, exit code): a fail finding exits 1.
CAPTURES = [
    ("nvsmi/q_01_a100-sxm4-80gb_ECC-DRAM-correctable-177_remapped-rows-pending-Yes_bank-histogram_ELIDED.txt", "nvidia-smi-q", 1),
    ("nvsmi/q_04_v100-sxm2-32gb-dell-c4130_HW-Slowdown-Active_HW-Power-Brake-Active_clocks-382MHz_DEINDENTED.txt", "nvidia-smi-q", 1),
    ("nvsmi/q_08_a100-sxm4-80gb_driver555_full-q_GPU1-of-4_clean-baseline_no-timestamp-line.txt", "nvidia-smi-q", 0),
    ("nvsmi/q_10_rtx5090_driver570.124.06_full-q_Link-Width-Current-8x-Max-16x_gen1-of-5-idle_SW-Power-Cap-Active-P8_Remapped-Rows-NA-single-line.txt", "nvidia-smi-q", 1),
    ("nvsmi/dcgmi_01_diag-r2_gpu0-memory-fail_thermal-violation-warning_table-fragment.txt", "dcgmi-diag", 1),
    ("pcie_notice/pcie_01_dmesg-limited-by-16GTs-x16_h100-capable-32GTs_ELIDED.txt", "pcie-notice", 1),
    ("df/shm_01_docker-default-64M_df-h_gh200-container.txt", "df", 1),
    ("topo/02_h100-sxm-8x_nv18_12nic_single-numa-0-191_gpu-numa-id.txt", "topology", 0),
    ("topo/08_a100-pcie-2x_no-nvlink_SYS_split-numa-0-1_2mlx5.txt", "topology", 0),
    ("topo/28_tesla-p4-1gpu_NUMA-Affinity-N-A_double-tabs.txt", "topology", 0),
    ("topo/handmade/H1_4gpu-2nic_cpu-affinity-empty-for-gpu2-gpu3_double-tabs.txt", "topology", 0),
    ("xid/01_xid63_row-remapper-new-row-marked_a100.txt", "kernel-log", 1),
    ("xid/03_xid79_one-liner_no-pid_NVSentinel-155-comment.txt", "kernel-log", 1),
    ("xid/no-gpu-event_dmesg_dev-machine-boot.txt", "kernel-log", 0),
    ("nccl/E04_shm_No-space-left-28_then-socket-errors_timestamped_pytorch-ci-infra-490.log", "nccl-log", 1),
    ("nccl/02_nccl2.27.5_2gpu-consumer_NET-Socket-16ifaces_SHM-direct-direct_isAllDirectP2p0.log", "nccl-log", 0),
    ("nccltests/02_a100-sxm4-80gb-x8_all_reduce_perf_single-process-g8_thanos.txt", "nccl-tests", 0),
    ("nccltests/15_h100-80gb-hbm3-x8_single-node_all_reduce_g8_old-hex-busid_peak-476.53_nccl-tests-290.txt", "nccl-tests", 0),
    ("nccltests/16_h100x8_2node-16gpu-ndr-ib_all_reduce_srun-l-rank-label-prefix_check0-NA-wrong_peak-167.87-at-256MB_DEGRADED_nccl-tests-290.txt", "nccl-tests", 1),
    ("nccltests/19_a40-x4-across-SYS_NCCL_P2P_DISABLE-1_g4_all_reduce_DEGRADED-1.4GBs_table-only.txt", "nccl-tests", 0),
    ("nccl/handmade/H04_nccl2.21.5_2node-16gpu_NCCL_COLLNET_ENABLE-1_Cannot-initialize-CollNet_point-to-point-fallback_handmade.log", "nccl-log", 0),
    ("nccl/handmade/H03_nccl2.7.8_docker-64MiB-dev-shm_include-shm.h-28_posix_fallocate-No-space-left_handmade.log", "nccl-log", 1),
]


def explain(*args: str, timeout: float = 60) -> tuple:
    p = run_preflight(["explain", *args], timeout=timeout)
    return p, (json.loads(p.stdout) if "--json" in args and p.returncode in (0, 1) else None)


@pytest.mark.parametrize("capture, kind, rc", CAPTURES, ids=[c[0].split("/")[-1][:40] for c in CAPTURES])
def test_each_real_capture_is_placed_as_its_kind_and_judged(capture, kind, rc):
    path = FIX / capture
    assert path.exists(), path
    p, doc = explain(str(path), "--json")
    assert p.returncode == rc, (p.stdout[-2000:], p.stderr)
    assert doc["kind"] == kind and doc["source"] == str(path)
    for item in doc["findings"]:
        assert item["severity"] in ("fail", "warn", "info") and item["summary"]
    assert any(i["severity"] == "fail" for i in doc["findings"]) == (rc == 1)
    assert doc["facts"], "the facts read are in the answer"


def test_nccl_tests_output_is_judged_by_the_profile_named_when_its_header_names_no_gpu():
    """11 is mpirun --tag-output with one row pasted: no rank lines, so no GPU model. Without
    --profile it is not judged, and says how to judge it; with h100-sxm its 468.6 GB/s is normal."""
    path = str(FIX / "nccltests/11_aws-p5.48xlarge-8xh100_single-node_all_reduce_NVLS_mpirun-tag-output-prefix_ONE-SIZE-ROW-EXCERPT.txt")
    p, doc = explain(path, "--json")
    assert p.returncode == 0 and doc["kind"] == "nccl-tests" and doc["findings"][0]["summary"].startswith("no profile to judge by")
    p, doc = explain(path, "--json", "--profile", "h100-sxm")
    assert p.returncode == 0 and doc["findings"][0]["summary"].startswith("normal: all_reduce bus bandwidth 468.6 GB/s"), doc["findings"]
    p, doc = explain(path, "--json", "--profile", "auto")  # auto is this machine's GPU, not the capture's: as no profile
    assert p.returncode == 0 and doc["findings"][0]["summary"].startswith("no profile to judge by"), doc["findings"]
    p, _ = explain(path, "--profile", "no-such-gpu")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_the_text_says_what_the_file_was_taken_for_and_each_finding_with_its_fix():
    path = FIX / CAPTURES[0][0]
    p, _ = explain(str(path))
    assert p.returncode == 1
    first, *rest = p.stdout.splitlines()
    assert first == f"{path}: nvidia-smi -q"
    assert any(line.strip().startswith("FAIL") for line in rest) and any(line.strip().startswith("fix:") for line in rest)


def test_a_file_of_no_known_kind_is_one_line_naming_the_kinds_known(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("the node felt slow yesterday\nmaybe the network?\n")
    p, _ = explain(str(other))
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert "not a capture preflight knows" in line and "nvidia-smi -q" in line and "nccl-tests" in line and "df" in line


@pytest.mark.parametrize("content, words", [
    (b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)) * 4, "is not text"),
    (b"", "empty"),
    (b"   \n\n", "empty"),
])
def test_binary_or_empty_input_is_refused_in_one_line(tmp_path, content, words):
    f = tmp_path / "capture"
    f.write_bytes(content)
    p, _ = explain(str(f), "--json")
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert words in line


def test_a_damaged_capture_of_a_known_kind_is_refused_in_one_line():
    """A matrix whose cells a paste fused (PIXNODE) is a topology capture, and a damaged one."""
    p, _ = explain(str(FIX / "topo/malformed/M1_h100-8x_nv18_12nic_PASTE-CORRUPTED-PIXNODE.txt"))
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert "PIXNODE" in line or "nvidia-smi topo -m" in line, line


def test_a_300_mb_file_is_refused_quickly(tmp_path):
    big = tmp_path / "huge.log"
    with big.open("wb") as f:
        f.truncate(300 << 20)  # sparse: no 300 MB written to this disk
    started = time.monotonic()
    p, _ = explain(str(big))
    took = time.monotonic() - started
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "larger than 64 MiB" in p.stderr, p.stderr
    assert took < 30  # bounded: at most 64 MiB is read before the refusal


def test_a_missing_file_or_a_directory_is_refused_in_one_line(tmp_path):
    for path in (tmp_path / "nope.txt", tmp_path):
        p, _ = explain(str(path))
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_the_existing_commands_still_read_their_files():
    p = run_preflight(["xid", "--from", str(FIX / "xid/01_xid63_row-remapper-new-row-marked_a100.txt")])
    assert p.returncode == 1 and "Xid 63" in p.stdout
    p = run_preflight(["topology", "--from", str(FIX / "topo/02_h100-sxm-8x_nv18_12nic_single-numa-0-191_gpu-numa-id.txt")])
    assert p.returncode == 0, p.stderr
    p = run_preflight(["nccl-log", str(FIX / "nccl/E04_shm_No-space-left-28_then-socket-errors_timestamped_pytorch-ci-infra-490.log")])
    assert p.returncode == 1


def test_a_long_kernel_log_whose_xid_comes_after_a_pcie_notice_is_a_kernel_log(tmp_path):
    """The Xid decides the kind wherever it is: a journal's boot lines (a NIC's bandwidth
    notice among them) may run to tens of thousands of lines before the GPU falls off the bus."""
    log = tmp_path / "journal.txt"
    boot = "[   14.912345] mlx5_core 0000:29:00.0: 504.112 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x16 link)\n"
    noise = "".join(f"[   20.{i}] audit: type=1400 audit(1.1:2): apparmor=\"STATUS\" operation=\"profile_load\"\n" for i in range(25000))
    log.write_text(boot + noise + "[ 1234.567890] NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n")
    p, doc = explain(str(log), "--json")
    assert p.returncode == 1 and doc["kind"] == "kernel-log", (doc or {}).get("kind")
    assert any("Xid 79" in i["summary"] and i["severity"] == "fail" for i in doc["findings"])


def test_an_nccl_tests_header_with_no_rows_is_refused_as_nccl_tests_output():
    # The column header is not the last line (a failure line follows): still found, and parse's one line said.
    p, _ = explain(str(FIX / "nccltests/malformed/h07_a100x2_all_reduce_header-only_Test-CUDA-failure-out-of-memory_HANDWRITTEN.txt"))
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert "table header with no rows under it" in line, line


# ---- driver 580's underlined header: `explain` and `topology --from` read the same bytes ---------------



def _answer(args: list[str], path: Path) -> tuple[int, object]:
    """Exit code and what was said, with the file's own name taken out (it differs between the two files)."""
    r = CliRunner().invoke(app, [*args[:-1], str(path), args[-1]] if args[-1] == "--json" else [*args, str(path)])
    if r.exit_code in (0, 1) and "--json" in args:
        said = json.loads(r.stdout)
        said.pop("source", None)
        return r.exit_code, said
    return r.exit_code, r.output.replace(str(path), "FILE")


def test_the_h200_capture_is_one_gpu_on_cpus_0_15_numa_0_with_no_nic_and_no_nvlink():
    code, said = _answer(["explain", "--json"], H200_TOPO)
    assert code == 0 and said["kind"] == "topology" and said["findings"] == []
    g = said["facts"]["gpus"]
    assert [(x["index"], x["cpu_affinity"], x["numa_affinity"], x["gpu_numa_id"], x["nics"]) for x in g] == [(0, "0-15", "0", None, {})]
    assert (said["facts"]["nics"], said["facts"]["links"]) == ([], {})
    code, said = _answer(["topology", "--from", "--json"], H200_TOPO)
    assert code == 0 and said["numa_nodes"] == [0] and said["findings"] == [] and said["links"] == {}


@pytest.mark.parametrize("path", ALL_TOPO, ids=lambda p: p.name[:40])
@pytest.mark.parametrize("args", [["explain", "--json"], ["topology", "--from", "--json"], ["topology", "--from"]], ids=" ".join)
def test_each_topology_capture_with_a_driver_580_header_is_explained_as_the_original(path, args, tmp_path):
    underlined = tmp_path / path.name
    underlined.write_text(driver_580(path.read_text()))
    assert _answer(args, underlined) == _answer(args, path)
