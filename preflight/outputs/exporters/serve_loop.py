"""The connection loop under `preflight serve` (outputs/exporters/serve.py): threads and
memory bounded whatever the clients do.

The main thread accepts connections and reads their requests without blocking; only a
connection whose whole request has arrived goes to one of at most ``WORKERS`` handler
threads, which render the answer and hand it back; the main thread writes it as the client
reads, without blocking (an answer larger than the kernel's send buffer, a big report's
/report or page, never waits in a worker for a client that does not read). So clients that
connect and send nothing, or trickle a byte at a time, or never read the answer, cost a file
descriptor each, never a thread, and cannot hold up a scrape. At most ``MAX_WAITING``
connections wait or are being answered (past that the oldest waiting is dropped, else the
oldest being answered), each for at most ``CLIENT_TIMEOUT`` seconds to send its request; an
answer's client may go ``CLIENT_TIMEOUT`` without taking any of it and has ``ANSWER_SECONDS``
in all, and is reset past either, so the kernel keeps no answer for it; a burst beyond that
queues in the kernel's listen backlog.
"""

from __future__ import annotations

import fcntl
import io
import selectors
import socket
import struct
import termios
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import TCPServer, ThreadingMixIn
from typing import Any

WORKERS = 8
MAX_WAITING = 256
MAX_REQUEST = 16 * 1024  # a scrape's request is a few hundred bytes
CLIENT_TIMEOUT = 5.0
# However steadily a client reads, no answer takes longer: one that reads a byte at a time holds a
# slot (of MAX_WAITING) no longer than this. A scrape of the largest report takes milliseconds.
ANSWER_SECONDS = 60.0
BACKLOG = 128


class LoopHandler(BaseHTTPRequestHandler):
    """A handler that neither reads from nor writes to its client: the loop has read the
    request, and writes what the handler left in ``wfile`` (the head) and ``body``."""

    server: LoopServer

    def setup(self) -> None:
        super().setup()
        # The request was read by the main thread: the handler never waits on the client for it.
        self.rfile.close()
        self.rfile = io.BytesIO(self.server._heads.pop(self.connection, b""))
        # Nor for the answer: it is rendered here and written by the main thread as the client reads
        # (LoopServer._write). A body is kept apart from the head, so a big one shared by every answer
        # (the report as written, the page) is never copied per connection.
        self.wfile.close()
        self.wfile = io.BytesIO()
        self.body = b""

    def finish(self) -> None:
        self.answer = [b for b in (self.wfile.getvalue(), self.body) if b]
        super().finish()


@dataclass
class _Waiting:
    addr: Any
    since: float  # time.monotonic() of the accept: the whole request must arrive within CLIENT_TIMEOUT
    head: bytearray = field(default_factory=bytearray)


@dataclass
class _Writing:
    since: float  # time.monotonic() of the client's last progress: it may go CLIENT_TIMEOUT without reading any
    parts: deque[memoryview]
    began: float = field(default_factory=time.monotonic)  # the hand-back: the whole answer within ANSWER_SECONDS
    sent: bool = False  # every byte is in the kernel: the loop waits for the client to close its end (LoopServer._sent)
    unsent: int = -1  # once sent, what the kernel held unacknowledged at the last look (_unsent)


def _unsent(conn: socket.socket) -> int:
    """Bytes of the answer the client has not yet acknowledged (SIOCOUTQ); 1 where the kernel cannot say."""
    try:
        return struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
    except OSError:
        return 1


class LoopServer(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = BACKLOG
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[LoopHandler], given: socket.socket | None = None):
        """``given``: a listening socket systemd passed (socket activation), served instead of binding ``address``."""
        self.address_family = given.family if given is not None else socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._slots = threading.BoundedSemaphore(WORKERS)
        self._heads: dict[socket.socket, bytes] = {}  # each request as the main thread read it, for its handler
        self._answers: deque[tuple[socket.socket, list[bytes]]] = deque()  # rendered, for the main thread to write
        self._busy = 0  # connections a worker has (rendering), under _busy_lock
        self._busy_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()  # a worker's hand-back wakes the main thread's select
        for s in (self._wake_r, self._wake_w):
            s.setblocking(False)
        self._stopping = threading.Event()
        super().__init__(address, handler, bind_and_activate=given is None)
        self.passed = given is not None  # systemd's socket, not one bound here
        if given is not None:
            self.socket.close()
            self.socket = given
            self.server_address = given.getsockname()
            self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def server_bind(self) -> None:
        # TCPServer's bind: HTTPServer's also looks up this host's FQDN, a DNS wait at boot.
        TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Accept connections, read their requests and write their answers in this thread,
        without blocking; hand a connection to a worker once its whole request is here, and
        take its answer back from it. Runs until stop() (serve's SIGTERM handler calls it),
        within one poll_interval."""
        waiting: dict[socket.socket, _Waiting] = {}
        writing: dict[socket.socket, _Writing] = {}
        with selectors.DefaultSelector() as sel:
            sel.register(self.socket, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            try:
                while not self._stopping.is_set():
                    self._round(sel, waiting, writing, poll_interval)
                sel.unregister(self.socket)
                for conn in list(waiting):
                    self._drop(sel, waiting, conn)
                # Let answers already being rendered or written finish: a scrape cut off by a
                # restart reads as the exporter failing.
                until = time.monotonic() + CLIENT_TIMEOUT
                while (self._busy or self._answers or any(not w.sent or _unsent(c) for c, w in writing.items())) and time.monotonic() < until:
                    self._round(sel, waiting, writing, min(poll_interval, 0.05))
            finally:
                for conn in list(waiting):
                    self._drop(sel, waiting, conn)
                for conn in list(writing):
                    self._drop(sel, writing, conn, reset=True)

    def _round(self, sel: selectors.BaseSelector, waiting: dict[socket.socket, _Waiting],
               writing: dict[socket.socket, _Writing], poll_interval: float) -> None:
        for key, _ in sel.select(poll_interval):
            if key.fileobj is self.socket:
                self._accept(sel, waiting, writing)
            elif key.fileobj is self._wake_r:
                self._take_answers(sel, writing)
            elif key.fileobj in waiting:  # else dropped earlier in this round to make room
                self._read(sel, waiting, key.fileobj)  # type: ignore[arg-type]
            elif key.fileobj in writing:
                conn: socket.socket = key.fileobj  # type: ignore[assignment]
                (self._closing if writing[conn].sent else self._write)(sel, writing, conn)
        now = time.monotonic()
        for c, w in writing.items():
            if w.sent:  # the client's progress once all is in the kernel: what it has acknowledged since
                left = _unsent(c)
                if w.unsent < 0 or left < w.unsent:
                    w.since = now
                w.unsent = left
        stale = now - CLIENT_TIMEOUT
        for held in (waiting, writing):
            for conn in [c for c, w in held.items() if w.since < stale or (held is writing and now - w.began > ANSWER_SECONDS)]:
                self._drop(sel, held, conn, reset=held is writing)

    def stop(self) -> None:
        """Safe from a signal handler: serve_forever notices at its next poll."""
        self._stopping.set()

    def _accept(self, sel: selectors.BaseSelector, waiting: dict[socket.socket, _Waiting], writing: dict[socket.socket, _Writing]) -> None:
        try:
            conn, addr = self.socket.accept()
        except OSError:
            return  # the client gave up before we got to it
        if len(waiting) + len(writing) >= MAX_WAITING:
            # The oldest: dicts keep insertion order. A waiting one first: its answer costs nothing yet.
            held = waiting if waiting else writing
            self._drop(sel, held, next(iter(held)), reset=held is writing)
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ)
        waiting[conn] = _Waiting(addr, time.monotonic())

    def _read(self, sel: selectors.BaseSelector, waiting: dict[socket.socket, _Waiting], conn: socket.socket) -> None:
        w = waiting[conn]
        try:
            chunk = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        w.head += chunk
        if not chunk or len(w.head) > MAX_REQUEST:
            self._drop(sel, waiting, conn)  # closed, reset, or not a scrape
            return
        if b"\r\n\r\n" not in w.head:
            return  # a request trickling in waits here, in no thread, until CLIENT_TIMEOUT
        sel.unregister(conn)
        del waiting[conn]
        conn.setblocking(True)
        self._heads[conn] = bytes(w.head)
        self.process_request(conn, w.addr)

    def _drop(self, sel: selectors.BaseSelector, held: dict[socket.socket, Any], conn: socket.socket, reset: bool = False) -> None:
        """Close ``conn``. ``reset``: an answer the client was given time to read: where some is still
        unacknowledged, the connection is reset, so the kernel frees it now rather than keeping it,
        orphaned and past every cap here, for a client that never reads (any local user can open such)."""
        sel.unregister(conn)
        del held[conn]
        if reset and _unsent(conn):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return
        self.shutdown_request(conn)

    def _take_answers(self, sel: selectors.BaseSelector, writing: dict[socket.socket, _Writing]) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while self._answers:
            conn, parts = self._answers.popleft()
            conn.setblocking(False)
            writing[conn] = _Writing(time.monotonic(), deque(memoryview(p) for p in parts))
            sel.register(conn, selectors.EVENT_WRITE)
            self._write(sel, writing, conn)  # most answers fit the send buffer: written at once

    def _write(self, sel: selectors.BaseSelector, writing: dict[socket.socket, _Writing], conn: socket.socket) -> None:
        w = writing[conn]
        parts = w.parts
        try:
            while parts:
                sent = conn.send(parts[0])
                if sent:
                    w.since = time.monotonic()  # the client reads: a slow but steady reader is never cut off
                if sent < len(parts[0]):
                    parts[0] = parts[0][sent:]
                    return  # the rest when the client has read some
                parts.popleft()
        except BlockingIOError:
            return
        except OSError:
            self._drop(sel, writing, conn)  # the client went away: nothing more to write
            return
        self._sent(sel, writing, conn)

    def _sent(self, sel: selectors.BaseSelector, writing: dict[socket.socket, _Writing], conn: socket.socket) -> None:
        """The whole answer is in the kernel: end this side (a FIN after the data) and wait, reading,
        for the client to close its own. The connection stays counted and timed, so an answer a
        client never takes is reset at CLIENT_TIMEOUT, not left in the kernel (_drop)."""
        try:
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(sel, writing, conn)
            return
        writing[conn].sent = True
        sel.modify(conn, selectors.EVENT_READ)

    def _closing(self, sel: selectors.BaseSelector, writing: dict[socket.socket, _Writing], conn: socket.socket) -> None:
        try:
            if conn.recv(4096):
                return  # anything more the client sends is not read: HTTP/1.0, one request a connection
        except BlockingIOError:
            return
        except OSError:
            pass
        self._drop(sel, writing, conn)  # the client closed its end: it has the answer

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # workers only parse and render: milliseconds
        with self._busy_lock:
            self._busy += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._heads.pop(request, None)
            self._done()
            raise

    def finish_request(self, request: Any, client_address: Any) -> None:
        handler = self.RequestHandlerClass(request, client_address, self)
        answer = getattr(handler, "answer", None)
        if not answer:
            self.shutdown_request(request)
            return
        self._answers.append((request, answer))
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # a wake-up is already pending: the main thread takes every answer queued
        except OSError:  # closed: serve stopped without waiting for this answer
            try:
                self._answers.remove((request, answer))
            except ValueError:
                return  # taken by the main thread after all
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
            self.shutdown_request(request)
        finally:
            self._heads.pop(request, None)
            self._done()

    def _done(self) -> None:
        with self._busy_lock:
            self._busy -= 1
        self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()
