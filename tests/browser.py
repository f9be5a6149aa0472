"""Headless Chromium (Debian's `chromium`) for the report page's tests: a
screenshot, the DOM as the browser built it, what the page logged to the
console, and every request it tried to make off the machine.

Requests are caught by pointing Chromium at a proxy of our own on loopback
that answers nothing: whatever reaches it is a request the page (or the
browser itself) tried to send out. Chromium's own background traffic
(component updates, time, accounts) is told apart by its hosts.
"""

from __future__ import annotations

import shutil
import socketserver
import struct
import subprocess
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = shutil.which("chromium")
# Chromium's own services, which it calls whatever page it shows.
BROWSER_HOSTS = ("google.com", "googleapis.com", "gvt1.com", "gstatic.com")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


@dataclass
class Seen:
    console: list[str] = field(default_factory=list)  # what the page logged: errors, CSP refusals
    requests: list[str] = field(default_factory=list)  # request lines the page sent off the machine
    dom: str = ""
    png: bytes = b""


class _Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.lines: list[str] = []
        super().__init__(("127.0.0.1", 0), _Record)


class _Record(socketserver.StreamRequestHandler):
    timeout = 5

    def handle(self) -> None:
        line = self.rfile.readline(4096).decode("latin-1").strip()
        if line:
            self.server.lines.append(line)  # type: ignore[attr-defined]


def _host(request_line: str) -> str:
    target = request_line.split()[1] if len(request_line.split()) > 1 else ""
    return target.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]


def look(page: Path, profile_dir: Path, width: int = 1280, height: int = 3000) -> Seen:
    """Open ``page`` twice in headless Chromium: once for a ``width`` x ``height``
    screenshot, once for the DOM it built; each run has a 60 s deadline."""
    assert CHROMIUM is not None
    seen = Seen()
    proxy = _Proxy()
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        common = [CHROMIUM, *FLAGS, f"--proxy-server=http://127.0.0.1:{proxy.server_address[1]}", "--proxy-bypass-list=<-loopback>"]
        shot = profile_dir / "shot.png"
        for i, mode in enumerate([[f"--window-size={width},{height}", f"--screenshot={shot}"], ["--dump-dom"]]):
            done = subprocess.run([*common, f"--user-data-dir={profile_dir / f'profile{i}'}", *mode, page.as_uri()],
                                  capture_output=True, text=True, timeout=60, start_new_session=True)
            seen.console += [ln for ln in done.stderr.splitlines() if ":CONSOLE" in ln]
            if mode == ["--dump-dom"]:
                seen.dom = done.stdout
        seen.png = shot.read_bytes()
    finally:
        proxy.shutdown()
        proxy.server_close()
    seen.requests = [ln for ln in proxy.lines if not _host(ln).endswith(BROWSER_HOSTS)]
    return seen


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from the IHDR chunk."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", png[16:24])


def png_pixel(png: bytes, x: int, y: int) -> tuple[int, int, int]:
    """The RGB of one pixel of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    width, height = png_size(png)
    depth, colour, interlace = png[24], png[25], png[28]
    assert depth == 8 and colour in (2, 6) and interlace == 0, "only 8-bit RGB(A), non-interlaced"
    channels = 4 if colour == 6 else 3
    data, at = b"", 8
    while at < len(png):
        length, kind = struct.unpack(">I4s", png[at:at + 8])
        if kind == b"IDAT":
            data += png[at + 8:at + 8 + length]
        at += 12 + length
    raw = zlib.decompress(data)
    stride = width * channels
    prev = bytearray(stride)
    for row in range(y + 1):
        f, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        prev = line
    return tuple(prev[x * channels:x * channels + 3])  # type: ignore[return-value]
