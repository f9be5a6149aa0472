"""`preflight serve` as a real process on loopback: what a scrape, a person
and a load balancer's health probe get, and how it refuses bad input."""

from __future__ import annotations

import email
from collections.abc import Callable
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fakes
from conftest import clean_env, report_file, run_record_file
from preflight.outputs.html import page
from preflight.outputs.exporters import serve, serve_loop
from preflight.gpuwork.launch import free_port

promtool = pytest.mark.skipif(not shutil.which("promtool"), reason="promtool is not installed (Debian package prometheus)")


def get(url: str, timeout: float = 10) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


@contextmanager
def serving(report: Path, *extra: str, env: dict[str, str] | None = None):
    port = free_port()
    proc = subprocess.Popen([*fakes.PREFLIGHT, "serve", "--listen", f"127.0.0.1:{port}", "--report", str(report), *extra],
                            env=env or clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                get(base + "/healthz", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"serve did not come up: {proc.communicate()[1]}") from None
                time.sleep(0.1)
        yield base, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(fam: dict[str, list], name: str, **labels: str) -> float:
    (s,) = [s for s in fam[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return s.value


@promtool
def test_metrics_of_a_fresh_pass_are_lint_clean_and_say_this_boot(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass", age=42)
    with serving(report) as (base, _):
        code, ctype, text = get(base + "/metrics")
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout == "" and lint.stderr == "", lint.stdout + lint.stderr
    fam = families(text)
    assert value(fam, "preflight_run_passed") == 1 and value(fam, "preflight_report_current_boot") == 1
    assert value(fam, "preflight_vouched") == 1
    assert 42 <= value(fam, "preflight_report_age_seconds") < 100
    assert value(fam, "preflight_report_state", state="ok") == 1
    assert value(fam, "preflight_check_passed", check="bandwidth") == 1
    assert value(fam, "process_resident_memory_bytes") > 0  # serve's own health


def test_a_pass_before_the_last_reboot_is_marked_stale(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass", boot="0d9a1c5e-boot-before-the-last-reboot")
    with serving(report) as (base, _):
        fam = families(get(base + "/metrics")[2])
    assert value(fam, "preflight_run_passed") == 1  # what the report says...
    assert value(fam, "preflight_report_current_boot") == 0  # ...and that it says it about an earlier boot
    assert value(fam, "preflight_vouched") == 0  # so it vouches for nothing now


@pytest.mark.parametrize("content", [None, "{\"verdict\": \"pa", ""], ids=["missing", "truncated", "empty"])
def test_without_a_usable_report_metrics_still_answer_but_never_say_passed(tmp_path, content):
    report = tmp_path / "report.json"
    if content is not None:
        report.write_text(content)
    with serving(report) as (base, _):
        code, _, text = get(base + "/metrics")
        report_code, _, body = get(base + "/report")
        health = get(base + "/healthz")
    fam = families(text)
    state = "missing" if content is None else "invalid"
    assert code == 200 and value(fam, "preflight_report_state", state=state) == 1
    assert "preflight_run_passed" not in fam and "preflight_check_passed" not in fam and value(fam, "preflight_vouched") == 0
    assert report_code == 503 and json.loads(body)["state"] == state
    assert health[0] == 200 and health[2].startswith(f"ok; report {state}")


@promtool
def test_a_report_that_is_json_but_damaged_is_invalid_and_metrics_still_answer(tmp_path):
    # Each parses as JSON; each would have broken /metrics (or, with millions of
    # nodes, serve's memory) before the report's group and labels were typed.
    group = {"nnodes": 2, "node_rank": 0, "endpoint": "gpu-01:29500", "rdzv_id": "j", "passed": True, "nodes": [{"node_rank": 0, "ok": True}], "missing": [1]}
    damaged = {
        "group without its size": {k: v for k, v in group.items() if k != "nnodes"},
        "size in words": {**group, "nnodes": "two"},
        "node rank past the group": {**group, "nodes": [{"node_rank": 5, "ok": True}]},
        "ten million nodes": {**group, "nnodes": 10**7},
    }
    report = report_file(tmp_path / "report.json", "cpu-pass")
    with serving(report) as (base, _):
        for what, g in damaged.items():
            report_file(tmp_path / "next.json", "cpu-pass", group=g).replace(report)
            code, _, text = get(base + "/metrics")
            fam = families(text)
            assert code == 200 and value(fam, "preflight_report_state", state="invalid") == 1, what
            assert "preflight_run_passed" not in fam and value(fam, "preflight_vouched") == 0, what
            assert len(text) < 20_000, what
            lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
            assert lint.returncode == 0 and lint.stdout == "", what
            assert "group" in json.loads(get(base + "/report")[2])["error"], what
        report_file(tmp_path / "next.json", "cpu-pass", group=group).replace(report)
        fam = families(get(base + "/metrics")[2])
    assert value(fam, "preflight_report_state", state="ok") == 1 and value(fam, "preflight_group_nodes") == 2
    assert value(fam, "preflight_group_node_passed", node_rank="1") == 0  # never came


def test_a_report_that_parsed_but_cannot_be_rendered_is_invalid_not_a_dropped_scrape(tmp_path, capfd):
    # Built around the model, as a future or broken writer might: exposition itself raises.
    from preflight.outputs.record.last_report import load

    loaded = load(report_file(tmp_path / "report.json", "cpu-pass"))
    shm = loaded.report.checks[0]
    shm.measurements[0] = shm.measurements[0].model_construct(name="shm_size", unit="bytes", value="lots", labels={}, floor=None, ceiling=None)
    server = serve.Server(("127.0.0.1", 0), tmp_path / "report.json")
    try:
        server.load = lambda: loaded
        fam = families(server.metrics().decode())
    finally:
        server.server_close()
    assert value(fam, "preflight_report_state", state="invalid") == 1 and value(fam, "preflight_vouched") == 0
    assert "preflight_run_passed" not in fam and value(fam, "process_resident_memory_bytes") > 0
    assert "cannot render" in capfd.readouterr().err


def test_a_report_is_rendered_once_and_the_clock_at_each_scrape(tmp_path, monkeypatch):
    """A scrape of an unchanged report renders nothing of it again (a big report took
    milliseconds each time); its age and the standing still move with every scrape."""
    from preflight.outputs.exporters import metrics

    renders = {"metrics": 0, "page": 0}
    real_metrics, real_page = metrics.render_report, page.render

    def counted(name, real):
        def call(*args, **kwargs):
            renders[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(metrics, "render_report", counted("metrics", real_metrics))
    monkeypatch.setattr(page, "render", counted("page", real_page))
    report = report_file(tmp_path / "report.json", "cpu-pass", age=600)
    server = serve.Server(("127.0.0.1", 0), report)
    loads = []
    load = server.load
    server.load = lambda: loads.append(1) or load()
    try:
        ages = []
        for _ in range(5):
            fam = families(server.metrics().decode())
            ages.append(value(fam, "preflight_report_age_seconds"))
            assert value(fam, "preflight_run_passed") == 1 and value(fam, "preflight_vouched") == 1
            assert server.page(server.load())[0] == 200
            time.sleep(0.01)
        assert renders == {"metrics": 1, "page": 1} and ages == sorted(ages) and ages[-1] > ages[0]
        assert len(loads) == 10  # one read of the report per scrape and per page: both of the same report
        report_file(tmp_path / "new.json", "shm-64m-fail").replace(report)  # the next run's report
        fam = families(server.metrics().decode())
        code, body = server.page(server.load())
        assert value(fam, "preflight_run_passed") == 0 and b'data-verdict="fail"' in body
        assert renders == {"metrics": 2, "page": 2}
        time.sleep(1.1)  # a FAIL's standing counts seconds; its page never shows it, so it is not drawn again
        server.metrics()
        assert server.page(server.load())[0] == 200 and renders == {"metrics": 2, "page": 2}
    finally:
        server.server_close()


def test_each_scrape_reads_the_report_written_since(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass")
    with serving(report) as (base, _):
        assert value(families(get(base + "/metrics")[2]), "preflight_run_passed") == 1
        new = report_file(tmp_path / "new.json", "shm-64m-fail")
        new.replace(report)  # as `preflight run --report` replaces it: rename
        fam = families(get(base + "/metrics")[2])
        assert value(fam, "preflight_run_passed") == 0 and value(fam, "preflight_check_status", check="shm", status="fail") == 1
        report.unlink()
        fam = families(get(base + "/metrics")[2])
        assert "preflight_run_passed" not in fam and value(fam, "preflight_report_state", state="missing") == 1


def test_report_serves_the_json_as_written(tmp_path):
    report = report_file(tmp_path / "report.json", "shm-64m-fail")
    with serving(report) as (base, _):
        code, ctype, body = get(base + "/report")
        missing = get(base + "/nothing-here")
    assert code == 200 and ctype == "application/json"
    assert json.loads(body) == json.loads(report.read_text())
    assert missing[0] == 404 and "/metrics" in missing[2]


def test_slash_is_the_report_page_and_follows_the_file(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass")
    with serving(report) as (base, _):
        code, ctype, text = get(base + "/")
        assert code == 200 and ctype == "text/html; charset=utf-8"
        assert 'data-verdict="pass"' in text and "Content-Security-Policy" in text
        report_file(report, "shm-64m-fail")  # the next run's verdict, written while serve runs
        code, _, text = get(base + "/")
    assert code == 200 and 'data-verdict="fail"' in text and "64 MiB" in text


def test_every_answer_carries_the_pages_policy_and_nosniff_and_names_no_version(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass")
    with serving(report) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        answers = []
        for path in ("/", "/metrics", "/report", "/healthz", "/nowhere"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            answers.append((path, r.status, r.headers))
            conn.close()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:  # http.server's own error page
            raw.sendall(b"BREW / HTTP/1.0\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head and (chunk := raw.recv(4096)):
                head += chunk
        error = email.message_from_bytes(head.split(b"\r\n", 1)[1])
        answers.append(("BREW /", int(head.split()[1]), error))
    assert [(p, code) for p, code, _ in answers] == [("/", 200), ("/metrics", 200), ("/report", 200), ("/healthz", 200), ("/nowhere", 404), ("BREW /", 501)]
    for path, _, headers in answers:
        assert headers["Content-Security-Policy"] == page.POLICY, path
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Server"] == "preflight", path  # no "Python/3.x", no library version


def test_a_run_that_died_after_the_report_is_not_vouched_on_the_page_or_in_the_metrics(tmp_path):
    from datetime import datetime, timedelta, timezone

    from preflight.outputs.record.last_report import utc

    report = report_file(tmp_path / "report.json", "cpu-pass", age=600)
    started = datetime.now(timezone.utc) - timedelta(seconds=60)
    with serving(report) as (base, _):
        run_record_file(report, started, alive=True)  # this test's own process: a run under way
        fam = families(get(base + "/metrics")[2])
        assert value(fam, "preflight_vouched") == 1 and 'class="banner pass"' in get(base + "/")[2]
        run_record_file(report, started, alive=False)  # a process that is gone, its report never written
        fam = families(get(base + "/metrics")[2])
        code, _, page = get(base + "/")
    assert value(fam, "preflight_vouched") == 0 and value(fam, "preflight_run_passed") == 1  # the report passed; it vouches for nothing now
    assert code == 200 and '<header class="banner unvouched" data-verdict="pass"><h1>NOT VOUCHED: ' in page
    assert f"not vouched now: a run started at {utc(started)} did not finish" in page


def test_slash_without_a_report_says_why_in_a_page(tmp_path):
    with serving(tmp_path / "none.json") as (base, _):
        code, ctype, text = get(base + "/")
    assert code == 503 and ctype.startswith("text/html") and "No report to show (missing)" in text


def test_sigterm_stops_serve_cleanly(tmp_path):
    with serving(tmp_path / "report.json") as (_, proc):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_sigterm_in_the_middle_of_scrapes_is_still_a_clean_stop(tmp_path):
    # Found in CI: a SIGTERM that landed while the main thread handed a request to
    # a worker ended in "internal error", exit 3, instead of a clean stop.
    import threading

    report = report_file(tmp_path / "report.json", "cpu-pass")
    for round_ in range(10):
        with serving(report) as (base, proc):
            stop, cut_off = threading.Event(), []

            def scrape() -> None:
                while not stop.is_set():
                    try:
                        get(base + "/healthz", timeout=2)
                    except OSError:
                        pass  # refused once serve has stopped listening
                    except Exception as e:  # an answer cut in half by the stop
                        cut_off.append(repr(e))

            clients = [threading.Thread(target=scrape) for _ in range(4)]
            for c in clients:
                c.start()
            time.sleep(0.1 + 0.02 * round_)  # a different moment of the hand-off each round
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=10)
            finally:
                stop.set()
                for c in clients:
                    c.join()
            err = proc.stderr.read()
            assert code == 0 and "internal error" not in err, err
            assert not cut_off


def test_a_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = subprocess.run([*fakes.PREFLIGHT, "serve", "--listen", f"127.0.0.1:{port}", "--report", str(tmp_path / "r.json")],
                           env=clean_env(), capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert f"port {port} is in use" in line and "choose another port" in line


@pytest.mark.parametrize(
    ("listen", "words"),
    [("9842", "give ADDRESS:PORT"), ("127.0.0.1:99999", "port from 1 to 65535"), (":9842", "name the address"),
     ("localhost:9842", "is not an IP address"), ("192.0.2.1:9842", "is not an address of this node")],
)
def test_a_bad_listen_address_is_refused_in_one_line(tmp_path, listen, words):
    p = subprocess.run([*fakes.PREFLIGHT, "serve", "--listen", listen, "--report", str(tmp_path / "r.json")],
                       env=clean_env(), capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and words in p.stderr


def answers(port: int, otherwise: str) -> None:
    """Waits until serve's /healthz answers on 127.0.0.1:``port`` (its start), else fails saying ``otherwise``."""
    for _ in range(300):
        try:
            assert get(f"http://127.0.0.1:{port}/healthz", timeout=1)[0] == 200
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(otherwise)


def test_listen_comes_from_the_environment_as_the_unit_sets_it(tmp_path):
    port = free_port()
    env = {**clean_env(), "PREFLIGHT_LISTEN": f"127.0.0.1:{port}"}
    proc = subprocess.Popen([*fakes.PREFLIGHT, "serve", "--report", str(tmp_path / "r.json")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        answers(port, "serve did not listen where PREFLIGHT_LISTEN said")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.communicate()[1]


needs_activate = pytest.mark.skipif(not shutil.which("systemd-socket-activate"), reason="systemd-socket-activate is not installed (Debian package systemd)")


@needs_activate
def test_serve_answers_on_the_socket_systemd_passes_and_binds_none_of_its_own(tmp_path):
    # As preflight-exporter.socket hands it over: systemd holds the port from boot, so no other
    # user can take it first. The setting `listen` (here PREFLIGHT_LISTEN) is a serve started by hand's.
    port, other = free_port(), free_port()
    env = {**clean_env(), "PREFLIGHT_LISTEN": f"127.0.0.1:{other}"}
    proc = subprocess.Popen(["systemd-socket-activate", "-l", f"127.0.0.1:{port}", *fakes.PREFLIGHT, "serve", "--report", str(tmp_path / "r.json")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        answers(port, "serve did not answer on the socket systemd passed")
        with pytest.raises(OSError):
            get(f"http://127.0.0.1:{other}/healthz", timeout=1)
        listening = [c for c in psutil.Process(proc.pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
        assert [(c.laddr.ip, c.laddr.port) for c in listening] == [("127.0.0.1", port)]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
    err = proc.stderr.read()
    assert code == 0, err
    assert f"serving {tmp_path / 'r.json'} at http://127.0.0.1:{port}/ on the socket systemd passed (its ListenStream=; `listen` applies to a serve started by hand)" in err


@needs_activate
def test_a_socket_unit_with_two_addresses_is_refused_in_one_line(tmp_path):
    a, b = free_port(), free_port()
    proc = subprocess.Popen(["systemd-socket-activate", "-l", f"127.0.0.1:{a}", "-l", f"127.0.0.1:{b}", *fakes.PREFLIGHT, "serve",
                             "--report", str(tmp_path / "r.json")], env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        # systemd-socket-activate starts the program at the first connection, as a socket unit does.
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", a), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = [line for line in err.splitlines() if line.startswith("preflight")]  # beside systemd-socket-activate's own lines
    assert proc.returncode == 2 and len(said) == 1, err
    assert "preflight: error: serve: systemd passed 2 sockets (LISTEN_FDS); the socket unit must listen on one address: one ListenStream=" in err


def test_the_socket_systemd_passed_is_not_passed_on(monkeypatch):
    # sd_listen_fds clears the variables: a child must not take descriptor 3 for its own.
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    monkeypatch.setenv("LISTEN_FDS", "2")
    monkeypatch.setenv("LISTEN_FDNAMES", "a:b")
    with pytest.raises(serve.UsageError):
        serve.passed_socket()
    assert not {"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} & set(os.environ)
    monkeypatch.setenv("LISTEN_PID", "1")  # another process's: none passed to this one
    assert serve.passed_socket() is None


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line")


def test_silent_connections_cost_no_thread_and_never_hold_up_a_scrape(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass")
    with serving(report) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        # More than serve keeps waiting: the oldest are dropped, nothing grows.
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(serve_loop.MAX_WAITING + 44)]
        try:
            time.sleep(0.5)
            assert threads_of(proc.pid) <= serve_loop.WORKERS + 2
            started = time.monotonic()
            code, _, text = get(base + "/metrics", timeout=60)
            waited = time.monotonic() - started
            fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        finally:
            for s in idle:
                s.close()
    assert code == 200 and "preflight_run_passed 1.0" in text
    assert waited < serve_loop.CLIENT_TIMEOUT  # answered at once, not after the silent ones time out
    assert fds < serve_loop.MAX_WAITING + 32


def big_report(path: Path, size: int = 12 << 20) -> Path:
    """A report bigger than any send buffer (a many-GPU node's traceback or figures can be: MAX_BYTES is 16 MiB)."""
    report_file(path, "cpu-pass")
    data = json.loads(path.read_text())
    data["checks"][0]["details"]["padding"] = "x" * size
    path.write_text(json.dumps(data))
    return path


def test_clients_that_never_read_a_big_answer_hold_no_worker_and_never_hold_up_a_scrape(tmp_path):
    # Each asks for /report and never reads: an answer past the kernel's send buffer used to be
    # written by the worker, which then waited CLIENT_TIMEOUT for the client; WORKERS of them
    # stopped every scrape that long, again and again.
    report = big_report(tmp_path / "report.json")
    with serving(report) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        stuck = []
        for _ in range(2 * serve_loop.WORKERS):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # reads nothing, and lets little in
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /report HTTP/1.0\r\n\r\n")
            stuck.append(s)
        try:
            time.sleep(0.5)
            started = time.monotonic()
            code, _, text = get(base + "/metrics", timeout=60)
            waited = time.monotonic() - started
            threads = threads_of(proc.pid)
        finally:
            for s in stuck:
                s.close()
    assert code == 200 and "preflight_run_passed 1.0" in text
    assert waited < 1.0, f"a scrape waited {waited:.1f} s behind clients that do not read"
    assert threads <= serve_loop.WORKERS + 2


def test_an_answer_a_client_never_reads_is_reset_not_left_in_the_kernel(tmp_path):
    """Was: at CLIENT_TIMEOUT the connection was shut down and closed, an orphan the kernel kept,
    with a 2 MiB send buffer of the answer, for as long as the client held its end: any local user
    could pin the node's TCP memory (shared with NCCL's sockets) past every cap in serve. Now an
    answer not taken in time is reset, and the kernel frees it."""
    report = big_report(tmp_path / "report.json")
    with serving(report) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # lets little in, and reads nothing for now
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /report HTTP/1.0\r\n\r\n")
            time.sleep(serve_loop.CLIENT_TIMEOUT + 3)
            s.settimeout(10)
            got, reset = bytearray(), False
            try:
                while chunk := s.recv(1 << 20):
                    got += chunk
            except ConnectionResetError:
                reset = True
    assert reset and len(got) < len(report.read_bytes()), f"{len(got)} bytes then {'a reset' if reset else 'the end'}"


def test_an_http_0_9_request_gets_no_body_without_the_headers(tmp_path):
    # HTTP/0.9 has no headers: the page's Content-Security-Policy and nosniff could not go with it.
    with serving(report_file(tmp_path / "report.json", "cpu-pass")) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /\r\n\r\n")
            got = bytearray()
            while chunk := s.recv(1 << 16):
                got += chunk
        assert bytes(got) == b"" and get(base + "/healthz")[0] == 200


def read_slowly(s: socket.socket, rate: float, stop_after: Callable[[], None] | None = None) -> tuple[bytes, BaseException | None]:
    """Read ``s`` to its end at about ``rate`` bytes a second; ``stop_after`` is called once, after the first read."""
    got, error = bytearray(), None
    s.settimeout(20)
    try:
        while chunk := s.recv(16 << 10):
            got += chunk
            if stop_after is not None:
                stop_after()
                stop_after = None
            time.sleep(len(chunk) / rate)
    except OSError as e:
        error = e
    return bytes(got), error


def test_a_slow_but_steady_reader_gets_the_whole_answer_past_the_client_timeout(tmp_path):
    # Was: the client had CLIENT_TIMEOUT from the hand-back to take the whole answer, and was reset
    # mid-answer past it however steadily it read.
    report = big_report(tmp_path / "report.json", 1 << 20)
    with serving(report) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # before connecting: the window stays small
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /report HTTP/1.0\r\n\r\n")
            got, error = read_slowly(s, (1 << 20) / (serve_loop.CLIENT_TIMEOUT + 2))
    assert error is None and got.partition(b"\r\n\r\n")[2] == report.read_bytes()


def test_a_stop_lets_an_answer_being_read_finish(tmp_path):
    # Was: a SIGTERM (a restart, an upgrade) reset every answer not yet acknowledged once all of it
    # was in the kernel: a scrape cut off by a restart reads as the exporter failing.
    report = big_report(tmp_path / "report.json", 2 << 20)
    with serving(report) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /report HTTP/1.0\r\n\r\n")
            got, error = read_slowly(s, 2 << 20, lambda: proc.send_signal(signal.SIGTERM))
        assert proc.wait(timeout=15) == 0
    assert error is None and got.partition(b"\r\n\r\n")[2] == report.read_bytes()


def test_a_big_answer_reaches_a_client_that_reads_it_slowly(tmp_path):
    report = big_report(tmp_path / "report.json")
    with serving(report) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /report HTTP/1.0\r\n\r\n")
            time.sleep(0.5)  # nothing read while serve goes on with other connections
            assert get(base + "/healthz")[0] == 200
            got = bytearray()
            while chunk := s.recv(1 << 20):
                got += chunk
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"Content-Length: %d" % len(body) in head
    assert body == report.read_bytes()


def test_parse_listen_accepts_ipv6_in_brackets():
    assert serve.parse_listen("[::1]:9842") == ("::1", 9842)
    assert serve.parse_listen("0.0.0.0:9842") == ("0.0.0.0", 9842)


def test_clients_that_trickle_their_request_hold_no_worker(tmp_path):
    report = report_file(tmp_path / "report.json", "cpu-pass")
    with serving(report) as (base, proc):
        port = int(base.rsplit(":", 1)[1])
        slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(3 * serve_loop.WORKERS)]
        for s in slow:
            s.sendall(b"G")  # then a byte now and then, never the end of the request
        started = time.monotonic()
        for _ in range(3):
            time.sleep(0.3)
            for s in slow:
                s.sendall(b"E")
        code, _, text = get(base + "/metrics", timeout=60)
        waited = time.monotonic() - started - 0.9
        threads = threads_of(proc.pid)
        # Each trickler is cut off CLIENT_TIMEOUT after it connected, in all.
        slow[0].settimeout(3 * serve_loop.CLIENT_TIMEOUT)
        cut = slow[0].recv(100) == b"" and time.monotonic() - started < 2 * serve_loop.CLIENT_TIMEOUT
        for s in slow:
            s.close()
    # Not held up by the tricklers: with them on workers it would wait their CLIENT_TIMEOUT at least.
    assert code == 200 and "preflight_run_passed 1.0" in text and waited < serve_loop.CLIENT_TIMEOUT
    assert threads <= serve_loop.WORKERS + 2 and cut


def test_a_full_waiting_list_under_a_burst_of_ready_requests_keeps_serving(tmp_path, monkeypatch):
    # A connection dropped to make room may be in the same select round as its own request: it must be skipped.
    import threading

    monkeypatch.setattr(serve_loop, "MAX_WAITING", 1)
    port = free_port()
    server = serve.bind(f"127.0.0.1:{port}", report_file(tmp_path / "report.json", "cpu-pass"))
    loop = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    loop.start()
    try:
        for _ in range(30):
            burst = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]
            for s in burst:
                s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            time.sleep(0.05)
            for s in burst:
                s.close()
            assert loop.is_alive()
        deadline = time.monotonic() + 10
        while True:  # the list drains in CLIENT_TIMEOUT at most
            try:
                assert get(f"http://127.0.0.1:{port}/healthz", timeout=2)[0] == 200
                break
            except OSError:
                assert time.monotonic() < deadline and loop.is_alive()
    finally:
        server.server_close()
