"""`preflight serve`: the last report over HTTP, for Prometheus and for people.

  /         the report as a page for people (outputs/html/page.py)
  /metrics  the report as metrics from the file on disk (a scrape never
            starts GPU work): the report's own families rendered once per
            report, what changes with the clock (vouched, age) and serve's
            own process metrics at each scrape
  /report   the report JSON as written
  /healthz  200 while serve is up; says what state the report is in

Threads and memory are bounded whatever the clients do: the connection loop
(outputs/exporters/serve_loop.py) reads requests and writes answers; this
module renders them.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import sys
import threading
from pathlib import Path
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from preflight.outputs.record import last_report, trends
from preflight.outputs.html import page
from preflight.base.errors import UsageError
from preflight.outputs.exporters import metrics as metrics_mod
from preflight.outputs.exporters.metrics import ReportCollector, StandingCollector
from preflight.outputs.exporters.serve_loop import LoopHandler, LoopServer

# The classic text format every Prometheus since 2.0 reads (the names are all legacy-valid).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HTML = "text/html; charset=utf-8"
WHERE = "listen (--listen, PREFLIGHT_LISTEN or config)"


def parse_listen(text: str) -> tuple[str, int]:
    """``127.0.0.1:9842``, ``[::1]:9842``, ``0.0.0.0:9842`` -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{WHERE} {text!r}: give ADDRESS:PORT with a port from 1 to 65535, e.g. 127.0.0.1:9842")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host:
        raise UsageError(f"{WHERE} {text!r}: name the address; 0.0.0.0:{port} listens on every interface, 127.0.0.1:{port} on loopback only")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"{WHERE} {text!r}: {host!r} is not an IP address; give one of this node's addresses, e.g. 127.0.0.1") from None
    return host, int(port)


class _Handler(LoopHandler):
    server: Server

    # HTTP/1.0: one request per connection, so an idle keep-alive never holds a worker.
    server_version = "preflight"

    def version_string(self) -> str:
        # http.server appends "Python/3.x": a version tells a scanner which flaws to try.
        return self.server_version

    def end_headers(self) -> None:
        # On every answer, http.server's own errors (400, 501) included: each is of the type it
        # says, never sniffed (a report's text taken for HTML would run), and the page's policy
        # binds as a header too, before its meta tag is parsed.
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", page.POLICY)
        super().end_headers()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.server.metrics(), CONTENT_TYPE)
        elif path == "/report":
            loaded = self.server.load()
            if loaded.report is None:
                self._send(503, _json({"state": str(loaded.state), "error": loaded.error}), "application/json")
            else:
                self._send(200, loaded.raw, "application/json")
        elif path == "/healthz":
            loaded = self.server.load()
            self._send(200, f"ok; report {loaded.state}{': ' + loaded.error if loaded.error else ''}\n".encode(), "text/plain; charset=utf-8")
        elif path == "/":
            loaded = self.server.load()
            if loaded.report is None:
                self._send(503, page.unavailable(str(loaded.state), loaded.error).encode(), HTML)
            else:
                self._send(*self.server.page(loaded), HTML)
        else:
            self._send(404, b"not found; try /, /metrics, /report or /healthz\n", "text/plain; charset=utf-8")

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        if self.request_version == "HTTP/0.9":
            return  # no headers in HTTP/0.9: no Content-Security-Policy or nosniff to go with a body, so none is sent
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.body = body

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # a line per scrape would flood the journal


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode() + b"\n"


class Server(LoopServer):
    def __init__(self, address: tuple[str, int], report: Path, given: socket.socket | None = None):
        """``given``: a listening socket systemd passed (socket activation), served instead of binding ``address``."""
        self.report = report
        self._said = ""  # the last render fault logged
        self.load = last_report.Cached(report)
        self.process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.process)  # process_resident_memory_bytes, open fds: serve's own health
        # A report is rendered once, not at each scrape (a big one takes milliseconds a scrape would
        # wait for): what was rendered, and from which report object (Cached gives a new one per change).
        self._rendered: dict[str, tuple[Any, Any, bytes]] = {}
        self._render_lock = threading.Lock()
        super().__init__(address, _Handler, given)

    @staticmethod
    def _standing(loaded: last_report.Loaded) -> bytes:
        """What a scrape renders each time: the standing of ``loaded`` (vouched, age: they
        change with the clock). The report's own families come from ``_once``."""
        live = ReportCollector(lambda: loaded, live=lambda: (last_report.this_boot(), last_report.now(), last_report.booted_at()))
        return metrics_mod.render(StandingCollector(live))

    def _once(self, what: str, report: Any, key: Any, make: Callable[[], bytes]) -> bytes:
        """``make()`` for this report object and ``key``, rendered once and kept until either changes."""
        with self._render_lock:
            held = self._rendered.get(what)
            if held is not None and held[0] is report and held[1] == key:
                return held[2]
        body = make()  # outside the lock: a render never holds up a scrape of the one before
        with self._render_lock:
            self._rendered[what] = (report, key, body)
        return body

    def metrics(self) -> bytes:
        loaded = self.load()  # once: the standing and the report's families are of the same report
        try:
            own = b"" if loaded.report is None else self._once("metrics", loaded.report, None, lambda: metrics_mod.render_report(loaded.report))
            return self._standing(loaded) + own + generate_latest(self.process)
        except Exception as e:  # the model lets nothing through that breaks this; a future writer might
            self._fault(f"cannot render {self.report} as metrics: {e!r}")
            # A report that parsed but cannot be rendered: invalid, never a dropped scrape.
            invalid = last_report.Loaded(last_report.State.INVALID, error="the report cannot be rendered as metrics")
            return self._standing(invalid) + generate_latest(self.process)

    def page(self, loaded: last_report.Loaded) -> tuple[int, bytes]:
        """`/`: the page, with what the report vouches for now (the rule /metrics' preflight_vouched
        applies), or, where a report the model took cannot be drawn, why, as metrics() does."""
        try:
            now = last_report.standing(loaded, last_report.this_boot(), last_report.now(), booted=last_report.booted_at())
            # The page shows the standing only on a pass that no longer vouches (its reason, which may
            # count seconds): that alone is its key, so a FAIL's page is rendered once.
            # trends.json is written just after the report: its identity is in the key too.
            key = (now.reason if loaded.report.verdict.value == "pass" and not now.vouched else None, trends.identity(self.report))
            return 200, self._once("page", loaded.report, key, lambda: page.render(loaded.report, str(self.report), now, *trends.for_page(self.report)).encode())
        except Exception as e:  # a bug in drawing must not cost the scrape or the thread
            self._fault(f"cannot render {self.report} as a page: {e!r}")
            return 500, page.unavailable("invalid", "the report cannot be drawn as a page; /report has it as written").encode()

    def _fault(self, what: str) -> None:
        said = f"preflight serve: {what}\n"
        if said != self._said:  # once per fault, not once per request
            self._said = said
            sys.stderr.write(said)

LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
SD_LISTEN_FDS_START = 3  # sd_listen_fds(3): the first socket systemd passes


def passed_socket() -> socket.socket | None:
    """The listening socket systemd passed this process (preflight-exporter.socket): LISTEN_PID
    names this process and LISTEN_FDS is 1, the socket at descriptor 3; None where none was passed.
    systemd holds the port from early boot, before any user's process, so no other user can take it
    first and answer scrapes in serve's name. The variables are cleared, as sd_listen_fds does: a
    child must not take the descriptor for its own."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    fds = os.environ.get("LISTEN_FDS", "")
    for name in LISTEN_VARS:
        os.environ.pop(name, None)
    if fds != "1":
        raise UsageError(f"serve: systemd passed {fds or 'no'} sockets (LISTEN_FDS); the socket unit must listen on one address: one ListenStream=")
    try:
        given = socket.socket(fileno=SD_LISTEN_FDS_START)
    except OSError as e:
        raise UsageError(f"serve: the socket systemd passed cannot be used ({e.strerror or e})") from None
    if (given.family not in (socket.AF_INET, socket.AF_INET6) or given.type != socket.SOCK_STREAM
            or not given.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)):
        given.detach()
        raise UsageError(f"serve: the socket systemd passed is not a listening TCP socket; the socket unit needs ListenStream=ADDRESS:PORT")
    given.set_inheritable(False)
    return given


def bind(listen: str, report: Path) -> Server:
    """The server on the socket systemd passed, where it passed one (``listen`` is then the
    socket unit's ListenStream=, not this setting), else bound to ``listen``."""
    if (given := passed_socket()) is not None:
        return Server(given.getsockname()[:2], report, given)
    host, port = parse_listen(listen)
    try:
        return Server((host, port), report)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise UsageError(f"{WHERE} {listen}: port {port} is in use (another `preflight serve`? see `ss -ltnp 'sport = :{port}'`); stop it or choose another port") from None
        if e.errno == errno.EACCES:
            raise UsageError(f"{WHERE} {listen}: not allowed to bind port {port} (ports below 1024 need root); choose a port above 1024") from None
        if e.errno == errno.EADDRNOTAVAIL:
            raise UsageError(f"{WHERE} {listen}: {host} is not an address of this node; give one of its addresses, or 127.0.0.1") from None
        raise UsageError(f"{WHERE} {listen}: cannot listen there ({e.strerror or e})") from None
