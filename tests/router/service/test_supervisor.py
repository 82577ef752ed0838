"""``serve --processes N`` (router/service/supervisor.py): real child processes on one port with a
private redis-server; a killed child is restarted; SIGTERM drains all and exits 0; setups
that cannot work are refused with a clear message before anything starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))

from prometheus_client.parser import text_string_to_metric_families
from scale_support import need, pids_behind

from router.config import load_settings
from traces.live.fleet import HOST, Service, free_port, start_service


def serve_cmd(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "router.cli", "serve", "--host", HOST, "--port", str(port),
            "--log-level", "warning", *extra]  # fmt: skip


def two_processes(fake_workers) -> Service:
    """``serve --processes 2`` in front of one fake worker."""
    need("redis-server")
    (worker,) = fake_workers(1)
    port = free_port()
    return start_service(
        "processes",
        ["serve", "--host", HOST, "--port", str(port), "--worker", worker.url,
         "--processes", "2", "--log-level", "warning"],
        port,
    )  # fmt: skip


def test_children_share_the_port_restart_when_killed_and_drain_on_sigterm(fake_workers):
    service = two_processes(fake_workers)
    try:
        first = pids_behind(service.url, 2)
        assert len(first) == 2 and service.process.pid not in first
        health = httpx.get(service.url + "/health", timeout=5).json()
        assert health["state_sync"]["up"] and health["state_sync"]["peers"] == 1
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 20
        now: set[int] = set()
        while time.monotonic() < deadline:
            now = pids_behind(service.url, 2, timeout=5)
            if len(now) == 2 and victim not in now:
                break
        assert len(now) == 2 and victim not in now and (now & first)
        body = {"model": "fake-model", "prompt": "hello", "max_tokens": 2}
        for _ in range(6):  # every child serves
            with httpx.Client(timeout=10) as client:
                assert client.post(service.url + "/v1/completions", json=body).status_code == 200
        service.process.send_signal(signal.SIGTERM)
        assert service.process.wait(30) == 0
        for pid in now:  # the children are gone too
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        service.stop()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--processes", "2", "--port", "0"], "fixed --port"),
        (["--processes", "2", "--kv-events"], "--kv-events-connect"),
        (["--processes", "0"], "processes"),
    ],
)
def test_setups_that_cannot_work_are_refused(extra, message):
    cmd = serve_cmd(free_port(), "--worker", "http://127.0.0.1:9", *extra)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr


def test_without_redis_server_the_error_names_the_package(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no redis-server on this PATH
    cmd = serve_cmd(free_port(), "--worker", "http://127.0.0.1:9", "--processes", "2")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert "apt-get install redis-server" in done.stderr and "--state-url" in done.stderr


def test_processes_auto_is_the_usable_cores():
    settings = load_settings(processes="auto")
    assert 1 <= settings.process_count() <= len(os.sched_getaffinity(0))
    assert load_settings(processes=3).process_count() == 3


def test_metrics_answer_for_every_process_whichever_one_a_scrape_reaches(fake_workers):
    """Each scrape reaches one child (SO_REUSEPORT) and holds every child's samples, labelled
    by process: the requests counted add up to those sent, on every scrape."""
    service = two_processes(fake_workers)
    try:
        assert len(pids_behind(service.url, 2)) == 2
        body = {"model": "fake-model", "prompt": "hello", "max_tokens": 2}
        for _ in range(10):
            with httpx.Client(timeout=10) as client:  # new connections: both children serve
                assert client.post(service.url + "/v1/completions", json=body).status_code == 200
        for _ in range(6):
            with httpx.Client(timeout=10) as client:
                text = client.get(service.url + "/metrics").text
            requests = {}
            processes = None
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "cache_router_requests_total":
                        key = s.labels["process"]
                        requests[key] = requests.get(key, 0) + s.value
                    elif s.name == "cache_router_metrics_processes":
                        processes = s.value
            assert processes == 2
            assert sum(requests.values()) == 10 and set(requests) <= {"0", "1"}
        own = httpx.get(service.url + "/metrics?scope=process", timeout=10).text
        assert "process=" not in own and "cache_router_requests_total" in own
    finally:
        service.stop()


def test_a_supervisor_killed_hard_leaves_no_private_redis(tmp_path):
    """SIGKILL gives the supervisor no chance to stop its redis-server: the kernel does
    (PR_SET_PDEATHSIG), as for the router children."""
    need("redis-server")
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from router.service.supervisor import PrivateRedis\n"
        "redis = PrivateRedis(Path(sys.argv[1]))\n"
        "redis.start()\n"
        "print(redis.proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        redis_pid = int(parent.stdout.readline())
        os.kill(redis_pid, 0)  # running
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(redis_pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(redis_pid, signal.SIGKILL)  # (ours: started by this test's child)
        pytest.fail("the private redis-server outlived its supervisor")
    finally:
        if parent.poll() is None:
            parent.kill()
