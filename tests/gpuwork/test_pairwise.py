"""`preflight pairwise`: the host list, the judge and the schedule from recorded
outcomes (pure), the pair runner against a fake exec template (real processes,
deadlines, signals, pgrep), and one real session over network namespaces."""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fakes
import netns
import pytest
from conftest import CPU_TOML, REPORTS, clean_env, workers_left

from preflight.gpuwork import pairwise
from preflight.outputs.exporters.console import Console
from preflight.base.errors import UsageError
from preflight.gpuwork.pairwise import Host, Pair, Side

FAST, SLOW = 3.1e8, 1.1e6  # bytes per second: a healthy pair, a pair with a crawling host


def report(busbw: float | None = FAST, latency: float = 2.6e-4, prefix: str = "", failing: str | None = None, code: int = 0) -> dict:
    """A `preflight run --only nccl,bandwidth --json` report, as small as the judge needs."""
    nccl = {"check": "nccl", "status": "FAIL" if failing else "PASS", "summary": failing or "4 gloo rank(s) on 2 nodes: ops right", "measurements": []}
    figures = [] if busbw is None else [
        {"name": f"{prefix}allreduce_bus_bandwidth", "unit": "bytes_per_second", "value": busbw, "labels": {"collective": "all_reduce"}, "floor": 5e6, "ceiling": None},
        {"name": f"{prefix}allreduce_latency", "unit": "seconds", "value": latency, "labels": {"stat": "p50"}, "floor": None, "ceiling": 0.02},
        {"name": f"{prefix}allreduce_latency", "unit": "seconds", "value": latency * 20, "labels": {"stat": "p99"}, "floor": None, "ceiling": None},
    ]
    bandwidth = {"check": "bandwidth", "status": "SKIP" if failing else "PASS", "summary": "skipped: nccl failed" if failing else "every figure within its floor", "measurements": figures}
    return {"verdict": "fail" if failing or code else "pass", "exit_code": code or (1 if failing else 0), "checks": [nccl, bandwidth]}


def recorded(name: str) -> dict:
    return json.loads((REPORTS / f"{name}.json").read_text())


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- the host list -------------------------------------------------------------------


def test_a_hosts_file_gives_names_and_addresses_in_order(tmp_path):
    f = write(tmp_path / "hosts", "# rack 7\ngpu01 10.0.0.1\n\ngpu02   # same name for ssh and the rendezvous\n  gpu03\t[fd00::3]\nroot@gpu04 gpu04-ib\n")
    assert pairwise.read_hosts(f) == [Host("gpu01", "10.0.0.1"), Host("gpu02", "gpu02"), Host("gpu03", "[fd00::3]"), Host("root@gpu04", "gpu04-ib")]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("gpu01 10.0.0.1\ngpu02 10.0.0.2 extra\n", r"hosts line 2: 'gpu02 10.0.0.2 extra' is not NAME \[ADDRESS\]; write one host per line, e.g. `gpu01 10.0.0.1`"),
        ("gpu01\n-gpu02\n", r"hosts line 2: '-gpu02' is not NAME \[ADDRESS\]"),
        ("gpu01\ngpu02 10.0.0.2;rm\n", r"hosts line 2: .* is not NAME \[ADDRESS\]"),
        ("gpu01\n# gpu02\ngpu03\ngpu01 10.0.0.9\n", r"hosts line 4: gpu01 again \(first on line 1\); list each host once"),
        ("# only one\ngpu01\n", r"hosts: 1 host\(s\); pairwise needs at least 2, one per line: NAME \[ADDRESS\]"),
        ("", r"hosts: 0 host\(s\); pairwise needs at least 2"),
        ("gpu01\ngpu02 10.0.0.2 " + "x" * 100000 + "\n", r"hosts line 2: 'gpu02 10\.0\.0\.2 x{62}\.\.\.' is not NAME \[ADDRESS\]"),  # one line, not 100 kB
    ],
)
def test_a_bad_hosts_file_is_one_line_naming_the_file_the_line_and_the_fix(tmp_path, text, words):
    f = write(tmp_path / "hosts", text)
    with pytest.raises(UsageError, match=f"^--hosts {tmp_path}/{words}"):
        pairwise.read_hosts(f)


def test_a_hosts_file_that_would_hang_or_never_end_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    for name in ("fifo", "zero"):
        started = time.monotonic()
        with pytest.raises(UsageError, match=f"^--hosts {tmp_path}/{name}: not a regular file; give a text file"):
            pairwise.read_hosts(tmp_path / name)
        assert time.monotonic() - started < 5


def test_a_missing_hosts_file_says_so(tmp_path):
    with pytest.raises(UsageError, match=r"--hosts .*/nope: cannot read it \(No such file or directory\); give a text file"):
        pairwise.read_hosts(tmp_path / "nope")


def test_under_slurm_the_allocation_is_the_host_list_and_srun_the_default_exec(tmp_path):
    env = {"SLURM_JOB_NODELIST": "gpu-[01-03],login1"}
    hosts, template = pairwise.choose_hosts(None, None, env)
    assert [h.name for h in hosts] == ["gpu-01", "gpu-02", "gpu-03", "login1"] and all(h.addr == h.name for h in hosts)
    assert template == "srun --nodes=1 --ntasks=1 --overlap --nodelist={host}"
    assert pairwise.choose_hosts(None, "ssh -p 2222 {host}", env)[1] == "ssh -p 2222 {host}"
    f = write(tmp_path / "hosts", "a\nb\n")  # a file wins over the allocation, reached by ssh
    assert pairwise.choose_hosts(f, None, env) == ([Host("a", "a"), Host("b", "b")], "ssh -o BatchMode=yes -o ConnectTimeout=10 {host}")


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, r"no hosts: give --hosts FILE \(one host per line: NAME \[ADDRESS\]\), or run it inside a Slurm allocation"),
        ({"SLURM_JOB_NODELIST": "gpu[01-03"}, r"SLURM_JOB_NODELIST=gpu\[01-03: unbalanced '\[' .*; give --hosts FILE instead"),
        ({"SLURM_JOB_NODELIST": "gpu01"}, r"names 1 host; pairwise needs at least 2"),
    ],
)
def test_without_a_host_list_or_with_a_bad_allocation_it_is_a_usage_error(env, words):
    with pytest.raises(UsageError, match=words):
        pairwise.choose_hosts(None, None, env)


# ---- judging a pair ------------------------------------------------------------------


def test_two_passing_reports_pass_with_the_worse_sides_figures():
    a, b = recorded("cpu-pass"), report(busbw=1.2e9, latency=4e-4)
    p = pairwise.judge_pair(1, Side("pf0", 0, a), Side("pf1", 0, b))
    assert p == Pair(1, "pf0", "pf1", "pass", 1.2e9, 4e-4)
    p = pairwise.judge_pair(1, Side("pf0", 0, a), Side("pf1", 0, a))
    assert (p.busbw, p.latency) == (pytest.approx(1702113395.59), pytest.approx(0.000263064))  # p50, not p99


def test_the_internode_figures_win_over_the_local_ones():
    r = report(busbw=9e9, latency=1e-5)
    r["checks"][1]["measurements"] += report(busbw=2e8, latency=3e-4, prefix="internode_")["checks"][1]["measurements"]
    p = pairwise.judge_pair(1, Side("a", 0, r), Side("b", 0, report(busbw=2.5e8, latency=2e-4, prefix="internode_")))
    assert (p.result, p.busbw, p.latency) == ("pass", 2e8, 3e-4)


def test_a_failing_check_is_the_cause_named_by_host():
    p = pairwise.judge_pair(2, Side("pf0", 0, report()), Side("pf3", 1, recorded("shm-64m-fail")))
    assert p.result == "fail" and p.cause.startswith("pf3: shm FAIL: /dev/shm is 64 MiB")
    p = pairwise.judge_pair(2, Side("pf0", 1, report(failing="rank 2 (pf1) did not answer all_reduce within 20 s")), Side("pf1", 0, report()))
    assert p.cause == "pf0: nccl FAIL: rank 2 (pf1) did not answer all_reduce within 20 s"


def test_a_side_with_no_answer_or_no_json_fails_naming_the_host_and_its_last_words():
    waiting = Side("pf1", None, None, "waiting for the rendezvous at 10.0.0.1:29500", killed_after=300)
    refused = Side("pf3", 255, None, "ssh: connect to host pf3 port 22: Connection refused")
    p = pairwise.judge_pair(1, waiting, refused)
    assert p.result == "fail"
    assert p.cause == ("pf1: no answer within 300 s; it last said: waiting for the rendezvous at 10.0.0.1:29500; "
                       "pf3: exit 255, no JSON report; it last said: ssh: connect to host pf3 port 22: Connection refused")
    assert pairwise.judge_pair(1, Side("a", 0, report()), Side("b", 1, None)).cause == "b: exit 1, no JSON report; it printed nothing"
    assert pairwise.judge_pair(1, Side("a", 0, report()), Side("b", 0, {"checks": "?"})).cause.startswith("b: exit 0, no JSON report")


def test_an_exit_code_without_a_failing_check_or_a_report_without_figures_fails():
    assert pairwise.judge_pair(1, Side("a", 0, report()), Side("b", 3, report(code=3))).cause == "b: exit 3 (verdict fail)"
    p = pairwise.judge_pair(1, Side("a", 0, report(busbw=None)), Side("b", 0, report(busbw=None)))
    assert p.result == "fail" and p.cause == "no all-reduce bus bandwidth in either report (bandwidth PASS: every figure within its floor)"


def test_slow_is_against_the_median_of_the_passing_pairs_so_far():
    earlier = [Pair(1, "a", "b", "pass", 3.0e8, 2e-4), Pair(1, "c", "d", "pass", 3.1e8, 3e-4), Pair(1, "e", "f", "fail", cause="x")]
    now = [Pair(2, "a", "g", "pass", SLOW, 2.5e-4), Pair(2, "b", "h", "pass", 2.0e8, 9e-4), Pair(2, "c", "i", "pass", 1.6e8, 4.9e-4)]
    slow, lat, fine = pairwise.judge_speed(now, earlier, 0.5)
    assert (slow.result, slow.cause) == ("slow", "slow: busbw 1.1 MB/s vs median 305 MB/s")
    assert (lat.result, lat.cause) == ("slow", "slow: latency p50 900.0 us vs median 250.0 us")
    assert fine == now[2]  # just above half the median and just under twice its latency
    assert [p.result for p in pairwise.judge_speed(now, earlier, 1.0)] == ["slow", "slow", "slow"]
    assert [p.result for p in pairwise.judge_speed(now, earlier, 0.001)] == ["pass", "pass", "pass"]


def test_before_any_pair_passed_the_rounds_own_pairs_are_the_reference():
    first = [Pair(1, "a", "b", "pass", FAST, 2e-4), Pair(1, "c", "d", "pass", SLOW, 2e-4)]
    assert [p.result for p in pairwise.judge_speed(first, [], 0.5)] == ["pass", "slow"]
    assert pairwise.judge_speed(first[:1], [], 0.5) == first[:1]  # alone, a pair is its own median


# ---- the schedule, from recorded outcomes ---------------------------------------------


class Cluster:
    """Pair outcomes as real hosts would give them: a broken host fails every pair it is
    in, a slow one drags its pair's busbw down. Records every round it is asked to run."""

    def __init__(self, n: int, broken: tuple[int, ...] = (), slow: tuple[int, ...] = ()):
        self.hosts = [Host(f"pf{i}", f"10.0.0.{i + 1}") for i in range(n)]
        self.broken, self.slow = {f"pf{i}" for i in broken}, {f"pf{i}" for i in slow}
        self.rounds: list[list[tuple[str, str]]] = []

    def __call__(self, rnd: int, pairs: list[tuple[Host, Host]]) -> list[tuple[Side, Side]]:
        assert len({h.name for pair in pairs for h in pair}) == 2 * len(pairs), "a host in two pairs of one round"
        self.rounds.append([(a.name, b.name) for a, b in pairs])
        out = []
        for a, b in pairs:
            if {a.name, b.name} & self.broken:
                bad = sorted({a.name, b.name} & self.broken)[0]
                out.append(tuple(Side(h.name, 1, report(failing=f"rank {2 * (h.name != bad)} did not answer: {bad} reset the connection")) for h in (a, b)))
            else:
                bw = SLOW if {a.name, b.name} & self.slow else FAST * (1 + 0.01 * len(out))
                out.append((Side(a.name, 0, report(bw)), Side(b.name, 0, report(bw))))
        return out

    def run(self, tolerance: float = 0.5) -> tuple[list[Pair], dict[str, tuple[str, str]]]:
        done, verdict = pairwise.session(self.hosts, self, tolerance)
        assert len(self.rounds) <= len(self.hosts)
        tried = [frozenset(p) for r in self.rounds for p in r]
        assert len(tried) == len(set(tried)), f"a pair tried twice: {self.rounds}"
        return done, verdict


def states(verdict: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, (state, _) in verdict.items():
        out.setdefault(state, []).append(name)
    return out


def test_round_one_pairs_the_hosts_disjointly_and_leaves_the_odd_one_out():
    assert pairwise.plan(["a", "b", "c", "d", "e"], []) == [("a", "b"), ("c", "d")]


def test_4_hosts_one_slow_is_named_bad_against_a_known_good_partner():
    c = Cluster(4, slow=(2,))
    done, verdict = c.run()
    assert c.rounds == [[("pf0", "pf1"), ("pf2", "pf3")], [("pf0", "pf2"), ("pf1", "pf3")]]
    assert [p.result for p in done] == ["pass", "slow", "slow", "pass"]
    assert states(verdict) == {"good": ["pf0", "pf1", "pf3"], "bad": ["pf2"]}
    assert verdict["pf2"][1] == "slow with known-good pf0: busbw 1.1 MB/s vs median 310 MB/s"


def test_3_hosts_one_broken_a_later_pass_clears_the_partner_it_failed_with():
    c = Cluster(3, broken=(1,))
    _, verdict = c.run()
    assert c.rounds == [[("pf0", "pf1")], [("pf2", "pf0")]]  # the untested host first, with a failed one
    assert states(verdict) == {"good": ["pf0", "pf2"], "bad": ["pf1"]}
    assert verdict["pf1"][1] == "fails with known-good pf0: pf0: nccl FAIL: rank 2 did not answer: pf1 reset the connection; pf1: nccl FAIL: rank 0 did not answer: pf1 reset the connection"


def test_5_hosts_a_broken_and_a_slow_one_each_with_its_own_cause():
    c = Cluster(5, broken=(1,), slow=(4,))
    _, verdict = c.run()
    assert c.rounds == [[("pf0", "pf1"), ("pf2", "pf3")], [("pf2", "pf0"), ("pf3", "pf1")], [("pf0", "pf4")]]
    assert states(verdict) == {"good": ["pf0", "pf2", "pf3"], "bad": ["pf1", "pf4"]}
    assert verdict["pf1"][1].startswith("fails with known-good pf3: pf3: nccl FAIL: rank 2 did not answer: pf1 reset the connection")
    assert verdict["pf4"][1].startswith("slow with known-good pf0: busbw 1.1 MB/s vs median ")


def test_8_hosts_two_broken_in_two_rounds():
    c = Cluster(8, broken=(3, 6))
    _, verdict = c.run()
    assert len(c.rounds) == 2
    assert states(verdict) == {"good": ["pf0", "pf1", "pf2", "pf4", "pf5", "pf7"], "bad": ["pf3", "pf6"]}


def test_8_hosts_all_failing_blames_the_fabric_and_stops_within_8_rounds():
    c = Cluster(8, broken=tuple(range(8)))
    done, verdict = c.run()
    assert 2 <= len(c.rounds) <= 8 and all(p.result == "fail" for p in done)
    assert states(verdict) == {"undetermined": [f"pf{i}" for i in range(8)]}
    why = verdict["pf0"][1]
    assert why.startswith("fails with pf1; fails with pf2") and "no pair passed, so no host is known-good" in why
    assert "suspect what every host shares (the network, the rendezvous port, the software)" in why


def test_2_hosts_that_fail_together_are_both_undetermined():
    c = Cluster(2, broken=(0,))
    _, verdict = c.run()
    assert c.rounds == [[("pf0", "pf1")]]
    assert verdict["pf1"] == ("undetermined", "fails with pf0; " + pairwise.FABRIC)


def test_a_healthy_cluster_is_one_round():
    c = Cluster(6)
    _, verdict = c.run()
    assert len(c.rounds) == 1 and states(verdict) == {"good": [f"pf{i}" for i in range(6)]}


def test_too_few_known_good_hosts_the_rest_wait_or_meet_each_other():
    # pf0+pf1 pass; pf2..pf7 failed in pairs; two good partners for six suspects
    done = [Pair(1, "pf0", "pf1", "pass", FAST)] + [Pair(1, f"pf{i}", f"pf{i + 1}", "fail", cause="x") for i in (2, 4, 6)]
    names = [f"pf{i}" for i in range(8)]
    assert pairwise.plan(names, done) == [("pf0", "pf2"), ("pf1", "pf3"), ("pf4", "pf6"), ("pf5", "pf7")]


# ---- running pairs: real processes through a fake exec template ----------------------


@pytest.fixture
def node(tmp_path, monkeypatch):
    """Install `fake-node` on PATH; returns a function that sets each host's behaviour."""
    log = tmp_path / "calls.jsonl"

    def setup(**behaviour: dict) -> Path:
        d = fakes.pairwise_node(tmp_path / "bin", behaviour, log)
        monkeypatch.setenv("PATH", f"{d}{os.pathsep}{os.environ['PATH']}")
        return d

    setup.log = log  # type: ignore[attr-defined]
    return setup


def hosts_file(tmp_path: Path, n: int) -> Path:
    return write(tmp_path / "hosts", "".join(f"pf{i} 10.0.0.{i + 1}\n" for i in range(n)))


def left_running(d: Path) -> str:
    return subprocess.run(["pgrep", "-af", str(d)], capture_output=True, text=True).stdout.strip()


def run_main(tmp_path: Path, n: int, timeout: float = 30, json_out: bool = False, **kw) -> tuple[int, str]:
    out = io.StringIO()
    args = {"hosts": hosts_file(tmp_path, n), "exec_template": "fake-node {host}", "preflight_cmd": "preflight", "profile": "cpu",
            "port": 29611, "timeout": timeout, "tolerance": 0.5, "json_out": json_out, "console": Console(stream=out)} | kw
    return pairwise.main(**args), out.getvalue()


def test_a_slow_host_is_named_with_its_figures_and_the_json_says_the_same(tmp_path, node, capsys):
    node(pf0={"report": report(FAST)}, pf1={"report": report(FAST * 1.02)}, pf2={"report": report(SLOW)}, pf3={"report": report(FAST * 0.98)})
    code, said = run_main(tmp_path, 4, json_out=True)
    assert code == 1, said
    assert "bad: pf2 (slow with known-good pf0: busbw 1.1 MB/s vs median 310 MB/s)" in said
    assert "round 1: pair, result, busbw, latency p50, cause" in said
    assert "  pf2 + pf3  SLOW    1.1 MB/s   260.0 us  slow: busbw 1.1 MB/s vs median " in said
    assert said.rstrip().endswith("preflight: pairwise FAIL: 3 good, 1 bad, 0 undetermined of 4 hosts in 2 round(s), exit 1")
    data = json.loads(capsys.readouterr().out)
    assert data["bad"] == ["pf2"] and data["good"] == ["pf0", "pf1", "pf3"] and data["exit_code"] == 1
    assert data["nodes"]["pf2"] == {"state": "bad", "why": "slow with known-good pf0: busbw 1.1 MB/s vs median 310 MB/s"}
    assert [(p["round"], p["a"], p["b"], p["result"]) for p in data["pairs"]] == [
        (1, "pf0", "pf1", "pass"), (1, "pf2", "pf3", "slow"), (2, "pf0", "pf2", "slow"), (2, "pf1", "pf3", "pass")]
    calls = [json.loads(line) for line in node.log.read_text().splitlines()]
    assert sorted(calls)[0] == ["pf0", "timeout", "-k", "5", "20", "preflight", "run", "--profile", "cpu", "--nnodes", "2", "--node-rank", "0",
                                "--rdzv-endpoint", "10.0.0.1:29611", "--rdzv-id", "preflight-pair-1-0-1", "--rdzv-timeout", "10",
                                "--only", "nccl,bandwidth", "--scratch", "--json"]
    last = [c for c in calls if c[0] == "pf2"][-1]  # round 2, with known-good pf0 hosting the rendezvous
    assert [last[last.index(flag) + 1] for flag in ("--node-rank", "--rdzv-endpoint", "--rdzv-id")] == ["1", "10.0.0.1:29611", "preflight-pair-2-0-2"]


def test_all_good_is_exit_0(tmp_path, node):
    node(**{f"pf{i}": {"report": report(FAST)} for i in range(3)})
    code, said = run_main(tmp_path, 3)
    assert code == 0, said
    assert said.rstrip().endswith("pairwise PASS: 3 good, 0 bad, 0 undetermined of 3 hosts in 2 round(s), exit 0")


def test_a_host_that_never_answers_is_killed_at_the_deadline_and_named(tmp_path, node):
    d = node(pf0={"report": report()}, pf1={"hang": True}, pf2={"report": report()}, pf3={"report": report()})
    started = time.monotonic()
    code, said = run_main(tmp_path, 4, timeout=2)
    took = time.monotonic() - started
    assert code == 1, said
    assert "bad: pf1 (fails with known-good pf3: pf1: no answer within 2 s; it last said: waiting for the rendezvous)" in said
    assert took < 2 * 2 + 5, took  # two rounds of 2 s; the hanging script dies at SIGTERM
    assert not left_running(d)


def test_a_host_that_ignores_sigterm_is_killed_3_s_later_with_its_child_and_a_banner_is_no_harm(tmp_path, node):
    d = node(pf0={"stubborn": True}, pf1={"report": report(), "banner": "Welcome to gpu01 {managed by ansible}"})
    launch = pairwise.Launch("fake-node {host}", "preflight", "cpu", 29500, 1.0)
    started = time.monotonic()
    [(a, b)] = pairwise.run_round(launch, 1, [(Host("pf0", "10.0.0.1"), Host("pf1", "10.0.0.2"))], {"pf0": 0, "pf1": 1})
    took = time.monotonic() - started
    assert 1 + pairwise.GRACE <= took < 1 + pairwise.GRACE + 5, took
    assert (a.killed_after, a.last) == (1.0, "waiting for the rendezvous")
    assert b.killed_after is None and b.code == 0 and b.report == report()  # past the login banner
    assert not left_running(d)


def test_a_host_that_exits_with_no_json_is_named_with_what_it_said(tmp_path, node):
    node(pf0={"report": report()}, pf1={"report": report()}, pf2={"report": report()},
         pf3={"say": "ssh: connect to host pf3 port 22: Connection refused", "exit": 255})
    code, said = run_main(tmp_path, 4)
    assert code == 1
    assert "bad: pf3 (fails with known-good pf1: pf3: exit 255, no JSON report; it last said: ssh: connect to host pf3 port 22: Connection refused)" in said


def test_a_command_that_cannot_start_is_a_failing_side():
    launch = pairwise.Launch("/nonexistent/fake-node {host}", "preflight", "cpu", 29500, 5.0)
    [(a, b)] = pairwise.run_round(launch, 1, [(Host("pf0", "10.0.0.1"), Host("pf1", "fd00::2"))], {"pf0": 0, "pf1": 1})
    assert a.code == 127 and a.last == "could not start /nonexistent/fake-node: No such file or directory"
    assert pairwise.judge_pair(1, a, b).cause.startswith("pf0: exit 127, no JSON report; it last said: could not start /nonexistent/fake-node: No such")
    assert "[fd00::2]:29500" in launch.argv(1, (Host("b", "fd00::2"), Host("a", "x")), (1, 0), 1)


def test_sigterm_stops_every_pair_in_flight_and_exits_143(tmp_path, node):
    d = node(pf0={"hang": True}, pf1={"hang": True}, pf2={"hang": True}, pf3={"hang": True})
    code = (f"import io, sys; from pathlib import Path; from preflight.gpuwork import pairwise; from preflight.outputs.exporters.console import Console\n"
            f"sys.exit(pairwise.main(Path({str(hosts_file(tmp_path, 4))!r}), 'fake-node {{host}}', 'preflight', 'cpu', 29500, 120, 0.5, False, Console()))")
    p = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, env={**clean_env(), "PATH": os.environ["PATH"]})
    try:
        deadline = time.monotonic() + 20
        while left_running(d).count("import time; time.sleep(600)") < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left_running(d).count("import time; time.sleep(600)") == 4
        started = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=15)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM, err
    assert "pairwise interrupted by signal 15: every run it started was stopped; no verdict" in err
    assert time.monotonic() - started < pairwise.GRACE + 3
    assert not left_running(d)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"tolerance": 0.0}, r"--tolerance 0: give a fraction in \(0, 1\]"),
        ({"tolerance": 1.5}, r"--tolerance 1.5: give a fraction in \(0, 1\]"),
        ({"tolerance": math.nan}, r"--tolerance nan: give a fraction"),
        ({"port": 0}, r"--port 0: give the rendezvous port, 1-65534"),
        ({"port": 65535}, r"--port 65535: give the rendezvous port, 1-65534 \(default 29500\); PORT and PORT\+1 must be open"),
        ({"timeout": 0.0}, r"--timeout 0: give the seconds a pair may take, above 0"),
        ({"timeout": -5.0}, r"--timeout -5: give the seconds"),
        ({"exec_template": "ssh {hostname}"}, r"--exec 'ssh \{hostname\}': KeyError 'hostname'; write \{host\} where the host name goes"),
        ({"exec_template": "ssh 'unclosed {host}"}, r"--exec .*: ValueError No closing quotation; write \{host\}"),
        ({"exec_template": "ssh node1"}, r"--exec 'ssh node1': no \{host\} in it, so every pair would run here"),
        ({"exec_template": "no-such-remote-shell {host}"}, r"--exec 'no-such-remote-shell \{host\}': no-such-remote-shell is not on PATH"),
        ({"preflight_cmd": "env X={0} preflight"}, r"--preflight 'env X=\{0\} preflight': IndexError"),
        ({"hosts": None, "env": {}}, r"no hosts: give --hosts FILE"),
    ],
)
def test_bad_options_are_usage_errors_before_anything_runs(tmp_path, node, change, words):
    node()
    with pytest.raises(UsageError, match=words):
        run_main(tmp_path, 2, **change)
    assert not node.log.exists()


# ---- a real session over network namespaces --------------------------------------------


def quick_profile(tmp_path: Path) -> Path:
    """The cpu profile at its smallest sizes, with floors and ceilings so loose that only
    the comparison between pairs can find a slow host: a site profile "cpu-pair"."""
    site = tmp_path / "profiles"
    site.mkdir()
    text = CPU_TOML.read_text().replace('name = "cpu"', 'name = "cpu-pair"')
    for old, new in (("large_bytes = 8388608", "large_bytes = 1048576"), ("copy_bytes = 67108864", "copy_bytes = 4194304"), ("collective_bytes = 8388608", "collective_bytes = 1048576"),
                     ("repeats = 7", "repeats = 5"), ("warmup = 2", "warmup = 1"), ("ranks = 2", "ranks = 1")):
        assert old in text
        text = text.replace(old, new)  # one gloo rank a host: the link between them is what is measured
    # four ranks on a small machine copy slowly: memcpy is this host's figure, not the network's
    for floor, value in (("allreduce_bus_bandwidth", "1e3"), ("allreduce_latency", "10.0"), ("memcpy_bandwidth", "1e6")):
        text, n = re.subn(rf"(\[floors\.(?:internode_)?{floor}\]\n(?:#.*\n)*)value = .*", rf"\g<1>value = {value}", text)
        assert n >= 1
    (site / "cpu-pair.toml").write_text(text + "\n[timeouts]\nnccl = 100\nbandwidth = 150\n")
    return site


@netns.needs_netns
def test_in_network_namespaces_a_rate_limited_host_is_named(tmp_path):
    site, tmp = quick_profile(tmp_path), tmp_path / "tmp"
    tmp.mkdir()
    net = netns.make(3)
    try:
        slow = net.hosts[2]
        net.limit(slow, "10mbit")
        hosts = write(tmp_path / "hosts", "".join(f"{h.ns} {h.addr}\n" for h in net.hosts))
        cmd = f"env PREFLIGHT_LOCK_FILE={tmp_path}/{{host}}.lock PREFLIGHT_PROFILES_DIR={site} TMPDIR={tmp} {sys.executable} -m preflight"
        out = io.StringIO()
        started = time.monotonic()
        code = pairwise.main(hosts, "ip netns exec {host}", cmd, "cpu-pair", 29500, 280, 0.5, False, Console(stream=out))
        said = out.getvalue()
        print(said, f"took {time.monotonic() - started:.1f} s")
        assert code == 1, said
        assert f"bad: {slow.ns} (slow with known-good pf" in said and "busbw " in said, said
        assert "0 undetermined of 3 hosts" in said and "2 good, 1 bad" in said, said
        for h in net.hosts:
            assert not netns.sh("ip", "netns", "pids", h.ns).stdout.strip(), f"processes left in {h.ns}"
        assert not workers_left(tmp_path)
    finally:
        for h in net.hosts:  # only what this test started lives in its namespaces
            for pid in netns.sh("ip", "netns", "pids", h.ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        net.cleanup()
