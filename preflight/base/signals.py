"""SIGTERM, SIGINT and SIGHUP as Interrupted, for a command that must clean up when stopped."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

from preflight.base.errors import Interrupted

STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # systemd's stop, Ctrl-C, a closed terminal


@contextlib.contextmanager
def interrupting(on_signal: Callable[[], None] | None = None) -> Iterator[None]:
    """While inside, a stopping signal raises Interrupted in the main thread, so
    the code under way can stop what it started (the runner kills the running
    check's workers and still writes the report; pairwise stops every pair); or,
    given ``on_signal``, calls it instead, for a loop that stops at a point of
    its choosing. The handlers before are put back on the way out.

    Python lets only the main thread set a handler: elsewhere (a test's thread)
    the process's own handlers stay."""

    def handler(signum: int, _frame: object) -> None:
        if on_signal is None:
            raise Interrupted(signum)
        on_signal()

    saved = {s: signal.signal(s, handler) for s in STOPPING} if threading.current_thread() is threading.main_thread() else {}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
