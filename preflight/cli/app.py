"""The `preflight` command as a Typer app: every command, in the order --help lists them.

Exit codes: 0 pass (warnings allowed), 1 a check failed, 2 usage or config
error, 3 preflight itself broke, 128+N stopped by signal N (141: the reader
of stdout went away, as for a command SIGPIPE stops).
Each command is a function of a group module (run, explain, integrations,
multinode) that parses its flags and hands the work to the room that does it.
Heavy modules are imported inside commands so `preflight --help` stays fast;
`status` and `version` start without Typer at all (preflight/cli/main.py).
"""

# No `from __future__ import annotations`: see preflight/cli/common.py.
import sys

import typer

from preflight.cli import explain, history, integrations, multinode, plain, run
from preflight.cli.common import _Command, _exit_codes

# Help is plain text: Rich markup would read "[floors]" or "[default: auto]" in a
# help string as a style tag and drop it, and Rich's help imports rich.markdown
# and pygments, which alone take longer than --help may.
app = typer.Typer(
    name="preflight",
    help="Decide, in seconds, whether this GPU node will run a training job at full speed.",
    rich_markup_mode=None,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@_exit_codes
def version() -> int:
    """Versions of preflight and what it runs on (torch is looked up, not imported)."""
    # The same body preflight/cli/main.py runs for `preflight version` without Typer.
    return plain.version()


app.command(short_help="Run the profile's checks in order and print the verdict.")(run.run)
app.command(short_help="Measure a known-good node and write site floors from it.")(run.calibrate)
app.command(short_help="Does the last report vouch for this node now?")(integrations.status)
app.command(short_help="The node's own past: verdicts and each figure's trend.")(history.history)
app.command(short_help="Serve the last report: / (the page), /metrics, /report, /healthz.")(integrations.serve)
app.command(cls=_Command, short_help="A report as one self-contained HTML page.")(integrations.report)
app.command("slurm-healthcheck", short_help="Slurm: drain or resume this node from its last report.")(integrations.slurm_healthcheck)
app.command("kube-label", short_help="Kubernetes: label (and taint) this node from its report.")(integrations.kube_label)
app.command(short_help="Run nccl and bandwidth on node pairs; name the slow one.")(multinode.pairwise)
app.command("list", short_help="The installed checks, cheapest first.")(explain.list_checks)
app.command("show-profile", cls=_Command, short_help="A profile's checks and floors, with their sources.")(explain.show_profile)
app.command(short_help="The GPUs NVML sees, and the profile `auto` picks.")(explain.detect)
app.command(cls=_Command, short_help="What a saved capture is, and what is wrong in it.")(explain.explain)
app.command(short_help="Explain the NVIDIA Xid/SXid errors in a kernel log.")(explain.xid)
app.command(short_help="GPU/NIC/CPU layout, what is wrong with it, rank pinning.")(explain.topology)
app.command("nccl-log", cls=_Command, short_help="Explain an NCCL log: transports, warnings, known errors.")(explain.nccl_log)
app.command(short_help="GPU acceptance: every GPU path, run for real.")(run.selftest)
app.command(short_help="Versions of preflight and what it runs on.")(version)


def main() -> None:
    argv = sys.argv[1:]
    if any(t.strip() == "" or t.endswith("=") for t in argv) and (name := _empty_value(argv)):
        # A path option reads "" as the current directory (--textfile-dir "" would write preflight.prom there).
        plain.console().error(f"{name}: an empty value; give one, or leave the option out")
        sys.exit(2)
    app()


def _empty_value(argv: list[str]) -> str | None:
    """The first option of the command given an empty value (``--report ""``, ``--report=``)."""
    from typer.main import get_command

    command = get_command(app)
    sub = getattr(command, "commands", {}).get(argv[0]) if argv else None
    valued = {o for p in getattr(sub, "params", []) if not getattr(p, "is_flag", True) for o in getattr(p, "opts", [])}
    for i, token in enumerate(argv[1:], 1):
        name, eq, value = token.partition("=")
        if name in valued and (value.strip() == "" if eq else i + 1 < len(argv) and argv[i + 1].strip() == ""):
            return name
    return None


def _one_line(self, file=None) -> None:  # noqa: ANN001 - Typer's UsageError.show
    """A usage error as every other bad input is told: one line, naming the fix (Typer's own
    prints the usage and a hint above it)."""
    where = f"; see `{self.ctx.command_path} -h`" if getattr(self, "ctx", None) is not None else ""
    plain.console().error(f"{self.format_message().rstrip('.')}{where}")


try:
    from typer._click.exceptions import UsageError as _TyperUsageError

    _TyperUsageError.show = _one_line
except ImportError:  # a Typer laid out otherwise: its own usage lines, exit 2 all the same
    pass
