"""Where the last report goes, never running a check: `preflight status`,
`serve`, `report`, `slurm-healthcheck` and `kube-label`."""

# No `from __future__ import annotations`: see preflight/cli/common.py.
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from preflight.cli import plain
from preflight.cli.common import ConfigOpt, JsonOpt, _console, _emit, _exit_codes, _settings

ReportOpt = Annotated[Optional[Path], typer.Option("--report", metavar="FILE", help="The report `preflight run` wrote. [default: the settings' report, else the one `run` writes by default: /var/lib/preflight/report.json as root, else $XDG_STATE_HOME/preflight/report.json (~/.local/state/...)]")]
MaxAgeOpt = Annotated[Optional[float], typer.Option("--max-age", metavar="SECONDS", help="Seconds after which a pass no longer vouches for the node. [default: no limit; a pass before the last reboot never does]")]


@_exit_codes
def status(
    report: ReportOpt = None,
    npd: Annotated[bool, typer.Option("--npd", help="node-problem-detector custom plugin: at most 80 bytes; exit 0 OK, 1 problem, 2 unknown.")] = False,
    max_age: MaxAgeOpt = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> int:
    """Whether the last report vouches for this node now: a pass, in this boot. Never runs a check.

    Exit 0 vouched, 1 not (failed, before the last reboot, too old, or no usable report)."""
    # The same body preflight/cli/main.py runs for `preflight status` without Typer.
    return plain.status(report, npd, max_age, config, json_out)


@_exit_codes
def serve(
    listen: Annotated[Optional[str], typer.Option("--listen", metavar="ADDRESS:PORT", help="Where to listen. Another address than loopback exposes the report to that network. [default: 127.0.0.1:9842]")] = None,
    report: ReportOpt = None,
    config: ConfigOpt = None,
) -> int:
    """Serve the last report: / (the page `preflight report --html` writes), /metrics for Prometheus,
    /report (JSON), /healthz. A request never runs a check."""
    from preflight.base.signals import interrupting
    from preflight.outputs.exporters import serve as server_mod
    from preflight.pipeline.report_paths import node_report_path

    s = _settings(config, listen=listen, report=report)
    path = s.report or node_report_path()  # serve speaks for the node, whoever runs it
    server = server_mod.bind(s.listen, path)
    host, port = server.server_address[:2]
    where = f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    passed = " on the socket systemd passed (its ListenStream=; `listen` applies to a serve started by hand)" if server.passed else ""
    _console().note(f"serving {path} at http://{where}/{passed} (the page; also /metrics, /report, /healthz)")
    # SIGTERM from systemd asks the loop to stop between connections: an exception
    # raised wherever the main thread happens to be could cut a hand-off in half.
    try:
        with interrupting(on_signal=server.stop):
            server.serve_forever()
    finally:
        server.server_close()
    return 0


@_exit_codes
def report(
    path: Annotated[Optional[Path], typer.Argument(metavar="REPORT", help="A report (JSON) `preflight run` wrote. [default: the last report: the settings' report, else the one `run` writes by default: /var/lib/preflight/report.json as root, else $XDG_STATE_HOME/preflight/report.json (~/.local/state/...)]")] = None,
    html: Annotated[Path, typer.Option("--html", metavar="FILE", help="Write the page (HTML) here, atomically; `-` for stdout.")] = ...,  # type: ignore[assignment]
    config: ConfigOpt = None,
) -> int:
    """A report as one self-contained HTML page: the verdict, each problem's cause and fix, where the time
    went, per-GPU figures against their floors, the P2P heatmap, the layout, the train and burn-in traces
    and the group. It loads nothing from anywhere: it opens on an air-gapped node. Never runs a check."""
    from preflight.base.errors import UsageError
    from preflight.outputs.record import last_report
    from preflight.outputs.html import page
    from preflight.base import safefile
    from preflight.pipeline.report_paths import reader_report_path

    source = path or _settings(config).report or reader_report_path()
    out = None if str(html) == "-" else safefile.check(html, f"--html {html}", "report.html")
    loaded = last_report.load(source)
    if loaded.report is None:
        fix = "; if it was cut short, write it again with `preflight run --report PATH`" if loaded.error and loaded.error.startswith("not a preflight report") else ""
        raise UsageError(f"{loaded.error}{fix}")
    from preflight.outputs.record import trends

    text = page.render(loaded.report, str(source), None, *trends.for_page(source))
    if out is None:
        _emit(text)
        return 0
    safefile.write_atomic(out, text)
    _console().note(f"wrote {out} ({len(text.encode()) // 1024} KiB): open it in a browser")
    return 0


@_exit_codes
def slurm_healthcheck(
    report: ReportOpt = None,
    node: Annotated[Optional[str], typer.Option("--node", metavar="NAME", help="This node's Slurm NodeName. [default: $SLURMD_NODENAME, else the short hostname]")] = None,
    max_age: MaxAgeOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the scontrol line it would run (or why nothing); change nothing. Needs no scontrol: without slurmctld it gives the line for each state the node could be in.")] = False,
    drain_cap: Annotated[Optional[float], typer.Option("--drain-cap", metavar="SHARE", help="Drain no node while this share of a partition's nodes (at least one) is already drained by preflight. [default: slurm_drain_cap in the config, else 0.1]")] = None,
    textfile_dir: Annotated[Optional[Path], typer.Option("--textfile-dir", metavar="DIR", help="Also write preflight-slurm.prom here for node_exporter: whether the cap holds a drain back, and the counts.")] = None,
    config: ConfigOpt = None,
) -> int:
    """Slurm HealthCheckProgram: drain this node ("preflight [node] drain: <check> FAIL: ...") unless the last
    report vouches for it and Slurm's Gres names the node's GPUs; resume it only from a drain of its own, once
    the check that drained it passes. Never runs a check.

    Exit 0 vouched, 1 not vouched or Slurm could not be told."""
    from preflight.base.errors import UsageError
    from preflight.base.host import Host
    from preflight.outputs.schedulers import slurm, slurm_cap

    where = "--node" if node else "SLURMD_NODENAME" if os.environ.get("SLURMD_NODENAME") else "this host's short name"
    name = slurm.one_node(node or slurm.node_name(), where)
    if drain_cap is not None and not 0 < drain_cap <= 1:
        raise UsageError(f"--drain-cap {drain_cap:g}: give a share of a partition's nodes above 0 and at most 1, e.g. 0.1 for 10%")
    loaded, st = plain.standing(report, config, max_age, node=True)

    def share() -> float:  # read only where a drain is to be counted: the settings cost pydantic's import
        return drain_cap if drain_cap is not None else _settings(config).slurm_drain_cap

    if dry_run:
        _emit(slurm.preview(Host(), st, name, loaded.report, share))
        return 0 if st.vouched else 1
    if textfile_dir is not None:  # refused before slurmctld is asked anything
        from preflight.base import safefile
        from preflight.outputs.schedulers.slurm_cap import TEXTFILE

        if not textfile_dir.is_dir():
            raise UsageError(f"--textfile-dir {textfile_dir} is not a directory; point it at node_exporter's --collector.textfile.directory")
        safefile.check(textfile_dir / TEXTFILE, f"--textfile-dir {textfile_dir}", TEXTFILE)
    try:
        action = slurm.apply(Host(), st, name, loaded.report, share)
    except slurm.SlurmError as e:
        _console().error(f"{e}; node {name} left as it is")
        return 1
    _emit(action.why + "\n")
    if textfile_dir is not None:
        from preflight.outputs.schedulers.slurm_cap import textfile

        safefile.write_atomic(textfile_dir / TEXTFILE, textfile(name, action.held, list(action.counted)))
    if loaded.report is not None and (action.held is not None or loaded.report.held_back is not None):
        _say_held_back(report, config, loaded.report.started_at, slurm_cap.would_drain(action.held, share()) if action.held else None)
    return 0 if st.vouched else 1


def _say_held_back(report: Optional[Path], config: Optional[Path], judged: datetime, said: Optional[str]) -> None:
    """The report that asked for the drain says the cap held it back (outputs/schedulers/held_back.py), or no longer."""
    from preflight.outputs.schedulers import held_back

    why = held_back.record(plain.report_path(report, config, node=True), judged, said, "slurm-healthcheck", _settings(config).lock_file)
    if why:
        _console().note(f"the report does not say it: {why}")


@_exit_codes
def kube_label(
    node: Annotated[Optional[str], typer.Option("--node", metavar="NAME", help="This node's Kubernetes name. [default: $NODE_NAME, set from the downward API's spec.nodeName]")] = None,
    report: ReportOpt = None,
    max_age: MaxAgeOpt = None,
    taint: Annotated[bool, typer.Option(
        "--taint/--no-taint", help="Also taint a node the report does not vouch for with preflight/failed=true:NoSchedule, and remove it when it passes again.",
    )] = False,
    every: Annotated[Optional[float], typer.Option("--every", metavar="SECONDS", help="Re-read the report and re-apply every SECONDS until SIGTERM. [default: once]")] = None,
    taint_cap: Annotated[float, typer.Option(
        "--taint-cap", metavar="SHARE", help="Add no taint while this share of the cluster's nodes (at least one) already carry preflight's: "
        "a bad floor or driver rollout must not take the cluster out. Needs nodes: list.",
    )] = 0.1,
    textfile_dir: Annotated[Optional[Path], typer.Option(
        "--textfile-dir", metavar="DIR", help="Also write preflight-kube.prom here each round for node_exporter: whether the cap holds a taint back, and the counts.",
    )] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the PATCH it would send and change nothing; with no cluster to read the node from, the most it would send.")] = False,
    config: ConfigOpt = None,
    # `kubectl proxy` or a test server instead of the in-cluster API server: not in --help.
    api_server: Annotated[Optional[str], typer.Option("--api-server", metavar="URL", hidden=True)] = None,
) -> int:
    """Kubernetes: label this node preflight/result=pass|fail (and preflight/action while the report asks for
    one) from the last report, failing it too where the device plugin advertises fewer GPUs than the run
    found; with --taint, also taint it while not vouched (or a lemon: its history asks service),
    unless the fault is the job's or the cap is reached. Only its own labels and taint are touched. Never runs a check.

    Exit 0 vouched, 1 not vouched or the API server could not be told."""
    from preflight.outputs.schedulers import kube

    _kube_node_name(node)

    def judge():  # noqa: ANN202
        return plain.standing(report, config, max_age, node=True)[1]

    return kube.main(node, taint, every, dry_run, api_server, judge, _console(), _emit, taint_cap, textfile_dir)


# A Kubernetes node's name is a DNS subdomain (RFC 1123): what the API server can hold.
_KUBE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _kube_node_name(node: Optional[str]) -> None:
    """Refuse a --node or NODE_NAME no node can have: it would be previewed as a PATCH (exit 0 with
    --dry-run) or sent to the API server, whose 404 reads as a cluster that could not be told."""
    from preflight.base.errors import UsageError

    where, name = ("--node", node) if node else ("NODE_NAME", os.environ.get("NODE_NAME"))
    if name and (len(name) > 253 or not _KUBE_NAME.fullmatch(name)):
        raise UsageError(f"{where} {name[:80]!r}: not a Kubernetes node name; give this node's own, as `kubectl get nodes` "
                         "prints it (lowercase letters, digits, '-' and '.', at most 253)")
