"""torchrun for a launch on one node, its rendezvous store listening on loopback alone.

    python _torchrun.py --nnodes 1 --nproc-per-node N --rdzv-backend preflight-loopback \
        --rdzv-endpoint 127.0.0.1:PORT ... WORKER.py ARGS...

torchrun's static rendezvous makes its TCPStore with a host name, and the store
listens on every interface whatever that name is: where the launch cannot have a
network of its own (a container without CAP_SYS_ADMIN: the Kubernetes examples drop
every capability), any host that reaches the node's or the pod's address could write
the keys the ranks read and fail a healthy node. The store has no password. This
backend is the static one with its store given a socket bound to 127.0.0.1 (TCPStore's
``master_listen_fd``). Inside the launch's own network namespace it changes nothing.

Standard library and torch only: it runs under the training environment's interpreter.
"""

from __future__ import annotations

import os
import socket
import sys

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous, create_rdzv_handler

BACKEND = "preflight-loopback"
ENDPOINT_ENV = "PREFLIGHT_ENDPOINT_FILE"  # preflight/gpuwork/launch.py's: where the port bound is written
_bound: list[socket.socket] = []  # the listener main() bound for an endpoint of port 0


class LoopbackRendezvous(StaticTCPRendezvous):
    """The static rendezvous of one node, its store on a socket of its own on 127.0.0.1."""

    def get_backend(self) -> str:
        return BACKEND  # torch checks the handler's name against the one asked for

    def next_rendezvous(self):
        if self._store is None:
            listener = _bound[0] if _bound and _bound[0].getsockname()[1] == self.master_port else _listen(self.master_port)
            self._listener = listener  # the store serves on its descriptor: it must stay open
            try:
                self._store = TCPStore("127.0.0.1", self.master_port, self.world_size, True, self.timeout,
                                       multi_tenant=True, master_listen_fd=listener.fileno())
            except RuntimeError:
                # A torch whose libuv server takes no given descriptor: its older server does.
                self._store = TCPStore("127.0.0.1", self.master_port, self.world_size, True, self.timeout,
                                       multi_tenant=True, master_listen_fd=listener.fileno(), use_libuv=False)
        mine = self._store
        info = super().next_rendezvous()
        if self._store is not mine:  # a torch that no longer keeps its store in _store made one on every interface
            raise RuntimeError("torch's static rendezvous made its own store: the loopback-only store was not used")
        return info


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # As the store would bind it itself: a TIME_WAIT left by a killed run is no obstacle.
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(socket.SOMAXCONN)
    return listener


def _bind_free(argv: list[str]) -> list[str]:
    """``argv`` with an --rdzv-endpoint of port 0 made the port bound here now, held for the store
    and written where the agent reads it: no port lies free between its choosing and its binding."""
    if "--rdzv-endpoint" not in argv or not argv[argv.index("--rdzv-endpoint") + 1].endswith(":0"):
        return argv
    at = argv.index("--rdzv-endpoint") + 1
    _bound.append(_listen(0))
    port = _bound[0].getsockname()[1]
    if where := os.environ.get(ENDPOINT_ENV):
        with open(where + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(where + ".tmp", where)
    return [*argv[:at], f"127.0.0.1:{port}", *argv[at + 1:]]


def _create(params):
    if params.max_nodes != 1:
        raise ValueError(f"{BACKEND} is for one node, not {params.max_nodes}")
    params.config.setdefault("rank", 0)  # torchrun gives the rank to the static backend alone
    static = create_rdzv_handler(params)
    if static.master_addr != "127.0.0.1":
        raise ValueError(f"{BACKEND} listens on 127.0.0.1, not {static.master_addr}")
    return LoopbackRendezvous(static.master_addr, static.master_port, 0, 1, static.run_id, int(static.timeout.total_seconds()))


def main() -> None:
    from torch.distributed.run import main as torchrun

    rendezvous_handler_registry.register(BACKEND, _create)
    torchrun(_bind_free(sys.argv[1:]))


if __name__ == "__main__":
    main()
