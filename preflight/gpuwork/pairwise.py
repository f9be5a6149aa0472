"""`preflight pairwise`: the multi-node checks two hosts at a time, to find the slow or broken one.

A run across all hosts that fails or crawls condemns the group, not a node. Round 1
pairs the hosts disjointly; later rounds pair each node not yet cleared with a host
that passed, so a failure is its own. The schedule and the judge are pure functions
of recorded outcomes; only run_round starts processes (own sessions, a deadline)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from preflight.base.errors import Interrupted, UsageError
from preflight.base import tether
from preflight.base.host import stop
from preflight.base.signals import interrupting
from preflight.gpuwork.multinode import expand_hostlist
from preflight.base.units import fmt_rate, fmt_value
from preflight.readers import capture

SSH = "ssh -o BatchMode=yes -o ConnectTimeout=10 {host}"
SRUN = "srun --nodes=1 --ntasks=1 --overlap --nodelist={host}"
GRACE = 3.0  # seconds from SIGTERM to SIGKILL: preflight run needs a moment to stop its own workers
BUSBW = ("internode_allreduce_bus_bandwidth", "allreduce_bus_bandwidth")  # the cross-node figure first
LATENCY = ("internode_allreduce_latency", "allreduce_latency")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")  # ssh's user@host too
ADDR = re.compile(r"[A-Za-z0-9._:%\[\]-]+")
FABRIC = ("no pair passed, so no host is known-good to test it against: add a host known to work, "
          "or suspect what every host shares (the network, the rendezvous port, the software)")


@dataclass(frozen=True)
class Host:
    name: str  # what the exec template reaches it by
    addr: str  # where its partner meets it for the rendezvous


@dataclass(frozen=True)
class Side:  # what one host's `preflight run` left behind
    host: str
    code: int | None  # exit code
    report: Any = None  # its JSON report; None when it printed none
    last: str = ""  # the last line it printed, stderr first
    killed_after: float | None = None  # seconds, when the deadline killed it


@dataclass(frozen=True)
class Pair:
    round: int
    a: str  # node rank 0: hosts the rendezvous
    b: str
    result: str  # "pass", "slow" or "fail"
    busbw: float | None = None  # bytes per second, the worse side's
    latency: float | None = None  # seconds, p50, the worse side's
    cause: str = ""


# ---- pure: hosts, judging, the schedule ----------------------------------------


HOSTS_LIMIT = 1 << 20  # bytes of a --hosts file: tens of thousands of hosts


def read_hosts(path: Path) -> list[Host]:
    """One host per line, ``NAME [ADDRESS]``; ``#`` starts a comment."""
    fix = "give a text file with one host per line: NAME [ADDRESS]"
    try:
        data = capture.read_file(path, HOSTS_LIMIT + 1)  # a FIFO would hang, /dev/zero never end
        lines = data.decode().splitlines() if data is not None else []
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--hosts {path}: cannot read it ({getattr(e, 'strerror', None) or e}); {fix}") from None
    if data is None:
        raise UsageError(f"--hosts {path}: not a regular file; {fix}")
    if len(data) > HOSTS_LIMIT:
        raise UsageError(f"--hosts {path}: larger than {HOSTS_LIMIT >> 20} MiB; {fix}")
    hosts: dict[str, tuple[int, Host]] = {}
    for n, raw in enumerate(lines, 1):
        if not (words := raw.split("#", 1)[0].split()):
            continue
        if len(words) > 2 or not NAME.fullmatch(words[0]) or not ADDR.fullmatch(words[-1]):
            shown = raw.strip() if len(raw.strip()) <= 80 else raw.strip()[:77] + "..."
            raise UsageError(f"--hosts {path} line {n}: {shown!r} is not NAME [ADDRESS]; write one host per line, e.g. `gpu01 10.0.0.1`")
        if words[0] in hosts:
            raise UsageError(f"--hosts {path} line {n}: {words[0]} again (first on line {hosts[words[0]][0]}); list each host once")
        hosts[words[0]] = (n, Host(words[0], words[-1]))
    if len(hosts) < 2:
        raise UsageError(f"--hosts {path}: {len(hosts)} host(s); pairwise needs at least 2, one per line: NAME [ADDRESS]")
    return [h for _, h in hosts.values()]


def choose_hosts(hosts_file: Path | None, exec_template: str | None, env: Mapping[str, str]) -> tuple[list[Host], str]:
    """The hosts and how to reach them: the file's over ssh, else the Slurm allocation's with srun."""
    if hosts_file is not None:
        return read_hosts(hosts_file), exec_template or SSH
    if not (nodelist := env.get("SLURM_JOB_NODELIST")):
        raise UsageError("no hosts: give --hosts FILE (one host per line: NAME [ADDRESS]), or run it inside a Slurm allocation (salloc -N 4)")
    try:
        names = list(dict.fromkeys(expand_hostlist(nodelist)))
    except ValueError as e:
        raise UsageError(f"SLURM_JOB_NODELIST={nodelist}: {e}; give --hosts FILE instead") from None
    if len(names) < 2:
        raise UsageError(f"SLURM_JOB_NODELIST={nodelist} names 1 host; pairwise needs at least 2: allocate more (salloc -N 4) or give --hosts FILE")
    return [Host(n, n) for n in names], exec_template or SRUN


def figure(report: dict, names: Sequence[str], stat: str | None = None) -> float | None:
    """The first of ``names`` that any check measured (with labels.stat == ``stat``)."""
    ms = [m for c in report["checks"] for m in c.get("measurements") or [] if stat is None or (m.get("labels") or {}).get("stat") == stat]
    return next((float(m["value"]) for n in names for m in ms if m.get("name") == n), None)


def side_cause(s: Side) -> str | None:
    """Why this side failed, naming its host; None when it passed."""
    said = f"; it last said: {s.last}" if s.last else "; it printed nothing"
    if s.killed_after is not None:
        return f"{s.host}: no answer within {s.killed_after:g} s{said}"
    if not isinstance(s.report, dict) or not isinstance(s.report.get("checks"), list) or not all(isinstance(c, dict) for c in s.report["checks"]):
        return f"{s.host}: exit {s.code}, no JSON report{said}"
    if bad := next((c for c in s.report["checks"] if c.get("status") in ("FAIL", "ERROR")), None):
        return f"{s.host}: {bad.get('check')} {bad.get('status')}: {bad.get('summary')}"
    return f"{s.host}: exit {s.code} (verdict {s.report.get('verdict')})" if s.code != 0 else None


def judge_pair(rnd: int, a: Side, b: Side) -> Pair:
    if causes := [c for c in (side_cause(a), side_cause(b)) if c]:
        return Pair(rnd, a.host, b.host, "fail", cause="; ".join(causes))
    bws = [v for s in (a, b) if (v := figure(s.report, BUSBW)) is not None]
    lats = [v for s in (a, b) if (v := figure(s.report, LATENCY, "p50")) is not None]
    if not bws:
        bw = next((c for c in a.report["checks"] if c.get("check") == "bandwidth"), None)
        said = f"bandwidth {bw.get('status')}: {bw.get('summary')}" if bw else "no bandwidth check ran"
        return Pair(rnd, a.host, b.host, "fail", cause=f"no all-reduce bus bandwidth in either report ({said})")
    return Pair(rnd, a.host, b.host, "pass", min(bws), max(lats) if lats else None)


def rate(v: float) -> str:
    return f"{v / 1e6:.3g} MB/s" if v < 1e9 else fmt_rate(v)


def judge_speed(pairs: list[Pair], earlier: list[Pair], tolerance: float) -> list[Pair]:
    """Slow: busbw under ``tolerance`` x the median of the pairs that passed so far, or p50
    latency over median / ``tolerance``. This round's own pairs are the reference only
    while none passed before, so slow pairs retested with known-good ones never drag it down."""
    pool = [p for p in earlier if p.result == "pass"] or [p for p in pairs if p.result == "pass"]
    bw = statistics.median(p.busbw for p in pool if p.busbw is not None) if pool else None
    lat = statistics.median(lats) if (lats := [p.latency for p in pool if p.latency is not None]) else None
    out = []
    for p in pairs:
        why = []
        if p.result == "pass" and bw and p.busbw is not None and p.busbw < tolerance * bw:
            why.append(f"busbw {rate(p.busbw)} vs median {rate(bw)}")
        if p.result == "pass" and lat and p.latency is not None and p.latency > lat / tolerance:
            why.append(f"latency p50 {fmt_value(p.latency, 'seconds')} vs median {fmt_value(lat, 'seconds')}")
        out.append(replace(p, result="slow", cause="slow: " + ", ".join(why)) if why else p)
    return out


def classify(names: list[str], done: list[Pair]) -> dict[str, tuple[str, str]]:
    """name -> (good | bad | suspect | untested, why). A failure with a partner that passed
    with someone counts against the node, even when the partner passed only later."""
    good = {n for p in done if p.result == "pass" for n in (p.a, p.b)}
    out = {}
    for n in names:
        mine = [(p, p.b if p.a == n else p.a) for p in done if n in (p.a, p.b)]
        blamed = next(((p, o) for p, o in reversed(mine) if p.result != "pass" and o in good), None)  # the latest: a retest with a known-good host
        if n in good:
            out[n] = ("good", "passed with " + ", ".join(dict.fromkeys(o for p, o in mine if p.result == "pass")))
        elif blamed:
            verb = "slow" if blamed[0].result == "slow" else "fails"
            out[n] = ("bad", f"{verb} with known-good {blamed[1]}: {blamed[0].cause.removeprefix('slow: ')}")
        else:
            out[n] = ("suspect", "; ".join(f"{'slow' if p.result == 'slow' else 'fails'} with {o}" for p, o in mine)) if mine else ("untested", "never paired")
    return out


def plan(names: list[str], done: list[Pair]) -> list[tuple[str, str]]:
    """The next round's disjoint pairs: every unsettled node with a distinct known-good
    partner it has not tried; the rest (all of them while none is known-good) with each
    other in pairs not tried yet, the least failed first. Empty: nothing left to learn."""
    state = classify(names, done)
    tried = {frozenset((p.a, p.b)) for p in done}
    unsettled = [n for n in names if state[n][0] in ("untested", "suspect")]
    good = [n for n in names if state[n][0] == "good"]
    pairs: list[tuple[str, str]] = []
    busy: set[str] = set()
    for n in unsettled:
        if partner := next((g for g in good if g not in busy and frozenset((n, g)) not in tried), None):
            pairs.append((partner, n))  # the known-good host hosts the rendezvous
            busy |= {n, partner}
    failed = {n: sum(n in (p.a, p.b) for p in done) for n in names}
    rest = sorted((n for n in unsettled if n not in busy), key=lambda n: failed[n])
    for i, n in enumerate(rest):
        if n not in busy and (m := next((m for m in rest[i + 1:] if m not in busy and frozenset((n, m)) not in tried), None)):
            pairs.append((n, m))
            busy |= {n, m}
    return pairs


def session(hosts: list[Host], run: Callable[[int, list[tuple[Host, Host]]], list[tuple[Side, Side]]], tolerance: float,
            show: Callable[[int, list[Pair]], None] = lambda r, ps: None) -> tuple[list[Pair], dict[str, tuple[str, str]]]:
    """Rounds, at most one per host, until every node is settled or no pair is left to try;
    then every node is good, bad or undetermined, with why."""
    names, by_name, done = [h.name for h in hosts], {h.name: h for h in hosts}, []
    for rnd in range(1, len(hosts) + 1):
        if not (pairs := plan(names, done)):
            break
        sides = run(rnd, [(by_name[a], by_name[b]) for a, b in pairs])
        done += (judged := judge_speed([judge_pair(rnd, a, b) for a, b in sides], done, tolerance))
        show(rnd, judged)
    state = classify(names, done)  # with a known-good host, only the round limit leaves a node unsettled
    left = f"not settled within {len(hosts)} rounds" if any(s == "good" for s, _ in state.values()) else FABRIC
    return done, {n: (s, w) if s in ("good", "bad") else ("undetermined", f"{w}; {left}") for n, (s, w) in state.items()}


# ---- processes ------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    exec_template: str
    preflight_cmd: str
    profile: str
    port: int
    timeout: float
    extra: tuple[str, ...] = ()

    def argv(self, rnd: int, pair: tuple[Host, Host], ids: tuple[int, int], rank: int) -> list[str]:
        name, addr = pair[rank].name, pair[0].addr
        addr = f"[{addr}]" if ":" in addr and not addr.startswith("[") else addr
        # Killing ssh does not stop the remote run (no terminal, no hangup): it ends itself, before the round's deadline.
        # A partner that never comes is given up on in a third of the round, so the side that came still answers.
        # --scratch: a pair's verdict is not the node's own; the gate's report and metrics stay as they are.
        return [*shlex.split(self.exec_template.format(host=name)), "timeout", "-k", "5", f"{max(5.0, self.timeout - 10):g}",
                *shlex.split(self.preflight_cmd.format(host=name)),
                "run", "--profile", self.profile, "--nnodes", "2", "--node-rank", str(rank),
                "--rdzv-endpoint", f"{addr}:{self.port}", "--rdzv-id", f"preflight-pair-{rnd}-{ids[0]}-{ids[1]}",
                "--rdzv-timeout", f"{max(5.0, self.timeout / 3):g}", "--only", "nccl,bandwidth", "--scratch", "--json", *self.extra]  # fmt: skip


def stop_all(procs: list[subprocess.Popen]) -> None:
    """Every group still running, all at once: SIGTERM, GRACE seconds, SIGKILL (host.stop)."""
    live = [p for p in procs if p.poll() is None]
    with ThreadPoolExecutor(max(1, len(live))) as pool:
        list(pool.map(lambda p: stop(p, GRACE), live))


def _side(host: str, p: subprocess.Popen, out: Any, err: Any, killed_after: float | None) -> Side:
    texts = []
    for f in (err, out):
        f.seek(0)
        texts.append(f.read().decode(errors="replace"))
    m = re.search(r"^\{", texts[1], re.M)  # a login banner before the report is fine
    try:
        report = json.JSONDecoder().raw_decode(texts[1], m.start())[0] if m else None
    except ValueError:
        report = None
    last = next((ln.strip()[:300] for t in texts for ln in reversed(t.splitlines()) if ln.strip()), "")
    return Side(host, p.returncode, report, last, killed_after)


def run_round(launch: Launch, rnd: int, pairs: list[tuple[Host, Host]], index: Mapping[str, int]) -> list[tuple[Side, Side]]:
    """Both sides of every pair at once; past the deadline a side is killed with its group."""
    sides: list[Any] = []
    procs: list[subprocess.Popen] = []
    with contextlib.ExitStack() as files:
        try:
            for pair, rank in ((pair, rank) for pair in pairs for rank in (0, 1)):
                out, err = files.enter_context(tempfile.TemporaryFile()), files.enter_context(tempfile.TemporaryFile())
                argv = launch.argv(rnd, pair, (index[pair[0].name], index[pair[1].name]), rank)
                try:
                    procs.append(tether.popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True))  # dies with us
                    sides.append((pair[rank].name, procs[-1], out, err))
                except OSError as e:
                    sides.append(Side(pair[rank].name, 127, None, f"could not start {argv[0]}: {e.strerror or e}"))  # 127: as a shell says it
            deadline = time.monotonic() + launch.timeout
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
            late = {p.pid for p in procs if p.poll() is None}
        finally:
            stop_all(procs)
        sides = [s if isinstance(s, Side) else _side(*s, launch.timeout if s[1].pid in late else None) for s in sides]
    return list(zip(sides[::2], sides[1::2]))


# ---- the command ----------------------------------------------------------------


def show_round(console: Any, rnd: int, pairs: list[Pair]) -> None:
    """One line a pair; the console styles it on a terminal and leaves it plain in logs."""
    width = max(len(f"{p.a} + {p.b}") for p in pairs)
    console.line(f"round {rnd}: pair, result, busbw, latency p50, cause")
    for p in pairs:
        bw, lat = rate(p.busbw) if p.busbw is not None else "-", fmt_value(p.latency, "seconds") if p.latency is not None else "-"
        style = {"pass": "green", "slow": "yellow"}.get(p.result, "bold red")
        console.line(f"  {p.a + ' + ' + p.b:<{width}}  {p.result.upper():<4}  {bw:>10}  {lat:>9}  {p.cause}".rstrip(), style)


def main(hosts: Path | None, exec_template: str | None, preflight_cmd: str, profile: str, port: int, timeout: float,
         tolerance: float, json_out: bool, console: Any, extra: Sequence[str] = (), env: Mapping[str, str] | None = None) -> int:
    """Exit 0 when every host is good, 1 when one is bad or undetermined; UsageError for bad input."""
    if not 0 < tolerance <= 1:
        raise UsageError(f"--tolerance {tolerance:g}: give a fraction in (0, 1], e.g. 0.5: a pair under half the median busbw is slow")
    if not 1 <= port < 65535:  # preflight run refuses 65535: node rank 0 also listens on PORT+1
        raise UsageError(f"--port {port}: give the rendezvous port, 1-65534 (default 29500); PORT and PORT+1 must be open between the hosts")
    if not 0 < timeout <= 86400:
        raise UsageError(f"--timeout {timeout:g}: give the seconds a pair may take, above 0, at most 86400 (a day), e.g. 300")
    chosen, template = choose_hosts(hosts, exec_template, os.environ if env is None else env)
    words = {}
    for flag, text in (("--exec", template), ("--preflight", preflight_cmd)):
        try:
            words[flag] = shlex.split(text.format(host=chosen[0].name))
        except (KeyError, IndexError, ValueError) as e:
            raise UsageError(f"{flag} {text!r}: {type(e).__name__} {e}; write {{host}} where the host name goes, and quote as a shell would") from None
    if "{host}" not in template:
        raise UsageError(f"--exec {template!r}: no {{host}} in it, so every pair would run here; e.g. --exec 'ssh {{host}}'")
    if words["--exec"] and shutil.which(words["--exec"][0]) is None:
        raise UsageError(f"--exec {template!r}: {words['--exec'][0]} is not on PATH; install it or give another --exec")
    launch, index = Launch(template, preflight_cmd, profile, port, timeout, tuple(extra)), {h.name: i for i, h in enumerate(chosen)}
    console.note(f"pairwise: {len(chosen)} hosts, pairs of `{template} {preflight_cmd} run --profile {profile}`, {timeout:g} s a round")
    try:
        with interrupting():  # run_round's finally then stops every group it started
            done, verdict = session(chosen, lambda rnd, pairs: run_round(launch, rnd, pairs, index), tolerance, lambda r, ps: show_round(console, r, ps))
    except Interrupted as e:
        console.error(f"pairwise interrupted by signal {e.signum}: every run it started was stopped; no verdict")
        return 128 + e.signum
    counts = {s: [n for n, (st, _) in verdict.items() if st == s] for s in ("good", "bad", "undetermined")}
    code = 1 if counts["bad"] or counts["undetermined"] else 0
    for n, (state, why) in ((n, v) for n, v in verdict.items() if v[0] != "good"):
        console.line(f"{state}: {n} ({why})", "bold red" if state == "bad" else "bold magenta")
    console.line(f"preflight: pairwise {'FAIL' if code else 'PASS'}: {len(counts['good'])} good, {len(counts['bad'])} bad, {len(counts['undetermined'])} "
                 f"undetermined of {len(chosen)} hosts in {max((p.round for p in done), default=0)} round(s), exit {code}", "bold red" if code else "bold green")
    if json_out:
        data = {"hosts": [asdict(h) for h in chosen], "tolerance": tolerance, "pairs": [asdict(p) for p in done],
                "nodes": {n: {"state": s, "why": w} for n, (s, w) in verdict.items()}, **counts, "exit_code": code}
        try:
            print(json.dumps(data, indent=2), flush=True)
        except (BrokenPipeError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # a reader that left must not change the exit code
    return code
