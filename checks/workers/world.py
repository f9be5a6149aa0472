"""One launch of the ranks for a whole run: each rank imports torch once, then
runs the workers the agent names, one stage after another, in this process.

A worker's start costs what a training job's start costs (a torch import, a
CUDA context, an NCCL init: seconds per rank, more on 8 GPUs), so the run pays
it once. The agent (preflight/gpuwork/world.py) asks for stage K by writing
``stage{K}.json`` into --out ({"script": path, "args": [...], "env": {...}}, or
{"close": true}); every rank loads the script as a module, calls its
``main(argv)`` as ``python script.py ARGS`` would, and then writes
``stage{K}.rank{N}.rc`` with the exit code. A worker that raises ends its
rank (``_rank.guarded``), and with it this launch: the agent starts a new one
for the next check that needs ranks.

The process group, once made by a stage, stays for the next stages
(``_rank.init_group``); a worker's own ``_rank.end_group`` leaves it alone here.
What NCCL and ProcessGroupNCCL read once per process is set here, before any
stage runs: no blocking wait (``_rank.group_env``: every wait in every stage
spins with its own deadline), and NCCL's INFO lines to one file per rank,
``nccl.rank{N}.log`` in --out, which the agent cuts at each stage's end into
that stage's folder (preflight/gpuwork/world.py), so each stage's lines reach
its own check.
A rank whose agent is gone, or that waits past --until, exits: an idle launch
never outlives its run. Standard library (and what the workers import) only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback

import _rank

POLL = 0.002  # seconds between looks for the next stage: the whole of a stage's start-up cost


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where the agent writes stage{K}.json and the ranks write what they did")
    p.add_argument("--agent-pid", type=int, required=True, help="exit once this process is gone")
    p.add_argument("--until", type=float, required=True, help="exit once idle past this time.time()")
    args = p.parse_args()

    me = _rank.whoami()
    _rank.redirect_output(args.out, me.local_rank)  # between stages; each stage sends its output to its own folder
    _rank.group_env()
    _rank.nccl_debug(os.path.join(args.out, f"nccl.rank{me.local_rank}.log"))
    _rank.WORLD.update(active=True, import_seconds=_import_torch())
    # "slow=Ns@import": an import N seconds longer, as on a GPU node (only a spec naming
    # @import fires here: a bare one is for the first stage's worker).
    fault = _rank.Fault(me.local_rank, first_op="(a stage's first op)")
    if fault.at("import") == "slow":
        time.sleep(fault.pauses.get("import", 0.0))
    _say_ready(args.out, me.local_rank)
    modules: dict[str, object] = {}
    k = 1
    while True:
        command = _next(os.path.join(args.out, f"stage{k}.json"), args.agent_pid, args.until)
        if command is None or command.get("close"):
            # No teardown of the process group: a probe's exit is not what is judged, and with
            # a peer already gone NCCL's and gloo's teardown can block.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        _rank.WORLD["stage"] = k
        rc = _run(command, modules)
        _rank.redirect_output(args.out, me.local_rank)
        _write_rc(args.out, k, me.local_rank, rc)
        k += 1


def _import_torch() -> float | None:
    """Seconds the torch import took here, or None where it failed: the first stage's
    own import then fails the same way and says so in its report."""
    t = time.perf_counter()
    try:
        import torch  # noqa: F401
        import torch.distributed  # noqa: F401
    except Exception:  # ImportError, or CUDA libraries that fail to load (OSError)
        return None
    return round(time.perf_counter() - t, 4)


def _say_ready(out: str, rank: int) -> None:
    """``ready.rank{N}.json``: this rank is past its torch import, and which torch it got.
    The agent runs the checks that need no ranks until every rank has said so, and the
    firmware check takes torch.version.cuda from here rather than import torch again."""
    torch = sys.modules.get("torch")
    said = {"import_seconds": _rank.WORLD["import_seconds"]}
    if torch is None or said["import_seconds"] is None:  # torch, or torch.distributed, failed to import
        said["error"] = "torch could not be imported (the first stage's report says why)"
    else:
        version = getattr(torch, "version", None)
        said.update(torch=str(torch.__version__), cuda=getattr(version, "cuda", None))
    tmp = os.path.join(out, f".ready.rank{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(said, f)
    os.replace(tmp, os.path.join(out, f"ready.rank{rank}.json"))


def _next(path: str, agent: int, until: float) -> dict | None:
    """The command at ``path`` once the agent has written it; None when the agent is gone or time is up."""
    checked = 0.0
    while True:
        try:
            with open(path) as f:
                return json.load(f)
        except FileNotFoundError:
            pass
        now = time.time()
        if now > until:
            return None
        if now - checked > 0.5:
            checked = now
            try:
                os.kill(agent, 0)
            except ProcessLookupError:
                return None
            except PermissionError:
                pass  # alive, under another user
        time.sleep(POLL)


def _run(command: dict, modules: dict) -> int:
    """The worker's main(argv), as if run by path; its exit code."""
    os.environ.update(command.get("env") or {})
    script = command["script"]
    try:
        module = modules.get(script)
        if module is None:
            name = "_stage_" + os.path.splitext(os.path.basename(script))[0]
            spec = importlib.util.spec_from_file_location(name, script)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
            modules[script] = module
        rc = int(module.main(list(command.get("args") or [])) or 0)
        _release()
        return rc
    except SystemExit as e:  # argparse, or a worker that exits by hand
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except BaseException:  # noqa: BLE001 - outside the worker's own guard: say what, and end this launch
        print(traceback.format_exc(), flush=True)
        return 1


def _release() -> None:
    """Give back what the stage's buffers held: the next stage sizes its own by the memory free now."""
    import gc

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _write_rc(out: str, k: int, rank: int, rc: int) -> None:
    tmp = os.path.join(out, f".stage{k}.rank{rank}.rc.tmp")
    with open(tmp, "w") as f:
        f.write(str(rc))
    os.replace(tmp, os.path.join(out, f"stage{k}.rank{rank}.rc"))


if __name__ == "__main__":
    sys.exit(main())
