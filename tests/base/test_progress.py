"""What the live line and the log's stage lines say: pure functions of what the
ranks wrote, and the Progress the runner and the launcher share with the console."""

import json
import os
import sys
import time

from preflight.gpuwork import launch
from preflight.base.progress import Progress, RateLimit, line, stage_of


# --- the line ------------------------------------------------------------------


def test_the_line_names_the_check_its_stage_and_the_time_it_has_run():
    assert line("bandwidth", "all_reduce 1 GiB  8 ranks", 12.44) == "bandwidth  all_reduce 1 GiB  8 ranks  12.4 s"


def test_a_check_without_a_worker_shows_its_name_and_time():
    assert line("shm", None, 0.31) == "shm  0.3 s"


def test_a_stage_is_one_line_whatever_it_holds():
    assert line("plugin", "two\nlines\rand\ttabs", 1.0) == "plugin  two lines and tabs  1.0 s"


def test_a_narrow_terminal_cuts_the_stage_never_the_name_or_the_clock():
    text = line("bandwidth", "p2p 256 MiB to cuda:7  rank 3/8", 12.4, width=36)
    assert len(text) <= 36 and text.startswith("bandwidth  p2p") and text.endswith("...  12.4 s")
    assert line("bandwidth", "all_reduce", 1.0, width=16) == "bandwidth  1.0 s"  # no room for a useful stage
    assert len(line("bandwidth", "all_reduce", 1.0, width=8)) == 8


# --- the log's rate ------------------------------------------------------------


def test_the_log_gets_the_first_stage_at_once_then_at_most_one_change_per_interval():
    limit = RateLimit(every=5.0)
    assert limit.take(None, 100.0)  # "  ... bandwidth"
    assert not limit.take("importing torch", 101.0)  # changed, but too soon
    assert limit.take("importing torch", 105.0)  # the change, once the interval has passed
    assert not limit.take("importing torch", 120.0)  # no change: nothing, however long
    assert limit.take("memcpy", 121.0)  # a change long after the last line: at once
    assert not limit.take("all_gather", 122.0)
    assert limit.take("all_reduce", 126.0)  # the stage of the moment; all_gather came and went


def test_a_stage_that_came_back_before_the_interval_is_not_a_change():
    limit = RateLimit(every=5.0)
    limit.take("all_reduce", 0.0)
    assert not limit.take("latency", 2.0)
    assert not limit.take("all_reduce", 6.0)


def test_the_interval_is_a_few_seconds():
    assert 2.0 <= RateLimit().every <= 10.0


# --- from the ranks' reports to words -------------------------------------------


def rank(r, stage, world=2, **kw):
    return {"rank": r, "local_rank": r, "world_size": world, "stage": stage, "error": None, **kw}


def test_before_any_rank_writes_the_ranks_are_starting():
    assert stage_of([None, None], 2) == "starting 2 ranks"
    assert stage_of([None], None) == "starting"


def test_ranks_in_step_show_the_step_its_size_and_how_many_ranks():
    reports = [rank(r, "all_reduce", world=8, doing={"bytes": 1 << 30}) for r in range(8)]
    assert stage_of(reports, 8) == "all_reduce 1 GiB  8 ranks"
    assert stage_of([rank(0, "import"), rank(1, "import")], 2) == "importing torch  2 ranks"


def test_a_rank_measuring_alone_is_named():
    reports = [rank(0, "memcpy"), rank(1, "memcpy", doing={"alone": True, "bytes": 64 << 20})]
    assert stage_of(reports, 2) == "memcpy 64 MiB  rank 1/2"
    p2p = [rank(r, "p2p", world=8) for r in range(8)]
    p2p[3]["doing"] = {"alone": True, "bytes": 256 << 20, "peer": 5}
    assert stage_of(p2p, 8) == "p2p 256 MiB to cuda:5  rank 3/8"


def test_the_one_process_measuring_every_gpu_pair_names_the_pair():
    # checks/workers/bandwidth.py: local rank 0 copies between every ordered pair of GPUs.
    p2p = [rank(r, "p2p", world=8) for r in range(8)]
    p2p[0]["doing"] = {"alone": True, "bytes": 256 << 20, "src": 3, "peer": 5}
    assert stage_of(p2p, 8) == "p2p 256 MiB cuda:3 to cuda:5  rank 0/8"


def test_ranks_a_moment_apart_show_what_most_do():
    reports = [rank(0, "all_gather", world=3), rank(1, "all_reduce", world=3), rank(2, "all_reduce", world=3)]
    assert stage_of(reports, 3) == "all_reduce  3 ranks"


def test_a_rank_that_failed_is_named_where_it_stopped():
    reports = [rank(0, "latency"), rank(1, "latency", error="TimeoutError: ...")]
    assert stage_of(reports, 2) == "latency  rank 1/2 failed"


def test_across_nodes_the_rank_and_size_are_the_groups():
    reports = [rank(8 + r, "all_reduce", world=16) for r in range(8)]
    assert stage_of(reports, 8) == "all_reduce  16 ranks"
    reports[2]["doing"] = {"alone": True}
    assert stage_of(reports, 8) == "all_reduce  rank 10/16"


def test_a_second_reading_says_it_confirms():
    reports = [rank(r, "all_reduce", reading=2) for r in range(2)]
    assert stage_of(reports, 2) == "all_reduce  2 ranks  measuring again to confirm"


def test_the_cuda_init_worker_is_one_process_probing_each_device():
    assert stage_of([{"stage": "devices", "current": 3, "device_count": 8, "error": None}], None) == "testing CUDA device 3 of 8"
    assert stage_of([{"stage": "load", "error": None}], None) == "copying to every GPU"
    assert stage_of([{"stage": "init", "error": "RuntimeError: CUDA unknown error"}], None) == "initialising CUDA failed"


def test_a_damaged_report_reads_as_not_written_yet():
    assert stage_of(["not a report", None], 2) == "starting 2 ranks"
    assert stage_of([rank(0, "init"), {"stage": None, "doing": "odd", "rank": "x"}], 2) == "starting the process group  2 ranks"


def test_the_stages_every_worker_shares_are_in_words():
    assert [stage_of([rank(0, s), rank(1, s)], 2) for s in ("import", "init", "build", "done")] == [
        "importing torch  2 ranks", "starting the process group  2 ranks", "building the model  2 ranks", "finishing  2 ranks",
    ]  # fmt: skip


# --- Progress --------------------------------------------------------------------


def test_progress_is_the_running_checks_and_nothing_between_checks():
    ended = []
    p = Progress(on_end=lambda: ended.append(True))
    assert p.now() == (None, None, 0.0)
    p.begin("shm")
    check, stage, elapsed = p.now()
    assert (check, stage) == ("shm", None) and 0 <= elapsed < 1
    p.stage("creating a segment")
    assert p.now()[1] == "creating a segment"
    p.end()
    assert p.now() == (None, None, 0.0) and ended == [True]


def test_a_followed_worker_gives_the_stage_until_it_is_let_go():
    p = Progress()
    p.begin("nccl")
    p.stage("before the worker")

    def worker():
        return "all_reduce  2 ranks"

    p.follow(worker)
    assert p.now()[1] == "all_reduce  2 ranks"
    p.unfollow(lambda: "another source")  # not the one followed: nothing changes
    assert p.now()[1] == "all_reduce  2 ranks"
    p.unfollow(worker)
    assert p.now()[1] == "before the worker"


def test_a_source_that_breaks_keeps_the_last_stage():
    p = Progress()
    p.begin("nccl")
    p.stage("waiting")
    p.follow(lambda: 1 / 0)
    assert p.now()[1] == "waiting"


def test_a_new_check_starts_with_no_stage_of_the_last():
    p = Progress()
    p.begin("nccl")
    p.follow(lambda: "all_reduce")
    p.begin("bandwidth")
    assert p.now()[:2] == ("bandwidth", None)


# --- a real worker, followed -------------------------------------------------------


def test_a_started_worker_shows_its_stages_while_it_runs_and_is_let_go(tmp_path):
    """cuda_init under this (CPU-only) torch: it imports torch, then stops at CUDA's init."""
    p = Progress()
    p.begin("cuda")
    seen = []
    running = launch.start(sys.executable, launch.Worker("cuda_init.py"), 60, p)
    try:
        while running.alive():
            seen.append(p.now()[1])
            time.sleep(0.02)
        assert "importing torch" in seen
        assert running.stage() == "initialising CUDA failed"  # its last word, read once it ended

        # Watching costs a stat: a report is parsed again only once the worker rewrote it.
        parsed = running._seen[0][1]
        assert running.stage() == "initialising CUDA failed" and running._seen[0][1] is parsed
        (tmp_path / "r.json").write_text(json.dumps({**parsed, "stage": "load", "error": None}))
        os.replace(tmp_path / "r.json", running.out_dir / "rank0.json")  # as the worker rewrites it
        assert running.stage() == "copying to every GPU"
    finally:
        running.wait()
    assert p.now()[1] is None  # let go: the stage is no longer the worker's
