"""One run at a time: a boot unit, a timer and a person must not run GPU work at once."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from preflight.base.errors import UsageError


class LockHeld(UsageError):
    """Another run still held the lock when the wait ran out (``run --if-locked skip`` ends here, exit 0)."""

    def __init__(self, message: str, holder: str):
        super().__init__(message)
        self.holder = holder


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
        return f"pid {pid}" if pid.isdigit() else "another process"
    except OSError:
        return "another process"


def _open(path: Path) -> int:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:
        # A lock file root created is read-only to others; flock works on a read-only fd.
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise UsageError(f"lock file {path}: cannot open ({e.strerror}); choose a path you can write (--lock-file)") from None
    except OSError as e:
        raise UsageError(f"lock file {path}: cannot open ({e.strerror}); choose a path you can write (--lock-file)") from None


@contextmanager
def run_lock(path: Path, timeout: float, on_wait: Callable[[str], None] = lambda _: None) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; wait up to ``timeout`` seconds for it.

    The lock dies with the process (flock is released on close or death), so a
    killed run never leaves a stale lock behind.
    """
    fd = _open(path)
    try:
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                if time.monotonic() >= deadline:
                    raise LockHeld(
                        f"another preflight run ({holder}) holds {path}; waited {timeout:g} s. "
                        "Wait for it to finish, or raise --lock-timeout",
                        holder,
                    ) from None
                if not waited:
                    on_wait(holder)
                    waited = True
                time.sleep(0.1)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # read-only lock file: the lock holds, only the holder's pid goes unsaid
        yield
    finally:
        os.close(fd)
