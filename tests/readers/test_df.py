"""`df` output read into rows: the real Docker capture (INDEX.md's facts) and
hand-made layouts of df -k, -B1, -T, -hT, a wrapped row and a grep'd row."""

import pytest
from conftest import FIXTURES

from preflight.readers import df

HERE = FIXTURES / "df"
MiB, GiB = 2**20, 2**30


def read(name: str) -> df.DfOutput:
    (path,) = HERE.glob(name + "*")
    return df.parse(path.read_text())


def test_the_docker_capture_gives_shm_at_64m_beside_the_hosts_tmpfs():
    out = read("shm_01_")
    assert out.layout == "human" and out.human
    shm = out.shm()
    assert (shm.filesystem, shm.size_bytes, shm.used_bytes, shm.avail_bytes, shm.use_percent, shm.size_text) == ("shm", 64 * MiB, 0, 64 * MiB, 0, "64M")
    assert shm.type is None and shm.line == 4
    by_mount = {r.mounted_on: r for r in out.rows}
    assert len(out.rows) == 10
    assert by_mount["/dev"].size_bytes == 64 * MiB and by_mount["/dev"].filesystem == "tmpfs"
    assert by_mount["/proc/driver/nvidia"].size_bytes == 263 * GiB and by_mount["/proc/driver/nvidia"].used_bytes == 192 * 1024
    assert by_mount["/"].size_bytes == round(3.9 * 2**40)


def test_df_k_counts_kibibytes_and_skips_the_prompt_line():
    out = read("shm_02_")
    assert (out.layout, out.block_bytes) == ("1K-blocks", 1024)
    assert out.shm().size_bytes == 64 * MiB and out.shm().filesystem == "shm"
    assert out.rows[0].mounted_on == "/" and out.rows[0].size_bytes == 4186993664 * 1024


def test_df_b1_counts_bytes():
    out = read("shm_03_")
    assert (out.layout, out.block_bytes) == ("1B-blocks", 1)
    shm = out.shm()
    assert (shm.size_bytes, shm.used_bytes, shm.avail_bytes, shm.use_percent) == (16 * GiB, 16642998272, 512 * MiB, 97)


def test_df_t_reads_the_type_column():
    out = read("shm_04_")
    shm = out.shm()
    assert (shm.filesystem, shm.type, shm.size_bytes) == ("shm", "tmpfs", 64 * MiB)
    assert [r.type for r in out.rows] == ["overlay", "tmpfs", "ext4", "tmpfs", "tmpfs"]
    assert out.rows[-1].mounted_on == "/run/secrets/kubernetes.io/serviceaccount"


def test_df_ht_with_human_sizes_and_a_type():
    shm = read("shm_05_").shm()
    assert (shm.filesystem, shm.type, shm.size_text, shm.size_bytes) == ("overlay", "overlay", "1.8T", round(1.8 * 2**40))


def test_a_name_too_long_for_its_column_is_joined_with_the_numbers_below_it():
    out = read("shm_06_")
    assert [(r.filesystem, r.mounted_on, r.line) for r in out.rows] == [
        ("/dev/mapper/VolGroup00-LogVol00", "/", 2), ("/dev/sda1", "/boot", 4), ("tmpfs", "/dev/shm", 5)]
    assert out.rows[0].size_bytes == 37727768 * 1024 and out.rows[0].use_percent == 30
    assert out.shm().size_bytes == 16333824 * 1024


def test_a_grepd_row_without_its_header_is_read_where_its_sizes_carry_units():
    out = read("shm_07_")
    assert out.layout == "no header" and out.human
    assert (out.shm().size_bytes, out.shm().avail_bytes, out.shm().use_percent) == (64 * MiB, 0, 100)
    assert df.parse("tmpfs 24683656 0 24683656 0% /dev/shm\n").rows == []  # bare numbers: which block size?


@pytest.mark.parametrize("header, block", [
    ("1K-blocks", 1024), ("1B-blocks", 1), ("1M-blocks", MiB), ("1024-blocks", 1024), ("512-blocks", 512), ("1kB-blocks", 1000),
])
def test_block_headers(header, block):
    assert df.block_bytes(header) == block


def test_values_as_df_prints_them():
    assert df.value_bytes("64M", None) == 64 * MiB
    assert df.value_bytes("1.0T", None) == 2**40
    assert df.value_bytes("1,5G", None) == 3 * GiB // 2  # a comma locale
    assert df.value_bytes("4.1k", None, si=True) == 4100
    assert df.value_bytes("24106M", MiB) == 24106 * MiB  # df -BM writes its unit on each value
    assert df.value_bytes("25277MB", 1000**2) == 25277 * 1000**2  # and df -BMB its SI unit
    assert df.value_bytes("-", 1024) is None


def test_si_sizes_are_told_by_their_lowercase_k():
    out = df.parse("Filesystem      Size  Used Avail Use% Mounted on\ntmpfs            68M  4.1k   68M   1% /dev/shm\n")
    assert out.layout == "human-si" and out.shm().size_bytes == 68_000_000


def test_si_blocks_carry_their_unit_on_each_value():
    out = df.parse("Filesystem     1MB-blocks  Used Available Use% Mounted on\ntmpfs             25277MB   0MB   25277MB   0% /dev/shm\n")
    assert (out.layout, out.block_bytes, out.shm().size_bytes, out.shm().used_bytes) == ("1MB-blocks", 1000**2, 25277 * 1000**2, 0)


def test_busybox_header_and_posix_capacity_column():
    busy = df.parse("Filesystem                Size      Used Available Use% Mounted on\nshm                      64.0M         0     64.0M   0% /dev/shm\n")
    assert busy.shm().size_bytes == 64 * MiB
    posix = df.parse("Filesystem     1024-blocks  Used Available Capacity Mounted on\ntmpfs              65536     0     65536       0% /dev/shm\n")
    assert posix.shm().size_bytes == 64 * MiB


def test_shm_is_the_last_row_on_dev_shm_else_run_shm():
    two = "Filesystem 1K-blocks Used Available Use% Mounted on\ntmpfs 8000 0 8000 0% /dev/shm\nshm 65536 0 65536 0% /dev/shm\n"
    assert df.parse(two).shm().filesystem == "shm"  # the later mount hides the earlier
    debian = "Filesystem 1K-blocks Used Available Use% Mounted on\ntmpfs 4096 0 4096 0% /run/shm\n"
    assert df.parse(debian).shm().mounted_on == "/run/shm"
    assert df.parse("Filesystem 1K-blocks Used Available Use% Mounted on\n/dev/vda 100 1 99 1% /\n").shm() is None


def test_looks_like_df_and_not_the_other_kinds():
    for path in HERE.glob("*.txt"):
        assert df.looks_like(path.read_text()), path.name
    others = [p for d in ("topo", "xid", "nccl", "nccltests", "pcie_notice", "nvsmi", "dcgmi") for p in (FIXTURES / d).rglob("*")
              if p.is_file() and p.suffix in (".txt", ".log")]
    assert len(others) > 40
    assert [p.name for p in others if df.looks_like(p.read_text(errors="replace"))] == []
    assert not df.looks_like("Filesystem       Inodes  IUsed    IFree IUse% Mounted on\ntmpfs  3085457  1  3085456  1% /dev/shm\n")  # df -i: no sizes
