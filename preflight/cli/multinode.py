"""`preflight pairwise`: the multi-node checks on node pairs, to name the slow or broken node."""

# No `from __future__ import annotations`: see preflight/cli/common.py.
from pathlib import Path
from typing import Annotated, Optional

import typer

from preflight.cli.common import JsonOpt, ProfileOpt, _console, _exit_codes


@_exit_codes
def pairwise(
    hosts: Annotated[Optional[Path], typer.Option("--hosts", metavar="FILE", help="One `NAME [ADDRESS]` per line. [default: the Slurm allocation's nodes]")] = None,
    exec_template: Annotated[Optional[str], typer.Option("--exec", metavar="TEMPLATE", help="How to start a command on {host}. [default: ssh -o BatchMode=yes {host}; under Slurm, srun on that node]")] = None,
    preflight_cmd: Annotated[str, typer.Option("--preflight", metavar="COMMAND", help="The preflight command on the hosts ({host} is replaced).")] = "preflight",
    profile: ProfileOpt = None,
    port: Annotated[int, typer.Option("--port", metavar="PORT", help="Rendezvous port on each pair's first host (PORT+1 too).")] = 29500,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS", help="Seconds a round may take before its runs are killed.")] = 300.0,
    tolerance: Annotated[float, typer.Option("--tolerance", metavar="FRACTION", help="A pair under this fraction of the median busbw is slow.")] = 0.5,
    json_out: JsonOpt = False,
) -> int:
    """Run nccl and bandwidth on pairs of nodes, in rounds, and name the slow or broken node."""
    from preflight.gpuwork import pairwise as pw

    return pw.main(hosts, exec_template, preflight_cmd, profile or "auto", port, timeout, tolerance, json_out, _console())  # its own signal handling
