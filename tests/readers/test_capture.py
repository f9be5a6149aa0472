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
