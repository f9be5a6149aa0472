"""checks/workers/_torchrun.py: torchrun for one node, its store on loopback alone, on a port it
binds itself (the launch through it, attacked for real: tests/gpuwork/test_rendezvous.py)."""

from __future__ import annotations

import socket

from conftest import load_worker

torchrun = load_worker("_torchrun")


def test_an_endpoint_of_port_0_is_bound_here_held_for_the_store_and_said_to_the_agent(tmp_path, monkeypatch):
    # The agent picks no port to release again: where the launch shares the host's network,
    # another user could take a port between its choosing and torchrun's binding it.
    said = tmp_path / "endpoint"
    monkeypatch.setenv(torchrun.ENDPOINT_ENV, str(said))
    monkeypatch.setattr(torchrun, "_bound", [])
    argv = torchrun._bind_free(["--nnodes", "1", "--rdzv-backend", torchrun.BACKEND, "--rdzv-endpoint", "127.0.0.1:0", "w.py"])
    (listener,) = torchrun._bound
    try:
        host, port = listener.getsockname()
        assert host == "127.0.0.1" and port > 0 and said.read_text() == str(port)
        assert argv == ["--nnodes", "1", "--rdzv-backend", torchrun.BACKEND, "--rdzv-endpoint", f"127.0.0.1:{port}", "w.py"]
        with socket.socket() as other:  # it is listening now: nobody else gets it
            other.connect(("127.0.0.1", port))
    finally:
        listener.close()
    # A port the site set is bound by the store itself, as asked.
    assert torchrun._bind_free(["--rdzv-endpoint", "127.0.0.1:29500"]) == ["--rdzv-endpoint", "127.0.0.1:29500"]
