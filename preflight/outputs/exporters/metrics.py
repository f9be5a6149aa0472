"""Prometheus metrics of a report: one Collector, two outputs.

`preflight run --textfile-dir` writes it for node_exporter's textfile
collector; `preflight serve` renders it at every scrape from the report on
disk. Both go through ``ReportCollector``, so the names cannot drift.

Naming (https://prometheus.io/docs/practices/naming/): the ``preflight_``
prefix, base units, the unit last, one unit per family. A check's
Measurement ``allreduce_bus_bandwidth`` in ``bytes_per_second`` becomes
``preflight_allreduce_bus_bandwidth_bytes_per_second``, and its floor
``preflight_allreduce_bus_bandwidth_floor_bytes_per_second`` with the same
labels, so ``figure < floor`` matches sample to sample in PromQL; a timed figure
also has ``_repeats``, ``_ci_ratio`` and ``_converged`` with its labels. GPU labels
are dcgm-exporter's ``gpu`` and ``UUID`` so joins with DCGM work. There is no
hostname label: the scrape adds ``instance``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from preflight.base.actions import LADDER, Domain
from preflight.base.findings import Status
from preflight.base import safefile
from preflight.base.errors import UsageError
from preflight.outputs.record.last_report import Loaded, State, standing
from preflight.pipeline.report import GroupRecord, Report, Verdict, versions_of
from preflight.pipeline.report_schema import LEVELS

PREFIX = "preflight_"
TEXTFILE = "preflight.prom"
INFO_LABELS = ("version", "profile", "driver_version", "cuda_version", "torch_version", "gpu_model")


def gauge(name: str, doc: str, value: float | None = None, labels: dict[str, str] | None = None) -> GaugeMetricFamily:
    g = GaugeMetricFamily(PREFIX + name, doc, labels=list(labels or {}))
    if value is not None:
        g.add_metric(list((labels or {}).values()), value)
    return g


def _ts(t: datetime) -> float:
    return t.timestamp()


def report_families(r: Report) -> Iterator[Metric]:
    """Everything one report says, as metric families."""
    v = {**versions_of(r.checks), **r.versions}  # a report written before a version was kept (the GPU model) says it in its checks
    yield gauge("info", "preflight's version, the profile it judged against, the versions and the GPU model the checks saw (always 1).", 1,
                dict(zip(INFO_LABELS, (r.version, r.profile or "", v.get("driver", ""), v.get("cuda", ""), v.get("torch", ""), v.get("gpu", "")))))
    yield gauge("run_passed", "1 if the last run's verdict was pass (warnings allowed), else 0.", float(r.verdict == Verdict.PASS))
    yield gauge("run_exit_code", "Exit code of the last run: 0 pass, 1 a check failed, 3 preflight broke, 128+N a signal.", r.exit_code)
    yield gauge("run_timestamp_seconds", "When the last run finished, seconds since the epoch.", _ts(r.finished_at))
    yield gauge("run_duration_seconds", "How long the last run took, detection included.", r.duration_seconds)
    if r.last_success_at is not None:
        yield gauge("last_success_timestamp_seconds", "When a run last passed, seconds since the epoch.", _ts(r.last_success_at))
    level = GaugeMetricFamily(PREFIX + "run_level", "How deep the last run looked, one-hot over quick, standard and full (a report from before levels: standard).", labels=["level"])
    for name in LEVELS:
        level.add_metric([name], float((r.level or "standard") == name))
    yield level
    # What a fleet's automation acts on (preflight/base/actions.py): one-hot over the ladder and the
    # domains, so `preflight_action{action="reset-gpu"} == 1` selects the nodes to reset.
    action = GaugeMetricFamily(PREFIX + "action", "What the last run asks be done about the node, one-hot over none, watch, fix-job, "
                               "drain, reset-gpu, reboot and service (the highest of its findings').", labels=["action"])
    for a in LADDER:
        action.add_metric([a.value], float(r.action == a))
    domain = GaugeMetricFamily(PREFIX + "action_domain", "Whose fault the action's finding is, one-hot over node, software and job.", labels=["domain"])
    for d in Domain:
        domain.add_metric([d.value], float(r.domain == d))
    yield from (action, domain)
    if r.held_back is not None:  # serve's scrape of a report a scheduler integration wrote into (outputs/schedulers/held_back.py)
        yield gauge("held_back", "1 where a scheduler integration held back what the last run asks (slurm-healthcheck past its cap "
                    "on drains), labelled by the tool; absent otherwise.", 1.0, {"by": r.held_back.by})
    passed = GaugeMetricFamily(PREFIX + "check_passed", "1 if the check passed (PASS or WARN), 0 if it failed, errored or was skipped.", labels=["check"])
    status = GaugeMetricFamily(PREFIX + "check_status", "The check's status, one-hot over PASS, WARN, FAIL, SKIP and ERROR.", labels=["check", "status"])
    duration = GaugeMetricFamily(PREFIX + "check_duration_seconds", "How long the check took.", labels=["check"])
    measured = GaugeMetricFamily(PREFIX + "check_timestamp_seconds", "When the check's result was measured, seconds since the epoch: "
                                 "a result kept from an earlier run (a lighter or partial run left it alone) keeps its own time.", labels=["check"])
    for c in r.checks:
        passed.add_metric([c.check], float(c.status in (Status.PASS, Status.WARN)))
        for s in Status:
            status.add_metric([c.check, s.value.lower()], float(c.status == s))
        duration.add_metric([c.check], c.duration_seconds)
        if (when := _measured_at(c.details.get("carried_from"), r.finished_at)) is not None:
            measured.add_metric([c.check], when)
    yield from (passed, status, duration, measured)
    yield from measurement_families(r)
    if r.group:
        yield from group_families(r.group)


def _measured_at(carried_from: object, finished: datetime) -> float | None:
    """A result's own time: the run's finish, or when the run it was kept from finished
    (None where that is not a time with a zone: no sample beats a wrong one)."""
    if carried_from is None:
        return _ts(finished)
    try:
        when = datetime.fromisoformat(str(carried_from).replace("Z", "+00:00"))
    except ValueError:
        return None
    return _ts(when) if when.tzinfo is not None else None


def group_families(group: GroupRecord) -> Iterator[Metric]:
    """A run across nodes: every node exports the group's size and outcome as it saw it;
    node rank 0, which every node reports to, also one series per node."""
    yield gauge("group_nodes", "Nodes in the group this node ran nccl and bandwidth with.", group.nnodes)
    yield gauge("group_node_rank", "This node's rank in the group.", group.node_rank)
    yield gauge("group_passed", "1 if every node of the group came and passed its group checks, as this node was told.", float(group.passed))
    if group.node_rank == 0:
        per = GaugeMetricFamily(PREFIX + "group_node_passed", "1 if that node came and passed its group checks (node rank 0's record; missing nodes are 0).", labels=["node_rank"])
        told = {n.node_rank: n.ok for n in group.nodes}
        for rank in range(group.nnodes):
            per.add_metric([str(rank)], float(told.get(rank, False)))
        yield per


def measurement_families(r: Report) -> Iterator[Metric]:
    families: dict[str, Metric] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def add(name: str, doc: str, labels: dict[str, str], value: float) -> None:
        key = (name, tuple(sorted(labels.items())))
        if key in seen:  # one series per label set, or the exposition is invalid
            return
        seen.add(key)
        families.setdefault(name, Metric(name, doc, "gauge")).add_sample(name, labels, value)

    # The history's figures (failures in the window, each figure's drift ratio) are the run's own, as a check's.
    for c in [*r.checks, *([r.history] if r.history else [])]:
        for m in c.measurements:
            add(f"{PREFIX}{m.name}_{m.unit}", f"{m.name} in {m.unit}, measured by the {c.check} check.", m.labels, m.value)
            if m.floor is not None:
                add(f"{PREFIX}{m.name}_floor_{m.unit}", f"The floor for {m.name}: below it the {c.check} check fails.", m.labels, m.floor)
            if m.ceiling is not None:
                add(f"{PREFIX}{m.name}_ceiling_{m.unit}", f"The ceiling for {m.name}: above it the {c.check} check fails.", m.labels, m.ceiling)
            # How sure a timed figure is, with the figure's labels: its repeats, its 95% interval
            # relative to it, and whether that met the profile's tolerance before a cap.
            if m.repeats is not None:
                add(f"{PREFIX}{m.name}_repeats", f"Timed repeats behind {m.name} (warm-up excluded).", m.labels, m.repeats)
            if m.ci is not None:
                add(f"{PREFIX}{m.name}_ci_ratio", f"The 95% confidence interval of {m.name}'s median, its far end over the figure, less 1.", m.labels, m.ci)
            if m.converged is not None:
                add(f"{PREFIX}{m.name}_converged", f"1 if {m.name}'s interval was within the profile's tolerance, 0 if a cap on repeats or seconds stopped it first.", m.labels, float(m.converged))
    yield from families.values()


class ReportCollector:
    """A prometheus_client collector over a report: a fixed one (the textfile),
    or the one on disk now (``serve``, which also says whether it is usable,
    of this boot, and how old)."""

    def __init__(self, load: Callable[[], Loaded], live: Callable[[], tuple[str | None, datetime, datetime | None]] | None = None):
        self.load = load
        self.live = live  # () -> (this boot's id, now, boot time), for serve

    def collect(self) -> Iterator[Metric]:
        loaded = self.load()
        yield from self.standing(loaded)
        if loaded.report is not None:  # no preflight_run_passed at all without one: never a stale 1
            yield from report_families(loaded.report)

    def standing(self, loaded: Loaded) -> Iterator[Metric]:
        """What changes with the clock and the boot, not with the report: serve's own part."""
        if self.live is None:
            return
        state = GaugeMetricFamily(PREFIX + "report_state", "The report serve read at this scrape: one-hot over ok, missing, unreadable and invalid.", labels=["state"])
        for s in State:
            state.add_metric([s.value], float(loaded.state == s))
        yield state
        boot_id, now, booted = self.live()
        st = standing(loaded, boot_id, now, booted=booted)
        yield gauge("vouched", "1 if the last report vouches for this node now: a pass, in this boot. 0 otherwise, also without a usable report.", float(bool(st.vouched)))
        if loaded.report is None:
            return
        if st.current_boot is not None:
            yield gauge("report_current_boot", "1 if the report was written in this boot, 0 if before the last reboot (it vouches for nothing now).", float(st.current_boot))
        yield gauge("report_age_seconds", "Seconds since the report's run finished.", st.age_seconds)


class StandingCollector:
    """Only ``ReportCollector.standing``: serve renders this at each scrape and the
    report's own families once per report (``render_report``)."""

    def __init__(self, of: ReportCollector):
        self.of = of

    def collect(self) -> Iterator[Metric]:
        yield from self.of.standing(self.of.load())


def render(collector: ReportCollector | StandingCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def render_report(report: Report) -> bytes:
    """The report's own families, as the textfile holds them."""
    return render(ReportCollector(lambda: Loaded(State.OK, report)))


def check_textfile_dir(directory: Path) -> Path:
    """Refuse, before any check runs, a textfile directory that could not take the file."""
    where = f"textfile dir {directory} (--textfile-dir, PREFLIGHT_TEXTFILE_DIR or config)"
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise UsageError(f"{where} {what}; create it (mkdir -p {directory}) or point it at node_exporter's --collector.textfile.directory")
    safefile.check(directory / TEXTFILE, where, TEXTFILE)
    return directory


def write_textfile(directory: Path, report: Report) -> Path:
    """DIR/preflight.prom, atomically (a temp file of our own in DIR, then rename):
    node_exporter reads only *.prom, so it never sees half a file. Never through a
    link another user planted (base/safefile.py); 0644, for node_exporter's own user."""
    stage_textfile(directory, report).commit()
    return directory / TEXTFILE


def stage_textfile(directory: Path, report: Report) -> safefile.Staged:
    """The textfile written beside its name, put in place by ``commit`` (gate.py: once the report is)."""
    return safefile.stage(directory / TEXTFILE, render_report(report), 0o644)


def previous_success(directory: Path) -> datetime | None:
    """The last pass the textfile this run replaces knew of (runs with a textfile but no --report)."""
    from datetime import timezone

    raw = safefile.read_own(directory / TEXTFILE)  # not one another user wrote: it would lend a pass
    try:
        text = (raw or b"").decode()
        for family in text_string_to_metric_families(text):
            if family.name == PREFIX + "last_success_timestamp_seconds" and family.samples:
                return datetime.fromtimestamp(family.samples[0].value, timezone.utc)
    except ValueError:
        pass  # none, or not ours: no pass is known
    return None
