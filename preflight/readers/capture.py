"""Reading a saved capture (a kernel log, an `nvidia-smi topo -m` output) that
a person hands over with ``--from FILE``: every problem is one UsageError line."""

from __future__ import annotations

import stat
from pathlib import Path

from preflight.base.errors import UsageError


def read_text(path: Path | str, limit: int, too_big: str, option: str | None = "--from") -> str:
    """The file's text, read in at most ``limit`` bytes.

    A pipe is fine (``--from <(ssh node nvidia-smi topo -m)``); a device is
    refused, since /dev/kmsg or /dev/zero would never end. ``too_big`` says
    what to pass instead of a file over the limit. Bytes that are not UTF-8
    become U+FFFD: a log with one bad byte is still worth reading. ``option``
    names the flag in messages; None for a positional argument.
    """
    path = Path(path)
    label = f"{option} {path}" if option else str(path)
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise UsageError(f"{label}: is a directory; give the file itself")
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise UsageError(f"{label}: is not a regular file; save the output to a file first")
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise UsageError(f"{label}: no such file") from None
    except OSError as e:
        raise UsageError(f"{label}: cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise UsageError(f"{label}: larger than {_size(limit)}; {too_big}")
    if b"\0" in data[:65536]:
        raise UsageError(f"{label}: is not text (a compressed or binary file?); decompress it first")
    return data.decode("utf-8", errors="replace")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
