"""`preflight run`, `calibrate` and `selftest`: the commands that run checks."""

# No `from __future__ import annotations`: see preflight/cli/common.py.
import os
import stat
from pathlib import Path
from typing import Annotated, Optional

import typer

from preflight.base.errors import UsageError
from preflight.cli.common import ConfigOpt, FakeOpt, JsonOpt, ProfileOpt, _console, _emit, _exit_codes, _settings


@_exit_codes
def run(
    profile: ProfileOpt = None,
    level: Annotated[Optional[str], typer.Option("--level", metavar="LEVEL", help="How deep to look: quick (no torch, no GPU work: seconds, for prologs and rechecks), standard (the boot gate), full (standard plus the long checks). [default: standard]")] = None,
    # Text, not float: the settings refuse a bad value in one line, as for every other source.
    budget: Annotated[Optional[str], typer.Option("--budget", metavar="SECONDS", help="Run the deepest level expected to take at most this long (from this node's last report, else the profile's estimates); up to --level if given.")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", metavar="CHECK", help="Run only these checks of the level (repeat, or comma-separate).")] = None,
    skip: Annotated[Optional[list[str]], typer.Option("--skip", metavar="CHECK", help="Leave out these checks.")] = None,
    keep_going: Annotated[Optional[bool], typer.Option("--keep-going/--fail-fast", help="Run every check even after a failure. [default: fail-fast]")] = None,
    json_out: JsonOpt = False,
    report: Annotated[Optional[Path], typer.Option("--report", metavar="FILE", help="Write the JSON report here, atomically. [default: the settings' report, else /var/lib/preflight/report.json as root, else $XDG_STATE_HOME/preflight/report.json (~/.local/state/...), where `status`, `report` and `history` read; none with --scratch or across nodes]")] = None,
    textfile_dir: Annotated[Optional[Path], typer.Option("--textfile-dir", metavar="DIR", help="Write preflight.prom here, atomically, for node_exporter's textfile collector.")] = None,
    if_idle: Annotated[bool, typer.Option("--if-idle", help="Do nothing (exit 0, last report kept) while a process holds a GPU: for periodic rechecks.")] = False,
    if_locked: Annotated[Optional[str], typer.Option("--if-locked", metavar="ACTION", help="When another run still holds the lock after --lock-timeout: error (exit 2), or skip (exit 0, nothing written: the last report stands and that run writes its own verdict; for the Slurm prolog). [default: error]")] = None,
    config: ConfigOpt = None,
    lock_file: Annotated[Optional[Path], typer.Option("--lock-file", metavar="FILE", help="Lock that keeps runs apart: a file only you can open, never through a symlink. [default: /run/preflight/preflight.lock; not as root: $XDG_RUNTIME_DIR/preflight.lock, else one under /tmp of your own]")] = None,
    lock_timeout: Annotated[Optional[float], typer.Option("--lock-timeout", metavar="SECONDS", help="Seconds to wait for another run to finish. [default: 60]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only problems and the verdict.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every measurement and cause.")] = False,
    python: Annotated[Optional[Path], typer.Option("--python", metavar="PATH", help="Interpreter for GPU workers: the training environment's, to validate its torch. [default: preflight's own]")] = None,
    nproc_per_node: Annotated[Optional[int], typer.Option("--nproc-per-node", metavar="N", help="Ranks torchrun starts. [default: one per GPU; the profile's [nccl] ranks without GPUs]")] = None,
    rdzv_port: Annotated[Optional[int], typer.Option("--rdzv-port", metavar="PORT", help="torchrun's rendezvous port on 127.0.0.1. [default: 0, a free one]")] = None,
    node_gpus: Annotated[Optional[int], typer.Option("--node-gpus", metavar="N", help="GPUs this node must show (in the config file: gpus under node); fewer is a FAIL. [default: the node's own count]")] = None,
    nnodes: Annotated[Optional[int], typer.Option("--nnodes", metavar="N", help="Nodes in the group: nccl and bandwidth run across all of them. [default: 1]")] = None,
    node_rank: Annotated[Optional[int], typer.Option("--node-rank", metavar="RANK", help="This node's rank in the group, 0 to N-1; rank 0 hosts the rendezvous.")] = None,
    rdzv_endpoint: Annotated[Optional[str], typer.Option("--rdzv-endpoint", metavar="HOST:PORT", help="HOST:PORT of node rank 0, the same on every node (PORT+1 is used too).")] = None,
    rdzv_id: Annotated[Optional[str], typer.Option("--rdzv-id", metavar="ID", help="The group's id, the same on every node. [default: preflight]")] = None,
    rdzv_timeout: Annotated[Optional[float], typer.Option("--rdzv-timeout", metavar="SECONDS", help="Seconds to wait for every node to arrive. [default: 300]")] = None,
    scratch: Annotated[bool, typer.Option("--scratch", help="Not this node's gate (pairwise, a trial): write no report (neither the configured nor the default one) and no textfile.")] = False,
    multi_node: Annotated[bool, typer.Option("--multi-node", help="Take --nnodes, --node-rank and the endpoint from Slurm (srun -N N --ntasks-per-node=1).")] = False,
    nvml_fake: FakeOpt = None,
) -> int:
    """Run the profile's checks of a level in order and print the verdict."""
    from preflight.pipeline import lock
    from preflight.readers.nvidia import nvml_child

    # NVML answers while the rest of preflight is imported; begun only while no other run holds the node,
    # whose load a reading taken now would see, and which the gate then would not know to read again.
    early_lock = lock.named(lock_file)
    early = nvml_child.early(profile, nvml_fake) if lock.held(early_lock) is False else None
    try:
        from preflight.outputs import gate
        from preflight.pipeline import settings as settings_mod

        if if_locked not in (None, "error", "skip"):
            raise UsageError(f"--if-locked {if_locked!r}: say error (exit 2 when another run holds the lock) or skip (exit 0, the last report stands)")
        console = _console(quiet, verbose)
        s = _settings(
            config, profile=profile, level=level, budget=budget, only=only, skip=skip, keep_going=keep_going,
            report=report, textfile_dir=textfile_dir, lock_file=lock_file, lock_timeout=lock_timeout, python=python, nvml_fake=nvml_fake,
            nproc_per_node=nproc_per_node, rdzv_port=rdzv_port, rdzv_timeout=rdzv_timeout, node_gpus=node_gpus,
            **_group_flags(multi_node, nnodes, node_rank, rdzv_endpoint, rdzv_id),
        )
        if said := settings_mod.outputs_of(s, report, textfile_dir, scratch):
            console.note(said)
        for name in settings_mod.unknown_env():
            console.note(f"warning: {name} is not a preflight setting and is ignored")
        _no_other_file_as_lock(s.lock_file)
        if early is not None and s.lock_file != early_lock:
            early.stop()  # the config names another lock, not asked yet: the head start reads NVML after it is
            early = None
    except BaseException:
        if early is not None:
            early.stop()  # bad input: nothing the run began outlives it
        raise
    result = gate.run(s, console, if_idle, if_locked or "error", early)
    if result is None:
        return 0
    console.summary(result)
    if json_out:
        _emit(result.model_dump_json(indent=2) + "\n")
    return result.exit_code


def _no_other_file_as_lock(path: Path) -> None:
    """Refuse a lock file that holds more than a lock ever does (its holder's pid, pipeline/lock.py):
    taking it writes that pid over the file, and a config or report named by mistake would be lost."""
    from preflight.pipeline import lock

    try:
        st = os.lstat(path)
    except OSError:
        return  # none yet (lock.py makes it), or one lock.py refuses in its own words
    if stat.S_ISREG(st.st_mode) and st.st_size > lock.PID_WIDTH + 1:
        raise UsageError(f"lock file {path}: holds {st.st_size} bytes, so it is no lock preflight made, and taking it would "
                         "overwrite them; choose another --lock-file (or remove that file if it is an old lock)")


def _group_flags(multi_node: bool, nnodes: Optional[int], node_rank: Optional[int], endpoint: Optional[str], rdzv_id: Optional[str]) -> dict[str, object]:
    from preflight.gpuwork import multinode

    if not multi_node:
        return {"nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": endpoint, "rdzv_id": rdzv_id}
    given = [flag for flag, v in (("--nnodes", nnodes), ("--node-rank", node_rank), ("--rdzv-endpoint", endpoint)) if v is not None]
    if given:
        raise UsageError(f"--multi-node reads {', '.join(given)} from Slurm's environment; give one or the other")
    g = multinode.from_slurm(os.environ)
    # A secret id the job put in its environment (multinode.sbatch does) wins over the job's number.
    return {"nnodes": g.nnodes, "node_rank": g.node_rank, "rdzv_endpoint": g.endpoint, "rdzv_id": rdzv_id or os.environ.get("PREFLIGHT_RDZV_ID") or g.rdzv_id}


@_exit_codes
def calibrate(
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", help="Site floors file to write: [floors] tables, usable with --config.")],
    fraction: Annotated[float, typer.Option("--fraction", metavar="FRACTION", help="Floors at this fraction of what this node measures; ceilings at measured / fraction.")] = 0.9,
    repeats: Annotated[int, typer.Option("--repeats", metavar="N", help="Runs to measure (2 to 20); floors from the weakest, refused where a figure's runs range wider than 1 / fraction.")] = 3,
    force: Annotated[bool, typer.Option("--force", help="Replace --output if it exists.")] = False,
    profile: ProfileOpt = None,
    config: ConfigOpt = None,
    python: Annotated[Optional[Path], typer.Option("--python", metavar="PATH", help="Interpreter for GPU workers. [default: preflight's own]")] = None,
    nproc_per_node: Annotated[Optional[int], typer.Option("--nproc-per-node", metavar="N", help="Ranks torchrun starts. [default: one per GPU]")] = None,
    nvml_fake: FakeOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only problems and what was written.")] = False,
) -> int:
    """Measure this known-good node --repeats times (checks through bandwidth and train) and write site floors at --fraction of its weakest figures."""
    from preflight.outputs import calibrate as cal

    console = _console(quiet)
    cal.check_fraction(fraction)
    cal.check_repeats(repeats)
    cal.check_output(output, force)
    s = _settings(config, profile=profile, python=python, nproc_per_node=nproc_per_node, nvml_fake=nvml_fake)
    _no_other_file_as_lock(s.lock_file)
    return cal.run(s, output, fraction, repeats, console)


@_exit_codes
def selftest(
    profile: ProfileOpt = None,
    stage: Annotated[Optional[list[str]], typer.Option("--stage", metavar="STAGE", help="Run only these stages (repeat, or comma-separate): cuda, nccl, bandwidth, train, run. The inventory always runs.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", metavar="FILE", help="Write every stage's result and report here as one JSON file (rewritten after each stage).")] = None,
    budget: Annotated[Optional[float], typer.Option("--budget", metavar="SECONDS", help="Seconds for the whole selftest: a stage that would start past it is skipped. [default: each stage's own deadline]")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="A skipped stage fails the selftest: for a node that must have GPUs.")] = False,
) -> int:
    """GPU acceptance: run every GPU path for real (NVML inventory, CUDA init, NCCL, bandwidth, train, the whole run),
    each as its own `preflight` process with a deadline, and print every figure next to its floor with each stage's time.

    Without a GPU the NVML and CUDA stages are skipped with the reason and the rest run on the cpu profile.
    Exit 0 every stage that ran passed, 1 one failed (or, with --strict, was skipped)."""
    from preflight.gpuwork import selftest as kit

    if profile is not None and profile != "auto":
        # Found and read as `run` reads it (the settings' profiles_dir), before six stages each refuse it.
        from preflight.pipeline import profiles, settings as settings_mod

        profiles.load(profiles.find(profile, settings_mod.load({}).profiles_dir))
    return kit.main(stage, profile, out, budget, strict)
