"""Reading a capture a person hands over (preflight/readers/capture.py): never hanging
on a FIFO or a device, a pipe read while something writes to it, and a document that
quotes captures told from a capture. The commands' answers are in tests/cli/test_bad_input.py."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from preflight.base.errors import UsageError
from preflight.readers import capture

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
# Captures are every fixture file but the notes about them and the code that built some.
CAPTURES = sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.suffix not in (".md", ".py", ".json"))


def read(path: Path | str) -> str:
    return capture.read_text(path, 1 << 20, "pass less")


def test_a_fifo_nothing_writes_to_is_refused_within_the_grace(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(UsageError, match="a FIFO nothing writes to"):
        read(fifo)
    assert time.monotonic() - started < capture.WRITER_GRACE + 5


def test_a_writer_that_comes_within_the_grace_is_read_to_its_end(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Timer(0.5, lambda: fifo.write_text("late but whole\n" * 10000))  # 150 KB: more than a pipe holds
    writer.start()
    try:
        assert read(fifo) == "late but whole\n" * 10000
    finally:
        writer.join(timeout=10)


def test_a_writer_that_never_finishes_is_refused_at_the_deadline(tmp_path, monkeypatch):
    monkeypatch.setattr(capture, "PIPE_SECONDS", 1.0)
    r, w = os.pipe()
    os.write(w, b"a start, and then nothing\n")
    try:
        with pytest.raises(UsageError, match="its writer did not finish within 1 s"):
            read(f"/proc/self/fd/{r}")
    finally:
        os.close(r)
        os.close(w)


def test_a_device_is_refused_unopened_for_reading_forever():
    with pytest.raises(UsageError, match="is not a regular file"):
        read("/dev/zero")


def test_a_file_it_may_not_read_says_how_to_read_it(tmp_path, monkeypatch):
    # Before: "cannot be read (Permission denied)" and no way forward (a person's 0600 copy of a root log).
    def denied(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(capture.os, "open", denied)
    with pytest.raises(UsageError, match=r"cannot be read \(Permission denied\); run as a user who may read it \(root\), or pass a copy you can read$"):
        read(tmp_path / "log")


def test_a_socket_is_named_a_socket(tmp_path):
    import socket

    # Before: "cannot be read (No such device or address)", ENXIO's words for what open() does to a socket.
    sock = socket.socket(socket.AF_UNIX)
    path = tmp_path / "s"
    try:
        sock.bind(str(path))
        with pytest.raises(UsageError, match=r"/s: is a socket, not a file; save the output to a file first$"):
            read(path)
    finally:
        sock.close()


def test_the_project_s_own_documents_are_documents():
    docs = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
    assert "docs/explain.md" in docs and "docs/ARCHITECTURE.md" in docs
    for doc in docs:
        assert capture.document((ROOT / doc).read_text()), doc


def test_no_recorded_capture_is_taken_for_a_document():
    assert len(CAPTURES) > 100
    assert [p.relative_to(FIXTURES) for p in CAPTURES if capture.document(p.read_text(errors="replace"))] == []


def test_a_log_pasted_between_fences_is_still_a_capture():
    pasted = "```\nnode1:12:12 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nnode1:12:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n```\n"
    assert not capture.document(pasted)
    assert capture.document("# Notes\n\nSee [the log](https://example.com/log).\n\n## Why\n\n" + pasted)


def test_a_capture_saved_with_terminal_escapes_reads_as_the_same_capture_without(tmp_path):
    plain = (FIXTURES / "topo" / "08_a100-pcie-2x_no-nvlink_SYS_split-numa-0-1_2mlx5.txt").read_text()
    saved = tmp_path / "topo.txt"
    saved.write_bytes(("\t\x1b[4m" + plain.lstrip("\t").replace("\n", "\x1b[0m\r\n", 1)).encode())
    assert saved.read_text() != plain
    assert read(saved) == plain


@pytest.mark.parametrize("encoding, bom", [("utf-16-le", b"\xff\xfe"), ("utf-16-be", b"\xfe\xff")])
def test_a_capture_saved_as_utf16_with_its_byte_order_mark_reads_as_the_same_text(tmp_path, encoding, bom):
    # Windows PowerShell 5.1's `>` (Out-File, "Unicode" by default) writes UTF-16LE with a BOM: a capture
    # saved so on a laptop (`ssh node nvidia-smi topo -m > topo.txt`) is text, not a binary file.
    text = (FIXTURES / "topo" / "02_h100-sxm-8x_nv18_12nic_single-numa-0-191_gpu-numa-id.txt").read_text()
    saved = tmp_path / "topo.txt"
    saved.write_bytes(bom + text.encode(encoding))
    assert capture.read_text(saved, 1 << 20, "x") == text


def test_nul_bytes_without_a_utf16_byte_order_mark_are_still_not_text(tmp_path):
    saved = tmp_path / "x.gz"
    saved.write_bytes(b"\xff\xfa\x00\x01" * 100)
    with pytest.raises(UsageError, match="is not text"):
        capture.read_text(saved, 1 << 20, "x")
