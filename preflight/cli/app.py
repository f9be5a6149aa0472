"""The `preflight` command: parses flags and wires the modules together.

Exit codes: 0 pass (warnings allowed), 1 a check failed, 2 usage or config
error, 3 preflight itself broke, 128+N stopped by signal N (141: the reader
of stdout went away, as for a command SIGPIPE stops).
Heavy modules are imported inside commands so `preflight --help` stays fast;
`status` and `version` start without Typer at all (preflight/cli/main.py).
"""

# No `from __future__ import annotations`: Typer would then evaluate every
# command's annotations from strings at each start, a sixth of --help's time.
import functools
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from preflight.cli import main as quick
from preflight.base.errors import UsageError

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


class _Command(typer.core.TyperCommand):
    """Lists an argument by its metavar alone: typer adds the Python type ("FILE <path>")."""

    def format_options(self, ctx, formatter) -> None:  # noqa: ANN001
        sections: dict[str, list[tuple[str, str]]] = {"argument": [], "option": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and param.param_type_name in sections:
                name = param.metavar if param.param_type_name == "argument" and param.metavar else record[0]
                sections[param.param_type_name].append((name, record[1]))
        for title, kind in (("Arguments", "argument"), ("Options", "option")):
            if sections[kind]:
                with formatter.section(title):
                    formatter.write_dl(sections[kind])

    def collect_usage_pieces(self, ctx) -> list[str]:  # noqa: ANN001
        # typer writes a required argument as "{FILE}"; a usage line says FILE
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in super().collect_usage_pieces(ctx)]


def _profile_names() -> str:
    """The installed profiles, for --help. A profile's name is its file's name,
    so a directory listing says it: no profile is parsed for a --help."""
    names = set()
    for folder in (Path(__file__).parent.parent / "pipeline" / "profiles", os.environ.get("PREFLIGHT_PROFILES_DIR") or "/etc/preflight/profiles"):
        try:
            names.update(e.name[: -len(".toml")] for e in os.scandir(folder) if e.name.endswith(".toml"))
        except OSError:  # no site profiles: the built-in ones are still listed
            pass
    return ", ".join(sorted(names))


PROFILE_HELP = f"auto (pick by GPU model), or one of: {_profile_names()}."
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", "-p", metavar="NAME", help=f"Profile: {PROFILE_HELP} [default: auto]")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", metavar="FILE", help="Config TOML. [default: $PREFLIGHT_CONFIG, else /etc/preflight/config.toml if present]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]
# Facts from a JSON file instead of NVML: for tests and demos, so not in --help.
FakeOpt = Annotated[Optional[Path], typer.Option("--nvml-fake", metavar="FILE", hidden=True)]


def _console(quiet: bool = False, verbose: bool = False):  # noqa: ANN202
    from preflight.outputs.console import Console

    return Console(quiet=quiet, verbose=verbose)


def _settings(config: Optional[Path], **flags: object):  # noqa: ANN202
    from preflight.pipeline import settings

    return settings.load(flags, config=config)


def _exit_codes(command: Callable[..., int]) -> Callable[..., None]:
    """Turn what a command returns or raises into preflight's exit codes."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        raise typer.Exit(quick.guarded(command, *args, **kwargs))

    return wrapper


class _Signals:
    """SIGTERM/SIGINT/SIGHUP raise Interrupted in the main thread, so the runner
    can kill what the running check started and still write the report; or,
    given ``on_signal``, call it instead, for a loop that stops at a point of its choosing."""

    def __init__(self, on_signal: Optional[Callable[[], None]] = None):
        self.on_signal = on_signal

    def __enter__(self) -> None:
        from preflight.base.errors import Interrupted

        def handler(signum: int, _frame: object) -> None:
            if self.on_signal is None:
                raise Interrupted(signum)
            self.on_signal()

        self.saved = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

    def __exit__(self, *_: object) -> None:
        for s, h in self.saved.items():
            signal.signal(s, h)


@app.command(short_help="Run the profile's checks in order and print the verdict.")
@_exit_codes
def run(
    profile: ProfileOpt = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", metavar="CHECK", help="Run only these checks (repeat, or comma-separate).")] = None,
    skip: Annotated[Optional[list[str]], typer.Option("--skip", metavar="CHECK", help="Leave out these checks.")] = None,
    keep_going: Annotated[Optional[bool], typer.Option("--keep-going/--fail-fast", help="Run every check even after a failure. [default: fail-fast]")] = None,
    json_out: JsonOpt = False,
    report: Annotated[Optional[Path], typer.Option("--report", metavar="FILE", help="Write the JSON report here, atomically.")] = None,
    textfile_dir: Annotated[Optional[Path], typer.Option("--textfile-dir", metavar="DIR", help="Write preflight.prom here, atomically, for node_exporter's textfile collector.")] = None,
    if_idle: Annotated[bool, typer.Option("--if-idle", help="Do nothing (exit 0, last report kept) while a process holds a GPU: for periodic rechecks.")] = False,
    config: ConfigOpt = None,
    lock_file: Annotated[Optional[Path], typer.Option("--lock-file", metavar="FILE", help="Lock that keeps runs apart. [default: /run/lock/preflight.lock]")] = None,
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
    scratch: Annotated[bool, typer.Option("--scratch", help="Not this node's gate (pairwise, a trial): write neither the configured report nor textfile.")] = False,
    multi_node: Annotated[bool, typer.Option("--multi-node", help="Take --nnodes, --node-rank and the endpoint from Slurm (srun -N N --ntasks-per-node=1).")] = False,
    nvml_fake: FakeOpt = None,
) -> int:
    """Run the profile's checks in order and print the verdict."""
    from preflight.outputs import metrics
    from preflight.pipeline import plan as pipeline, report as reports, settings as settings_mod
    from preflight.pipeline.lock import run_lock

    console = _console(quiet, verbose)
    s = _settings(
        config, profile=profile, only=only, skip=skip, keep_going=keep_going,
        report=report, textfile_dir=textfile_dir, lock_file=lock_file, lock_timeout=lock_timeout, python=python, nvml_fake=nvml_fake,
        nproc_per_node=nproc_per_node, rdzv_port=rdzv_port, rdzv_timeout=rdzv_timeout, node_gpus=node_gpus,
        **_group_flags(multi_node, nnodes, node_rank, rdzv_endpoint, rdzv_id),
    )
    if said := settings_mod.outputs_of(s, report, textfile_dir, scratch):
        console.note(said)
    for name in settings_mod.unknown_env():
        console.note(f"warning: {name} is not a preflight setting and is ignored")
    report_path = reports.check_writable(s.report) if s.report is not None else None
    textfile = metrics.check_textfile_dir(s.textfile_dir) if s.textfile_dir is not None else None
    with _Signals():
        the_plan = pipeline.plan(s)  # may ask NVML (bounded), so it runs under the handlers too
        if if_idle and (held := pipeline.gpus_busy(s)):
            console.note(f"not run: {held}; the last report stands")
            return 0
        with run_lock(s.lock_file, s.lock_timeout, lambda who: console.note(f"waiting for {who} to release {s.lock_file}")):
            result = pipeline.execute(the_plan, s, console)
            before = reports.read_previous(report_path)
            kept = reports.carry_forward(result, before, the_plan.profile.checks if the_plan.profile else [], across_nodes=the_plan.group is not None)
            if kept:
                when = kept[0].details["carried_from"]
                console.note(f"kept from the run of {when} (this boot): " + ", ".join(f"{c.check} {c.status}" for c in kept))
            result.last_success_at = reports.last_success(result, before) or (metrics.previous_success(textfile) if textfile else None)
            # The textfile first: if it cannot be written the run is an ERROR, and the
            # report then says so too, so the gate and every reader of the report agree.
            for what, path, write in (
                ("the metrics", textfile, lambda d: metrics.write_textfile(d, result)),
                ("the report", report_path, lambda p: reports.write_atomic(p, result.model_dump_json(indent=2) + "\n")),
            ):
                if path is None:
                    continue
                try:
                    write(path)
                except OSError as e:
                    # The verdict still stands and is printed; a failed gate stays failed, a pass exits 3.
                    console.error(f"could not write {what} to {path}: {e.strerror or e}; the previous file is unchanged")
                    result.exit_code = result.exit_code or reports.EXIT_CODES[reports.Verdict.ERROR]
                    if path is textfile and result.verdict == reports.Verdict.PASS:
                        result.verdict = reports.Verdict.ERROR  # the report written next must not vouch for a run that exits 3
    console.summary(result)
    if json_out:
        _emit(result.model_dump_json(indent=2) + "\n")
    return result.exit_code


def _group_flags(multi_node: bool, nnodes: Optional[int], node_rank: Optional[int], endpoint: Optional[str], rdzv_id: Optional[str]) -> dict[str, object]:
    from preflight.gpuwork import multinode

    if not multi_node:
        return {"nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": endpoint, "rdzv_id": rdzv_id}
    given = [flag for flag, v in (("--nnodes", nnodes), ("--node-rank", node_rank), ("--rdzv-endpoint", endpoint)) if v is not None]
    if given:
        raise UsageError(f"--multi-node reads {', '.join(given)} from Slurm's environment; give one or the other")
    g = multinode.from_slurm(os.environ)
    return {"nnodes": g.nnodes, "node_rank": g.node_rank, "rdzv_endpoint": g.endpoint, "rdzv_id": rdzv_id or g.rdzv_id}


_emit = quick.emit  # data on stdout; a reader that went away (| head) must not change the exit code


@app.command(short_help="Measure a known-good node and write site floors from it.")
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
) -> int:
    """Measure this known-good node --repeats times (checks through bandwidth and train) and write site floors at --fraction of its weakest figures."""
    import dataclasses
    from datetime import datetime, timezone

    from preflight.outputs import calibrate as cal
    from preflight.pipeline import plan as pipeline, registry
    from preflight.pipeline.lock import run_lock
    from preflight.pipeline.report import write_atomic

    console = _console()
    cal.check_fraction(fraction)
    cal.check_repeats(repeats)
    cal.check_output(output, force)
    s = _settings(config, profile=profile, python=python, nproc_per_node=nproc_per_node, nvml_fake=nvml_fake)
    runs = []
    with _Signals():
        resolved = pipeline.resolve_profile(s)
        s.keep_going = False
        s.only = cal.checks_up_to(resolved.checks, resolved.name)
        first = pipeline.plan(s)
        # The checks before the measuring ones vouch for the node once; the figures need every run.
        s.only = [c for c in s.only if c in cal.CHECKS]
        again = pipeline.plan(s)
        # One lock over every run: a recheck timer's run in between would disturb the figures.
        with run_lock(s.lock_file, s.lock_timeout, lambda who: console.note(f"waiting for {who} to release {s.lock_file}")):
            for i in range(repeats):
                console.note(f"calibrate: run {i + 1} of {repeats}")
                the_plan = first if i == 0 else dataclasses.replace(again, started_at=datetime.now(timezone.utc))
                result = pipeline.execute(the_plan, s, console)
                if result.interrupted_by_signal:
                    console.error(f"no floors written: stopped by signal {result.interrupted_by_signal} in run {i + 1} of {repeats}")
                    return result.exit_code
                try:
                    runs.append(cal.vouch(result))
                except cal.Refused as e:
                    console.error(f"no floors written: run {i + 1} of {repeats}: {e}")
                    return 1
    bounds = {name: ub for r in runs[0] for name, ub in registry.load(r.check).floor_units.items()}
    try:
        found = cal.floors(runs, fraction, bounds)
    except cal.Refused as e:
        console.error(f"no floors written: {e}")
        return 1
    whole_node = tuple(name for r in runs[0] for name in registry.load(r.check).whole_node)
    write_atomic(output, cal.render(found, fraction, result.hostname, resolved.name, result.finished_at, result.shape, whole_node))
    console.note(f"wrote {len(found)} floors to {output} ({fraction:g} x this node's weakest figures over {repeats} runs); use it with --config {output}")
    return 0


ReportOpt = Annotated[Optional[Path], typer.Option("--report", metavar="FILE", help="The report `preflight run --report` wrote. [default: /var/lib/preflight/report.json]")]
MaxAgeOpt = Annotated[Optional[float], typer.Option("--max-age", metavar="SECONDS", help="Seconds after which a pass no longer vouches for the node. [default: no limit; a pass before the last reboot never does]")]


_standing = quick.standing  # the last report and what it says about this node now (never runs a check)


@app.command(short_help="Does the last report vouch for this node now?")
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
    # The same body `preflight status` runs without Typer (preflight/cli/main.py).
    return quick.status(report, npd, max_age, config, json_out)


@app.command(short_help="Serve the last report: /metrics, /report, /healthz.")
@_exit_codes
def serve(
    listen: Annotated[Optional[str], typer.Option("--listen", metavar="ADDRESS:PORT", help="Where to listen. Another address than loopback exposes the report to that network. [default: 127.0.0.1:9842]")] = None,
    report: ReportOpt = None,
    config: ConfigOpt = None,
) -> int:
    """Serve the last report: /metrics for Prometheus, /report (JSON), /healthz. A scrape never runs a check."""
    from preflight.outputs import serve as server_mod
    from preflight.pipeline.report import DEFAULT_REPORT_PATH

    s = _settings(config, listen=listen, report=report)
    path = s.report or DEFAULT_REPORT_PATH
    server = server_mod.bind(s.listen, path)
    _console().note(f"serving {path} at http://{s.listen}/metrics (also /report, /healthz)")
    # SIGTERM from systemd asks the loop to stop between connections: an exception
    # raised wherever the main thread happens to be could cut a hand-off in half.
    try:
        with _Signals(on_signal=server.stop):
            server.serve_forever()
    finally:
        server.server_close()
    return 0


@app.command("slurm-healthcheck", short_help="Slurm: drain or resume this node from its last report.")
@_exit_codes
def slurm_healthcheck(
    report: ReportOpt = None,
    node: Annotated[Optional[str], typer.Option("--node", metavar="NAME", help="This node's Slurm NodeName. [default: $SLURMD_NODENAME, else the short hostname]")] = None,
    max_age: MaxAgeOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the scontrol line it would run (or why nothing); change nothing. Needs no scontrol: without slurmctld it gives the line for each state the node could be in.")] = False,
    config: ConfigOpt = None,
) -> int:
    """Slurm HealthCheckProgram: drain this node ("preflight: ...") unless the last report vouches for it;
    resume it only from a drain of its own. Never runs a check.

    Exit 0 vouched, 1 not vouched or Slurm could not be told."""
    from preflight.outputs import slurm
    from preflight.base.host import Host

    _, st = _standing(report, config, max_age)
    name = node or slurm.node_name()
    if dry_run:
        _emit(slurm.preview(Host(), st, name))
        return 0 if st.vouched else 1
    try:
        action = slurm.apply(Host(), st, name)
    except slurm.SlurmError as e:
        _console().error(f"{e}; node {name} left as it is")
        return 1
    _emit(action.why + "\n")
    return 0 if st.vouched else 1


@app.command("kube-label", short_help="Kubernetes: label (and taint) this node from its report.")
@_exit_codes
def kube_label(
    node: Annotated[Optional[str], typer.Option("--node", metavar="NAME", help="This node's Kubernetes name. [default: $NODE_NAME, set from the downward API's spec.nodeName]")] = None,
    report: ReportOpt = None,
    max_age: MaxAgeOpt = None,
    taint: Annotated[bool, typer.Option(
        "--taint/--no-taint", help="Also taint a node the report does not vouch for with preflight/failed=true:NoSchedule, and remove it when it passes again.",
    )] = False,
    every: Annotated[Optional[float], typer.Option("--every", metavar="SECONDS", help="Re-read the report and re-apply every SECONDS until SIGTERM. [default: once]")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the PATCH it would send and change nothing; with no cluster to read the node from, the most it would send.")] = False,
    config: ConfigOpt = None,
    # `kubectl proxy` or a test server instead of the in-cluster API server: not in --help.
    api_server: Annotated[Optional[str], typer.Option("--api-server", metavar="URL", hidden=True)] = None,
) -> int:
    """Kubernetes: label this node preflight/result=pass|fail from the last report; with --taint, also taint
    it while not vouched. Only its own label and taint are touched. Never runs a check.

    Exit 0 vouched, 1 not vouched or the API server could not be told."""
    from preflight.outputs import kube
    from preflight.base.errors import Interrupted

    console = _console()
    name = node or os.environ.get("NODE_NAME")
    if not name and dry_run:
        name = os.uname().nodename.strip().lower()  # what the kubelet names its node unless told otherwise
        console.note(f"no --node or NODE_NAME: the node name is taken from the hostname, {name}")
    if not name:
        raise UsageError("no node name: set NODE_NAME from the downward API (env valueFrom.fieldRef.fieldPath: spec.nodeName) or pass --node NAME")
    if every is not None and not every > 0:
        raise UsageError(f"--every {every:g}: give a number of seconds above 0, e.g. 60")
    if api_server is not None and not api_server.startswith(("http://", "https://")):
        raise UsageError(f"--api-server {api_server}: give a URL, e.g. http://127.0.0.1:8001 for `kubectl proxy`")
    no_api = ""
    if api_server:
        api: kube.Api | None = kube.Api(api_server)
    elif dry_run and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        api, no_api = None, "not in a pod, KUBERNETES_SERVICE_HOST is not set"  # a preview needs no cluster
    else:
        api = kube.Api.in_cluster()
    _, st = _standing(report, config, max_age)  # a bad --max-age or config: exit 2 before any round

    def say(r: kube.Round) -> None:
        if r.error:
            console.error(r.line)
        else:
            _emit(r.line + "\n")

    if every is None:
        r = kube.run_round(api, lambda: st, name, taint, dry_run, no_api)
        say(r)
        return 0 if r.vouched else 1
    try:
        with _Signals():
            kube.keep_applying(lambda: kube.run_round(api, lambda: _standing(report, config, max_age)[1], name, taint, dry_run, no_api), every, say)
    except Interrupted:
        pass  # SIGTERM from the kubelet: a clean stop
    return 0


@app.command(short_help="Run nccl and bandwidth on node pairs; name the slow one.")
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


@app.command("list", short_help="The installed checks, cheapest first.")
@_exit_codes
def list_checks(profile: ProfileOpt = None, config: ConfigOpt = None, json_out: JsonOpt = False) -> int:
    """The installed checks, cheapest first, with what each verifies."""
    from preflight.pipeline import plan as pipeline, registry

    settings = _settings(config, profile=profile)  # a bad config is refused here too
    checks = [registry.load(name) for name in registry.names()]
    checks.sort(key=lambda c: (c.order, c.name))
    if profile is not None:
        resolved = pipeline.resolve_profile(settings)
        by_name = {c.name: c for c in checks}
        checks = [by_name[name] for name in resolved.checks if name in by_name]
    rows = [
        {"name": c.name, "description": c.description, "requires": list(c.requires), "timeout_seconds": c.timeout_seconds}
        for c in checks
    ]
    if json_out:
        print(json.dumps(rows, indent=2))
        return 0
    width = max((len(r["name"]) for r in rows), default=0)
    for r in rows:
        needs = f" (after {', '.join(r['requires'])})" if r["requires"] else ""
        print(f"{r['name']:<{width}}  {r['description']}{needs}")
    return 0


@app.command("show-profile", cls=_Command, short_help="A profile's checks and floors, with their sources.")
@_exit_codes
def show_profile(
    name: Annotated[Optional[str], typer.Argument(metavar="NAME", help=f"Profile: {PROFILE_HELP} [default: the configured one, else auto]")] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
) -> int:
    """The resolved profile: checks, expected GPUs, and every floor with where its value came from."""
    from preflight.pipeline import plan as pipeline, profiles
    from preflight.outputs import profile_text

    s = _settings(config, profile=name)
    try:
        p = pipeline.resolve_profile(s)
    except profiles.NvmlUnreadable as e:
        if name is not None:  # `show-profile auto` asked for detection: its failure is the answer
            raise
        # Nothing asked for detection: the person wants to read a profile, and this names them.
        known = ", ".join(sorted(profiles.available(s.profiles_dir)))
        raise UsageError(f"no profile named, and `auto` has no GPU to pick by here ({e.cause}); "
                         f"name one: preflight show-profile NAME, with NAME one of {known}") from None
    if json_out:
        print(p.model_dump_json(indent=2))
        return 0
    print(profile_text.describe(p), end="")
    return 0


@app.command(short_help="The GPUs NVML sees, and the profile `auto` picks.")
@_exit_codes
def detect(config: ConfigOpt = None, json_out: JsonOpt = False, nvml_fake: FakeOpt = None) -> int:
    """What NVML sees on this node, its shape (how many GPUs, how joined, which NICs), and which profile `auto` picks, and why.

    With --json the answer is always a JSON document, with `error` (and, where known, `cause` and `fix`)
    set when it exits non-zero. Exit 1 when there is no driver or `auto` picks no profile, 2 on bad input."""
    from preflight.readers import nvml
    from preflight.pipeline import plan as pipeline, profiles, shape
    from preflight.base.host import Host

    def failed(error: str, cause: Optional[str] = None, fix: Optional[str] = None) -> None:
        # A reader of --json gets the same keys as on success, empty, and why they are empty.
        if json_out:
            _emit(json.dumps({"driver_version": None, "cuda_driver_version": None, "gpus": [], "lost": [],
                              "source": f"fake {nvml_fake}" if nvml_fake else "NVML", "profile": None, "why": error,
                              "shape": None, "error": error, "cause": cause, "fix": fix}, indent=2) + "\n")

    try:
        s = _settings(config, nvml_fake=nvml_fake)
        pipeline.check_inputs(s)
        inventory = nvml.inventory(s.nvml_fake)
        try:
            (name, why), no_pick = profiles.choose(inventory, s.profiles_dir), None
        except profiles.DetectionFailed as e:
            name, why, no_pick = None, f"{e.cause}; {e.remedy}", e
        node = shape.gather(Host(), inventory, s.node_gpus)
    except UsageError as e:
        failed(str(e))
        raise
    except nvml.NvmlUnavailable as e:
        failed(f"{e.cause}; {e.remedy}", e.cause, e.remedy)
        raise profiles.DetectionFailed(e.cause, e.remedy) from None
    if json_out:
        error = {"error": why, "cause": no_pick.cause, "fix": no_pick.remedy} if no_pick else {"error": None, "cause": None, "fix": None}
        _emit(json.dumps({**inventory.model_dump(mode="json"), "profile": name, "why": why, "shape": node.model_dump(mode="json"), **error}, indent=2) + "\n")
    else:
        print(f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version} (from {inventory.source})")
        for g in inventory.gpus:
            memory = f"{g.memory_total_bytes / 2**30:.0f} GiB" if g.memory_total_bytes else "memory n/a"
            print(f"  GPU {g.index}  {g.name}  {nvml.short_pci(g.pci_bus_id)}  device {g.pci_device_id or '?'}  {memory}")
        for lost in inventory.lost:
            print(f"  GPU {lost.index}  LOST  {lost.pci_bus_id or 'PCI address unknown'}  {lost.error}")
        print(f"node: {node.describe()}")
        print("\n".join(f"  {line}" for line in node.lines()))
        print(f"profile: {name or 'none'} ({why})")
    return 0 if name else 1


@app.command(short_help="Explain the NVIDIA Xid/SXid errors in a kernel log.")
@_exit_codes
def xid(
    from_file: Annotated[Optional[Path], typer.Option("--from", metavar="FILE", help="A saved kernel log (dmesg, journalctl, syslog, /dev/kmsg records) instead of this machine's.")] = None,
    json_out: JsonOpt = False,
) -> int:
    """Explain the NVIDIA Xid/SXid errors in this machine's kernel log since boot, or in a saved log.

    Exit 1 when a fatal event is listed, so scripts can act on it; 2 when --from FILE holds no kernel log lines."""
    from preflight.readers import xid as xids
    from preflight.base.host import Host

    if from_file is not None:
        text, source = xids.read_file(from_file), str(from_file)
    else:
        try:
            text, source = xids.read_kernel_log(Host(), timeout=10.0)
        except xids.KernelLogUnavailable as e:  # this machine's doing, not bad input: exit 1
            _console().error(f"cannot read the kernel log: {e}; run as root, or save `dmesg` to a file and use --from FILE")
            return 1
    events = xids.parse(text)
    rows = [{**e.model_dump(mode="json"), **e.info.model_dump(mode="json")} for e in events]
    if json_out:
        _emit(json.dumps({"source": source, "events": rows}, indent=2) + "\n")
    else:
        print(f"{len(rows)} NVIDIA GPU event(s) in {source}")
        for r in rows:
            label = {"xid": f"Xid {r['code']}", "sxid": f"SXid {r['code']}"}.get(r["kind"], r["kind"])
            when = r["time"] or (f"{r['uptime']:.0f} s after boot" if r["uptime"] is not None else "time unknown")
            print(f"{r['severity'].upper():5}  {label:9}  {r['pci'] or '?':12}  {when}\n       {r['meaning']}\n       action: {r['action']}")
    return 1 if any(r["severity"] == "fatal" for r in rows) else 0


@app.command(short_help="GPU/NIC/CPU layout, what is wrong with it, rank pinning.")
@_exit_codes
def topology(
    from_file: Annotated[Optional[Path], typer.Option("--from", metavar="FILE", help="A saved `nvidia-smi topo -m` output (from any machine) instead of this one's.")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", metavar="NAME", help=f"Judge against this profile: {PROFILE_HELP} [default: auto on this machine; none with --from]")] = None,
    config: ConfigOpt = None,
    json_out: JsonOpt = False,
    nvml_fake: FakeOpt = None,
) -> int:
    """How GPUs, NICs and CPUs are laid out, what is wrong with it, and how to pin each rank.

    Exit 1 when a finding fails the profile, or this machine's layout cannot be read."""
    from preflight.outputs import topology_text

    s = _settings(config, profile=profile, nvml_fake=nvml_fake)
    try:
        if from_file is not None:
            text, data, failed = topology_text.explain_capture(from_file, s, profile_named=profile is not None)
        else:
            text, data, failed = topology_text.explain_host(s, note=_console().note)
    except topology_text.Unreadable as e:
        _console().error(str(e))
        return 1
    _emit(json.dumps(data, indent=2) + "\n" if json_out else text)
    return 1 if failed else 0


@app.command("nccl-log", cls=_Command, short_help="Explain an NCCL log: transports, warnings, known errors.")
@_exit_codes
def nccl_log(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A saved NCCL_DEBUG=INFO log, or a PyTorch/NCCL error log.", show_default=False)],
    json_out: JsonOpt = False,
) -> int:
    """Explain an NCCL log: version, network, transport per rank pair, NCCL's warnings, known errors and their fix.

    Exit 1 when the log shows a known NCCL problem, 2 when the file holds no NCCL output."""
    from preflight.outputs import nccl_log_text
    from preflight.readers import capture
    from preflight.readers import nccl_log as nccl

    text = capture.read_text(file, nccl.MAX_BYTES, "pass one rank's log, or an excerpt (grep -e NCCL -e Watchdog)", option=None)
    log = nccl.parse(text)
    if not log.nccl_lines and not log.problems:  # the wrong file: a gate must not read that as a clean run
        raise UsageError(f"{file} holds no NCCL output; run the job with NCCL_DEBUG=INFO (and NCCL_DEBUG_FILE=/path/nccl.%h.%p.log for a file per process) and pass that log")
    _emit(json.dumps(nccl_log_text.to_json(log, str(file)), indent=2) + "\n" if json_out else nccl_log_text.render(log, str(file)))
    return 1 if log.problems else 0


@app.command(short_help="GPU acceptance: every GPU path, run for real.")
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

    return kit.main(stage, profile, out, budget, strict)


@app.command(short_help="Versions of preflight and what it runs on.")
@_exit_codes
def version() -> int:
    """Versions of preflight and what it runs on (torch is looked up, not imported)."""
    # The same body `preflight version` runs without Typer (preflight/cli/main.py).
    return quick.version()


def main() -> None:
    app()
