import io

from preflight.check import Result, Status
from preflight.console import Console


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


def test_quiet_hides_passes_but_never_problems():
    out = io.StringIO()
    c = Console(quiet=True, stream=out)
    c.finish(Result(check="a", status=Status.PASS, summary="ok"))
    c.finish(FAIL)
    assert "[PASS]" not in out.getvalue() and "[FAIL] shm" in out.getvalue()
