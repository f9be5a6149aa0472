"""CUDA init on every GPU, in a child process: proof that CUDA really works.

``torch.cuda.init()``, then on every device a small random fp32 matmul checked
against a float64 CPU reference, then (with --load-seconds) host-to-device
copies on every GPU so the agent can read the PCIe links under load: idle
links drop to Gen1 to save power, so an idle reading proves nothing.

The report (rank{N}.json in --out) is rewritten at every stage, so after a hang
the agent knows which GPU never answered. In a shared launch each rank probes
only its own GPU (``owned``) and leaves no context on another rank's. Standard library and torch only:
this runs under the training environment's interpreter. By hand:

    python cuda_init.py            # prints the report as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import _rank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for rank0.json (default: print to stdout)")
    parser.add_argument("--size", type=int, default=512, help="matmul size N (N x N)")
    parser.add_argument("--load-seconds", type=float, default=0.0, help="copy to every GPU until --stop appears, this long at most")
    parser.add_argument("--stop", help="end the load early once this file exists (a relative name: in --out, the agent's private directory)")
    args = parser.parse_args(argv)
    if args.stop and args.out and not os.path.isabs(args.stop):
        args.stop = os.path.join(args.out, args.stop)
    rank, ranks = 0, 1  # a process of its own probes every device
    if _rank.WORLD["active"]:
        # A stage of a shared launch: each rank probes only the devices it owns (see owned).
        me = _rank.whoami()
        rank, ranks = me.local_rank, me.local_world_size
        _rank.redirect_output(args.out, rank)

    started = time.monotonic()
    report: dict = {"python": sys.executable, "stage": "import", "error": None, "error_kind": None, "devices": [], "rank": rank, "ranks": ranks}
    report["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    report["cuda_device_order"] = os.environ.get("CUDA_DEVICE_ORDER")
    save = lambda: _write(args.out, rank, report)  # noqa: E731
    save()

    try:
        import torch
    except Exception as e:  # ImportError, or a torch whose CUDA libraries fail to load (OSError)
        report.update(error=f"{type(e).__name__}: {e}", error_kind="no_torch")
        save()
        return 1
    report.update(
        torch_version=torch.__version__,
        cuda_runtime=torch.version.cuda,
        nccl_version=_nccl_version(torch),
        import_seconds=_rank.WORLD["import_seconds"] if _rank.WORLD["active"] and _rank.WORLD["stage"] == 1 else round(time.monotonic() - started, 4),
        stage="init",
    )
    save()
    if torch.version.cuda is None:
        report.update(error=f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)", error_kind="cpu_build")
        save()
        return 1

    t = time.monotonic()
    try:
        torch.cuda.init()  # raises the driver's own words ("CUDA unknown error"), which is_available() hides
        count = torch.cuda.device_count()
    except Exception as e:
        report.update(error=f"{type(e).__name__}: {e}", error_kind="init", init_seconds=time.monotonic() - t)
        save()
        return 1
    report.update(init_seconds=round(time.monotonic() - t, 4), device_count=count, stage="devices")
    # Where each CUDA device sits, before probing any: with CUDA_VISIBLE_DEVICES
    # CUDA's device N need not be NVML's GPU N, and a hang must name the right slot.
    # The UUID too: a torch without pci_bus_id in its device properties has it,
    # and the agent reads the PCIe links under load by NVML's GPU.
    report["pci_bus_ids"] = [_pci_bus_id(torch, i) for i in range(count)]
    report["uuids"] = [_uuid(torch, i) for i in range(count)]
    if count == 0:
        report.update(error="torch.cuda.device_count() is 0", error_kind="no_device")
        save()
        return 1

    mine = report["probed"] = owned(rank, ranks, count)
    save()
    torch.backends.cuda.matmul.allow_tf32 = False  # TF32 would fail an fp32 accuracy bound
    if mine and ranks > 1:
        # Anything torch places implicitly (the pinned host buffer's context) lands on this rank's own GPU.
        torch.cuda.set_device(mine[0])
    for i in mine:
        report["current"] = i
        save()
        report["devices"].append(_probe(torch, i, args.size))
    report["current"] = None
    healthy = all(d["error"] is None and d["error_ratio"] <= 1.0 for d in report["devices"])

    if healthy and mine and args.load_seconds > 0:
        report["load_end"] = _load(torch, mine, args.load_seconds, args.stop, lambda: (report.update(stage="load"), save()))
    report.update(stage="done", seconds=round(time.monotonic() - started, 4))
    save()
    return 0 if healthy else 1


def owned(rank: int, ranks: int, count: int) -> list[int]:
    """The CUDA devices a rank probes: its own (cuda:LOCAL_RANK, the one it uses in every
    later stage) and, where the devices outnumber the ranks, every ``ranks``-th one after.
    A context lives until its process exits, so one made here on another rank's GPU would
    keep that rank off it in EXCLUSIVE_PROCESS mode ("all CUDA-capable devices are busy
    or unavailable"); torch.cuda.init(), device_count() and the device properties make none."""
    return list(range(rank, count, max(1, ranks)))


def _probe(torch, i: int, n: int) -> dict:
    d = {"index": i, "name": None, "pci_bus_id": None, "uuid": None, "seconds": None, "error_ratio": None, "error": None}
    t = time.monotonic()
    try:
        props = torch.cuda.get_device_properties(i)
        d["name"] = props.name
        d["uuid"] = _uuid(torch, i)
        d["pci_bus_id"] = _pci_bus_id(torch, i)
        # Random data from a per-device seed: a GPU that returns stale or
        # zeroed memory cannot match, and every run checks the same numbers.
        g = torch.Generator().manual_seed(20261122 + i)
        a = torch.randn(n, n, generator=g)
        b = torch.randn(n, n, generator=g)
        reference = a.double() @ b.double()
        # The classic bound for an n-term fp32 dot product in any summation
        # order: |error| <= n * u * sum|a_k * b_k|, u = 2^-24; doubled for
        # the final rounding and split-K variants. Within it: ratio <= 1.
        bound = (a.double().abs() @ b.double().abs()) * (2 * n * 2.0**-24)
        got = (a.to(f"cuda:{i}") @ b.to(f"cuda:{i}")).cpu().double()  # .cpu() synchronizes
        d["error_ratio"] = float(((got - reference).abs() / bound).max())
        d["memory_free_bytes"], d["memory_total_bytes"] = torch.cuda.mem_get_info(i)
    except Exception as e:
        d["error"] = f"{type(e).__name__}: {e}"
    d["seconds"] = round(time.monotonic() - t, 4)
    return d


def _load(torch, devices: list[int], seconds: float, stop: str | None, loading) -> str:
    """Keep every GPU's PCIe link busy until ``stop`` appears ("stop") or
    time is up ("time"): a reading taken after "time" saw idle links.
    ``loading()`` announces the load once the first copies have finished,
    so the agent never reads the links before traffic has started."""
    host = torch.empty(64 << 20, dtype=torch.uint8).pin_memory()
    targets = [torch.empty_like(host, device=f"cuda:{i}") for i in devices]
    end = time.monotonic() + seconds
    announced = False
    while time.monotonic() < end:
        if stop and os.path.exists(stop):
            return "stop"
        for t in targets:
            t.copy_(host, non_blocking=True)
        for i in devices:
            torch.cuda.synchronize(i)
        if not announced:
            loading()
            announced = True
    return "time"


def _pci_bus_id(torch, i: int) -> str | None:
    try:
        props = torch.cuda.get_device_properties(i)
    except Exception:  # the probe of this device will say why
        return None
    if not hasattr(props, "pci_bus_id"):  # older torch does not say
        return None
    return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"


def _uuid(torch, i: int) -> str | None:
    try:
        return str(getattr(torch.cuda.get_device_properties(i), "uuid", "")) or None
    except Exception:  # the probe of this device will say why
        return None


def _nccl_version(torch) -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # a CPU build has no NCCL
        return None
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _write(out: str | None, rank: int, report: dict) -> None:
    if out is None:
        if report["stage"] == "done" or report["error"]:
            print(json.dumps(report, indent=2))
        return
    _rank.write_report(out, rank, report)


if __name__ == "__main__":
    _rank.exit_now(main())
