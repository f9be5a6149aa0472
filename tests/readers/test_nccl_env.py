"""NCCL's settings as NCCL sees them: what a config file another user could put in the way does."""

from __future__ import annotations

import os
import pwd
import threading
import time
from pathlib import Path

from preflight.base.host import Host
from preflight.readers.nccl import nccl_env


def test_a_fifo_or_a_device_at_the_config_file_s_name_is_read_as_no_file_at_once(tmp_path: Path):
    # A FIFO nobody writes would block open() and read() for ever; /dev/zero would fill memory.
    os.mkfifo(tmp_path / "fifo.conf")
    (tmp_path / "zero.conf").symlink_to("/dev/zero")
    for name in ("fifo.conf", "zero.conf"):
        host = Host(tmp_path, environ={"NCCL_CONF_FILE": f"/{name}", "NCCL_DEBUG": "WARN"})
        got: dict = {}
        reader = threading.Thread(target=lambda: got.update(nccl_env.read(host)), daemon=True)
        started = time.monotonic()
        reader.start()
        reader.join(10)
        assert not reader.is_alive() and time.monotonic() - started < 5
        assert got == {"NCCL_CONF_FILE": [(f"/{name}", nccl_env.ENVIRONMENT)], "NCCL_DEBUG": [("WARN", nccl_env.ENVIRONMENT)]}


def test_the_user_file_is_the_home_nccl_finds_not_home_from_the_environment(tmp_path: Path, monkeypatch):
    # root run with another user's HOME (sudo -E): NCCL reads root's ~/.nccl.conf, so the check does too.
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".nccl.conf").write_text("NCCL_SHM_DISABLE=1\n")
    user, system = nccl_env.conf_files(Host(environ={}))
    assert user == os.path.join(pwd.getpwuid(os.getuid()).pw_dir, ".nccl.conf")
    assert not user.startswith(str(tmp_path)) and system == "/etc/nccl.conf"


def test_a_large_config_file_is_read_up_to_its_limit(tmp_path: Path):
    (tmp_path / "big.conf").write_text("NCCL_P2P_LEVEL=NVL\n" + "#" * (2 * nccl_env.CONF_LIMIT) + "\nNCCL_SHM_DISABLE=1\n")
    found = nccl_env.read(Host(tmp_path, environ={"NCCL_CONF_FILE": "/big.conf"}))
    assert {k: v for k, v in found.items() if k != "NCCL_CONF_FILE"} == {"NCCL_P2P_LEVEL": [("NVL", "/big.conf")]}


def test_p2p_level_is_read_as_nccl_reads_it():
    # ncclGetLevel: the exact word (strcmp), else the old numbers 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and up SYS; anything else is ignored.
    read = {v: nccl_env.p2p_level(v) for v in ("NVL", "PIX", "PHB", "SYS", "0", "1", "2", "3", "4", "7", "nvl", "everything")}
    assert read == {"NVL": "NVL", "PIX": "PIX", "PHB": "PHB", "SYS": "SYS", "0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB",
                    "4": "SYS", "7": "SYS", "nvl": None, "everything": None}


def test_p2p_level_sys_or_a_word_nccl_ignores_is_no_switch_left_on():
    found = {"NCCL_P2P_LEVEL": [("SYS", "/etc/nccl.conf")], "NCCL_IB_DISABLE": [("1", nccl_env.ENVIRONMENT)]}
    assert [name for name, *_ in nccl_env.switches_on(found)] == ["NCCL_IB_DISABLE"]
    assert nccl_env.switches_on({"NCCL_P2P_LEVEL": [("nvl", nccl_env.ENVIRONMENT)]}) == []
    assert [name for name, *_ in nccl_env.switches_on({"NCCL_P2P_LEVEL": [("PHB", nccl_env.ENVIRONMENT)]})] == ["NCCL_P2P_LEVEL"]


def test_a_config_file_is_read_as_nccls_setenvfile_reads_it(tmp_path: Path):
    """misc/param.cc's setEnvFile keeps each name and value as written: what NCCL ignores is no setting,
    and what NCCL takes whole is judged whole."""
    (tmp_path / "nccl.conf").write_text(
        "# NCCL_SHM_DISABLE=1\n"            # a comment line: nothing
        "NCCL_P2P_DISABLE = 1\n"           # sets "NCCL_P2P_DISABLE ", which NCCL never reads
        "  NCCL_IB_DISABLE=1\n"            # an indented name: the same
        "NCCL_SOCKET_IFNAME=ib0 # IPoIB\n"  # NCCL looks for an interface "ib0 # IPoIB"
        "NCCL_DEBUG=WARN=1\n"              # the value is all after the first =
        "no equals sign\n"
    )
    found = nccl_env.read(Host(tmp_path, environ={"NCCL_CONF_FILE": "/nccl.conf"}))
    assert found == {"NCCL_P2P_DISABLE ": [(" 1", "/nccl.conf")], "NCCL_SOCKET_IFNAME": [("ib0 # IPoIB", "/nccl.conf")],
                     "NCCL_DEBUG": [("WARN=1", "/nccl.conf")], "NCCL_CONF_FILE": [("/nccl.conf", nccl_env.ENVIRONMENT)]}
    assert nccl_env.switches_on(found) == []  # P2P is not disabled: NCCL reads no "NCCL_P2P_DISABLE"


def test_an_integer_switch_is_read_as_nccls_strtol_reads_it():
    # NCCL reads NCCL_*_DISABLE with strtol(value, NULL, 0), and takes SHM and P2P off only at exactly 1.
    def on(name, value):
        return [n for n, *_ in nccl_env.switches_on({name: [(value, "/etc/nccl.conf")]})]
    assert on("NCCL_P2P_DISABLE", "0 # keep P2P on") == [] and on("NCCL_P2P_DISABLE", "1 # debugging") == ["NCCL_P2P_DISABLE"]
    assert on("NCCL_SHM_DISABLE", "2") == [] and on("NCCL_SHM_DISABLE", "0x1") == ["NCCL_SHM_DISABLE"]
    assert on("NCCL_IB_DISABLE", "2") == ["NCCL_IB_DISABLE"] and on("NCCL_IB_DISABLE", "no") == []
    assert nccl_env.p2p_level("SYS\r") is None and nccl_env.p2p_level("PIX") == "PIX"  # a CRLF file's word is no word NCCL knows
