import io
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from types import SimpleNamespace

import fakes
import pytest
from conftest import clean_env

from preflight.outputs.exporters import console as console_mod
from preflight.base import progress as progress_mod
from preflight.pipeline.check import Result
from preflight.base.findings import Status
from preflight.outputs.exporters.console import Console


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


FAIL = Result(check="shm", status=Status.FAIL, summary="too small", cause="64 MiB", remedy="--shm-size=1g")


def test_a_terminal_gets_colour(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    out = Terminal()
    Console(stream=out).finish(FAIL)
    assert "\x1b[" in out.getvalue() and "31m" in out.getvalue()


def test_no_color_is_honoured_on_a_terminal(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("TERM", "xterm-256color")
    out = Terminal()
    Console(stream=out).finish(FAIL)
    assert "[FAIL] shm" in out.getvalue() and "31m" not in out.getvalue()


def test_a_pipe_gets_plain_lines_with_cause_and_fix():
    out = io.StringIO()
    Console(stream=out).finish(FAIL)
    assert out.getvalue() == "[FAIL] shm (0 ms): too small\n        cause: 64 MiB\n        fix: --shm-size=1g\n"


def test_what_another_user_named_cannot_rewrite_the_terminal(monkeypatch):
    # A file in /dev/shm named with a clear-screen and a fake verdict, quoted in a cause.
    forged = Result(check="shm", status=Status.FAIL, summary="full", cause="largest: x\x1b[2J\x1b[Hpreflight: PASS\r (1 GiB)")
    for out in (io.StringIO(), Terminal()):
        monkeypatch.setenv("NO_COLOR", "1")
        Console(stream=out).finish(forged)
        assert "\x1b[2J" not in out.getvalue() and "\r" not in out.getvalue()
        assert "x\\x1b[2J\\x1b[Hpreflight: PASS\\r (1 GiB)" in out.getvalue()


def test_quiet_hides_passes_but_never_problems():
    out = io.StringIO()
    c = Console(quiet=True, stream=out)
    c.finish(Result(check="a", status=Status.PASS, summary="ok"))
    c.finish(FAIL)
    assert "[PASS]" not in out.getvalue() and "[FAIL] shm" in out.getvalue()


# --- progress while a check runs ------------------------------------------------

SHM = SimpleNamespace(name="shm")
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def screen(text: str) -> list[str]:
    """What a terminal shows after ``text``: a carriage return goes back to the
    line's start and what follows overwrites it; escape codes draw nothing."""
    rows, row, col = [""], 0, 0
    for ch in ESCAPES.sub("", text):
        if ch == "\n":
            row, col = row + 1, 0
            rows.append("")
        elif ch == "\r":
            col = 0
        else:
            cur = rows[row].ljust(col)
            rows[row] = cur[:col] + ch + cur[col + 1 :]
            col += 1
    return [r.rstrip() for r in rows]


def running(c: Console, stage_changes=(), seconds=0.5, check=SHM):
    """The runner's part: begin, the console's start, stages over ``seconds``, end."""
    c.progress.begin(check.name)
    c.start(check)
    for stage in stage_changes:
        c.progress.stage(stage)
        time.sleep(seconds / max(1, len(stage_changes)))
    if not stage_changes:
        time.sleep(seconds)
    c.progress.end()


def test_a_terminal_shows_a_live_line_with_a_moving_clock_then_the_result_in_its_place(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = Terminal()
    c = Console(stream=out)
    running(c, ["creating a segment"], seconds=0.7)
    c.finish(FAIL)
    live, result = out.getvalue().split("[FAIL]", 1)
    assert "\x1b" not in live.replace("\x1b[1m", "")  # the live line itself: no escape code at all
    clocks = set(re.findall(r"\rshm  creating a segment  (\d+\.\d) s", live))
    assert len(clocks) >= 2, live  # redrawn a few times a second, the clock moving
    assert screen(out.getvalue()) == ["[FAIL] shm (0 ms): too small", "        cause: 64 MiB", "        fix: --shm-size=1g", ""]


def test_the_live_line_is_down_before_any_other_line_even_without_the_runners_end(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = Terminal()
    c = Console(stream=out)
    c.progress.begin("shm")
    c.start(SHM)
    c.progress.stage("a stage whose words are longer than the note")
    time.sleep(0.3)
    c.note("short")  # printed while the check runs: the live line goes first, whole
    assert screen(out.getvalue()) == ["preflight: short", ""]
    assert not [t for t in threading.enumerate() if t.name == "progress-shm"]


def test_the_runners_end_takes_the_live_line_down_on_any_way_out(monkeypatch):
    out = Terminal()
    c = Console(stream=out)
    running(c, seconds=0.3)  # no finish: an exception left the runner
    assert out.getvalue().endswith("\r") and screen(out.getvalue()) == [""]
    assert not [t for t in threading.enumerate() if t.name.startswith("progress-")]


def test_a_narrow_terminal_never_gets_a_wrapped_live_line(monkeypatch):
    monkeypatch.setattr(console_mod, "_width", lambda stream: 30)
    out = Terminal()
    c = Console(stream=out)
    running(c, ["p2p 256 MiB to cuda:7  rank 3/8"], seconds=0.3, check=SimpleNamespace(name="bandwidth"))
    drawn = [d for d in out.getvalue().split("\r") if d.strip()]
    assert drawn and all(len(d) < 30 for d in drawn)


def test_a_log_gets_a_plain_line_per_stage_change_at_most_one_per_interval(monkeypatch):
    monkeypatch.setattr(progress_mod, "PLAIN_EVERY", 0.5)
    monkeypatch.setattr(console_mod, "PLAIN_POLL", 0.02)
    out = io.StringIO()
    c = Console(stream=out)
    running(c, [f"step {i}" for i in range(32)], seconds=1.6)  # a change every 50 ms
    c.finish(Result(check="shm", status=Status.PASS, summary="ok"))
    lines = out.getvalue().splitlines()
    assert lines[0] == "  ... shm" and lines[-1] == "[PASS] shm (0 ms): ok"
    stages = [re.fullmatch(r"  \.\.\. shm  step \d+  (\d+\.\d) s", line) for line in lines[1:-1]]
    assert stages and all(stages), lines
    clocks = [float(m[1]) for m in stages]
    assert len(clocks) <= 4 and all(b - a >= 0.4 for a, b in zip([0.0, *clocks], clocks)), clocks
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_a_log_without_a_stage_change_gets_only_the_start_line(monkeypatch):
    monkeypatch.setattr(progress_mod, "PLAIN_EVERY", 0.1)
    monkeypatch.setattr(console_mod, "PLAIN_POLL", 0.02)
    out = io.StringIO()
    c = Console(stream=out)
    running(c, seconds=0.4)
    assert out.getvalue() == "  ... shm\n"


def test_quiet_prints_no_progress_in_a_log(monkeypatch):
    monkeypatch.setattr(progress_mod, "PLAIN_EVERY", 0.1)
    monkeypatch.setattr(console_mod, "PLAIN_POLL", 0.02)
    out = io.StringIO()
    c = Console(quiet=True, stream=out)
    running(c, ["a", "b", "c"], seconds=0.5)
    c.finish(Result(check="shm", status=Status.PASS, summary="ok"))
    assert out.getvalue() == ""


# --- a real run on a real terminal (tmux) --------------------------------------

LIVE = re.compile(r"^bandwidth  (?P<stage>.+)  (?P<clock>\d+\.\d) s\s*$")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (tests/install-tools.sh installs it)")
def test_a_real_run_on_a_terminal_shows_stages_and_a_moving_clock_then_only_results(tmp_path):
    sock = tmp_path / "tmux.sock"
    tmux = ["tmux", "-S", str(sock), "-f", "/dev/null"]
    env = {**clean_env(), "NO_COLOR": "1"}
    cmd = " ".join(shlex.quote(w) for w in ["env", *(f"{k}={v}" for k, v in env.items() if k in ("PREFLIGHT_LOCK_FILE", "PREFLIGHT_REPORT", "NO_COLOR", "TMPDIR")),
                                             *fakes.PREFLIGHT, "run", "--profile", "cpu", "--only", "bandwidth"])  # fmt: skip
    # The pane stays after the run so its last screen can be read; the server is killed after.
    subprocess.run([*tmux, "new-session", "-d", "-x", "160", "-y", "50", "-c", os.getcwd(), f"{cmd}; echo EXIT=$?; sleep 120"], check=True, timeout=10)
    try:
        seen: list[re.Match] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pane = subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True, timeout=10).stdout
            if "EXIT=" in pane:
                break
            seen += [m for m in map(LIVE.match, pane.splitlines()) if m]
            time.sleep(0.15)
        else:
            pytest.fail(f"no verdict within 120 s; the pane: {pane}")
        styled = subprocess.run([*tmux, "capture-pane", "-p", "-e"], capture_output=True, text=True, timeout=10).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)
    stages = {m["stage"] for m in seen}
    # What the ranks themselves wrote reaches the line. Which stages a 0.15 s poll catches is
    # timing: the ranks may import torch before the check begins (the head start), and a stage can
    # pass between two captures; the form is what the console promises.
    from_ranks = {s for s in stages if s != "starting 2 ranks"}
    # (a stage may end "  measuring again to confirm" or " failed": the ranks' count comes first)
    assert from_ranks and all(re.search(r"\S  (2 ranks|rank [01]/2)\b", s) for s in from_ranks), stages
    assert from_ranks & {"memcpy 64 MiB  2 ranks", "memcpy 64 MiB  rank 0/2", "memcpy 64 MiB  rank 1/2", "all_reduce 8 MiB  2 ranks",
                         "all_gather 8 MiB  2 ranks", "latency 4 KiB  2 ranks", "importing torch  2 ranks"}, stages  # fmt: skip
    assert len({m["clock"] for m in seen}) >= 2, seen  # the clock moved between two captures
    lines = [line.rstrip() for line in pane.splitlines() if line.strip()]
    # bandwidth measures: on a machine loaded by other work a figure may not settle, a WARN (never a FAIL).
    assert "EXIT=0" in lines and any(line.startswith(("[PASS] bandwidth (", "[WARN] bandwidth (")) for line in lines), pane
    assert any(line.startswith(("preflight: PASS (profile cpu; 1 pass)", "preflight: PASS (profile cpu; 1 warn)")) for line in lines), pane
    assert not [line for line in lines if LIVE.match(line) or any(stage in line for stage in stages)], pane  # nothing left of the live line
    colours = [p for sgr in re.findall(r"\x1b\[([0-9;]*)m", styled) for p in sgr.split(";") if p in {*map(str, range(30, 39)), *map(str, range(90, 98))}]
    assert not colours, "NO_COLOR: no colour on the terminal"


def test_the_verdict_line_names_a_level_other_than_the_gates():
    from conftest import REPORTS

    from preflight.pipeline.report import Report

    report = Report.model_validate_json((REPORTS / "cpu-pass.json").read_bytes())
    lines = {}
    for level in (None, "standard", "quick", "full"):
        out = io.StringIO()
        Console(stream=out).summary(report.model_copy(update={"level": level}))
        lines[level] = out.getvalue().splitlines()[-1]
    assert lines[None].startswith("preflight: PASS (profile cpu; 4 pass)") and lines["standard"] == lines[None]
    assert lines["quick"].startswith("preflight: PASS (profile cpu, level quick; 4 pass)")
    assert lines["full"].startswith("preflight: PASS (profile cpu, level full; 4 pass)")


def test_a_signal_between_making_the_live_line_and_starting_it_ends_the_check_cleanly(monkeypatch):
    # SIGTERM lands as a check begins: the runner takes the live line down, which was made but never
    # run; that is a run interrupted, never an internal error (exit 3) that writes no report.
    from preflight.base.errors import Interrupted

    started = console_mod._Ticker.start

    def signalled(self):
        raise Interrupted(15)

    monkeypatch.setattr(console_mod._Ticker, "start", signalled)
    c = Console(stream=io.StringIO())
    with pytest.raises(Interrupted):
        c.start(SimpleNamespace(name="bandwidth"))
    monkeypatch.setattr(console_mod._Ticker, "start", started)
    c.progress.end()  # the runner's finally: takes the live line down
    assert c._live is None
