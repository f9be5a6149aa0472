"""What the meeting worker (checks/workers/meeting.py) makes of a post in the group's store,
which anyone who reaches node rank 0's PORT+1 with the group's id could have written."""

from __future__ import annotations

import importlib.util
import json
import sys

from preflight.gpuwork import launch

sys.path.insert(0, str(launch.WORKERS_DIR))  # the worker imports _rank from beside it, as torchrun runs it
_spec = importlib.util.spec_from_file_location("meeting_worker", launch.WORKERS_DIR / "meeting.py")
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def test_a_node_s_post_is_read_as_it_came():
    post = {"host": "n1", "addr": "10.0.0.2", "ok": True, "why": None}
    assert worker._post(json.dumps(post).encode()) == post
    assert worker._post(b"") == {}


def test_a_post_too_large_to_be_a_node_s_is_not_read_and_the_node_counts_as_out():
    huge = json.dumps({"ok": True, "why": "x" * worker.POST_LIMIT}).encode()
    assert worker._post(huge) == {"ok": False, "why": f"its post was {len(huge)} bytes, more than the {worker.POST_LIMIT} a node's post may be: not read"}


def test_a_post_that_is_no_json_object_counts_as_out():
    for raw in (b"[1, 2]", b"not json", b'"ok"', b"\xff\xfe", b"[" * 40000):
        assert worker._post(raw) == {"ok": False, "why": "its post was not a JSON object: not read"}
