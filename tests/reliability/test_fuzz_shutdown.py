"""Shutdown fuzzed: a real ``cache-router serve`` process with flow control per case, a
seeded random sequence of requests (random priorities, junk and huge ones too, flows, SLO
headers, streams, prompt sizes, worker behaviours that make some requests queue, some wait
at a worker that has not answered, some stream), clients leaving and workers removed, and
SIGTERM (by PID) at a random point of it; then, whatever was drawn:

- every request sent before the SIGTERM whose client stayed got exactly one answer: 200
  (a stream: whole, or ended by an error event and ``[DONE]``), or 429 / 503 with an
  OpenAI-style JSON error and ``Retry-After``; one sent after it was either not taken
  (refused, or closed with no byte) or answered the same way;
- the process exits 0 within ``--shutdown-timeout-s`` and a few seconds, logs no
  traceback, and says ``drained: 0 request(s) in flight, 0 booked on workers``;
- the workers end with nothing in flight (the router left no upstream request behind).

The SIGTERM, and each client's leaving, waits until every request sent has entered flow
control (its counters say so: queued + dispatched + rejected), so the router holds each of
them then: a request still in the kernel's accept queue at SIGTERM is not taken, which
would make the verdict depend on timing. Requests sent after the SIGTERM race the closing
of the listening socket on purpose, and either outcome is right.

The fake workers are shared by the cases (a router start-up is the cost of a case); one
case by default, fifteen with ``CACHE_ROUTER_SLOW=1``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from fake_worker import FakeWorker
from flow_support import flow_prompt

SLOW = os.environ.get("CACHE_ROUTER_SLOW") == "1"
CASES = 15 if SLOW else 1
ADMIN = "fuzz-shutdown-admin"
MODEL = "fake-model"
EXIT_MARGIN_S = 5.0  # past --shutdown-timeout-s: the cut's grace (1 s), lifespan, exit
READ_TIMEOUT_S = 30.0  # a client's bound on its answer (any answer comes far sooner)
DRAINED = "drained: 0 request(s) in flight, 0 booked on workers"
FLOW_FLAGS = ("--flow-control", "--cost-profile", "flat", "--prefill-tokens-per-s", "500",
              "--flow-target-ttft-s", "2.5",
              "--no-correct-shadow")  # fmt: skip

PRIORITIES = ["0", "1", "-1", "3", "-3", "1000000000000", "-1000000000000", "", "abc", "1e3",
              " 7 ", "99999999999999999999999", "-0", "+2"]  # fmt: skip
SLOS = ["50", "2000", "0", "-5", "nan", "x"]
BEHAVIOURS = {
    "quick": {},
    "slow": {"x-fake-delay": "1.0"},  # answers during a long drain, or is cut at a short one
    "slower": {"x-fake-delay": "3.0"},  # not started when any drain ends
    "hang": {"x-fake-hang": "1"},  # never answers
    "long": {"x-fake-chunks": "40", "x-fake-chunk-delay": "0.1"},  # a stream under way
}


@dataclass(frozen=True)
class Send:
    path: str
    stream: bool
    headers: dict[str, str]
    size: int  # prompt: 0 a few tokens, 1 ~1,000 tokens, 4 ~4,000 tokens
    tag: str

    def request(self) -> bytes:
        text = flow_prompt(self.tag) * self.size if self.size else f"hello {self.tag}"
        body: dict = {"model": MODEL, "max_tokens": 2, "stream": self.stream}
        if self.path == "/v1/chat/completions":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        data = json.dumps(body).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        return (
            f"POST {self.path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n{head}\r\n"
        ).encode() + data


@dataclass
class Case:
    seed: int
    shutdown_timeout_s: float
    flags: list[str]
    actions: list[tuple[str, object]]
    term_at: int  # SIGTERM before this action


def draw(seed: int) -> Case:
    """One case, from ``seed`` alone."""
    rng = random.Random(seed)
    actions: list[tuple[str, object]] = []
    for i in range(rng.randint(8, 30)):
        roll = rng.random()
        if roll < 0.7:
            headers = dict(BEHAVIOURS[rng.choice(list(BEHAVIOURS))])
            if rng.random() < 0.7:
                headers["x-priority"] = rng.choice(PRIORITIES)
            if rng.random() < 0.7:
                flow = rng.choice(["a", "b", "c", "".join(rng.choices("xyz!#.~09", k=6))])
                headers["x-llm-d-inference-fairness-id"] = flow
            if rng.random() < 0.3:
                headers["x-llm-d-slo-ttft-ms"] = rng.choice(SLOS)
            path = rng.choice(["/v1/completions", "/v1/chat/completions"])
            size = rng.choice([0, 1, 1, 1, 4])
            actions.append(("send", Send(path, rng.random() < 0.4, headers, size, f"{seed}-{i}")))
        elif roll < 0.82:
            actions.append(("leave", rng.randrange(1000)))
        elif roll < 0.85:
            actions.append(("remove", rng.randrange(2)))
        else:
            actions.append(("pause", rng.choice([0.0, 0.05, 0.2, 0.5])))
    shutdown_timeout_s = rng.choice([0.5, 1.0, 2.0])
    flags = [*FLOW_FLAGS, "--flow-queue-max", str(rng.choice([2, 5, 100])),
             "--flow-queue-ttl-s", str(rng.choice([0.3, 2.0, 30.0]))]  # fmt: skip
    # the SIGTERM mostly late: most requests are held by then, a few race the close
    term_at = rng.randint(len(actions) // 3, len(actions))
    return Case(seed, shutdown_timeout_s, flags, actions, term_at)


# ---- the router process ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(case: Case, workers: list[FakeWorker], log: Path) -> tuple[subprocess.Popen, int]:
    """``cache-router serve`` for ``case`` over ``workers``, its output in ``log`` (a pipe
    nobody reads until the end could fill up and stall it)."""
    port = free_port()
    command = [sys.executable, "-m", "router.cli", "serve", "--port", str(port),
               "--shutdown-timeout-s", str(case.shutdown_timeout_s), "--log-level", "info",
               "--health-interval-s", "0.5", *case.flags]  # fmt: skip
    for worker in workers:
        command += ["--worker", worker.url]
    env = {**os.environ, "CACHE_ROUTER_ADMIN_KEY": ADMIN}
    with log.open("wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT), port


def wait_ready(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the router did not start: " + log.read_text()[-2000:]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("the router did not start in 30 s: " + log.read_text()[-2000:])


class Routers:
    """Each case's router process, started one case ahead: its start-up (seconds of
    imports) is most of a case's time, and overlaps the case before it this way."""

    def __init__(self, workers: list[FakeWorker], folder: Path) -> None:
        self.workers = workers
        self.folder = folder
        self.started: dict[int, tuple[subprocess.Popen, int, Path]] = {}

    def _start(self, seed: int) -> None:
        if seed < CASES and seed not in self.started:
            log = self.folder / f"router-{seed}.log"
            self.started[seed] = (*spawn(draw(seed), self.workers, log), log)

    def take(self, seed: int) -> tuple[subprocess.Popen, int, Path]:
        """Case ``seed``'s router, ready; the next case's starts then (not before: two
        start-ups at once would only share the CPU)."""
        self._start(seed)
        proc, port, log = self.started.pop(seed)
        wait_ready(proc, port, log)
        self._start(seed + 1)
        return proc, port, log

    def close(self) -> None:
        """Stop the routers started ahead for cases that did not run."""
        for proc, _, _ in self.started.values():
            proc.kill()
            proc.wait(5)
        self.started.clear()


def entered(port: int) -> int:
    """Requests that entered flow control so far: queued, dispatched or rejected (each
    ends once in dispatched or rejected)."""
    flow = httpx.get(
        f"http://127.0.0.1:{port}/workers/flow",
        headers={"authorization": f"Bearer {ADMIN}"},
        timeout=5,
    ).json()

    def total(table) -> int:
        return sum(total(v) for v in table.values()) if isinstance(table, dict) else table

    return flow["queued"] + total(flow["dispatched"]) + total(flow["rejected"])


async def all_entered(port: int, sent: int) -> None:
    """Wait (bounded) until the router holds each of the ``sent`` requests."""
    deadline = time.monotonic() + 10
    while (n := await asyncio.to_thread(entered, port)) < sent:
        assert time.monotonic() < deadline, f"{n} of {sent} requests entered flow control"
        await asyncio.sleep(0.02)
    assert n == sent, (n, sent)


# ---- the clients -------------------------------------------------------------------------------


@dataclass
class Client:
    send: Send
    after_term: bool
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task | None = None
    received: bytes = b""
    refused: bool = False  # the connection was refused (only after the SIGTERM)
    left: bool = False
    errors: list[str] = field(default_factory=list)


async def open_client(port: int, send: Send, after_term: bool) -> Client:
    """Send ``send`` whole on its own connection; a task reads the answer to its end."""
    client = Client(send, after_term)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(send.request())
        await writer.drain()
    except OSError:
        assert after_term, "the router refused a connection before the SIGTERM"
        client.refused = True
        return client
    client.writer = writer
    client.task = asyncio.create_task(read_all(reader, client))
    return client


async def read_all(reader: asyncio.StreamReader, client: Client) -> None:
    try:
        async with asyncio.timeout(READ_TIMEOUT_S):
            while data := await reader.read(65536):
                client.received += data
    except ConnectionError as exc:  # reset: what came before it is judged
        client.errors.append(repr(exc))
    except TimeoutError:
        client.errors.append(f"no end of the answer in {READ_TIMEOUT_S} s")


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def parse(raw: bytes) -> Answer:
    """Exactly one HTTP/1.1 answer in ``raw``, its body whole (by length or chunks), and
    nothing after it."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    assert sep, f"no whole head: {raw[:300]!r}"
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), lines[0]
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size_line, sep, rest = rest.partition(b"\r\n")
            assert sep, f"chunked body cut: {raw[-300:]!r}"
            size = int(size_line, 16)
            if size == 0:
                assert rest == b"\r\n", f"after the last chunk: {rest[:300]!r}"
                return Answer(status, headers, body)
            assert rest[size : size + 2] == b"\r\n", f"chunk cut: {raw[-300:]!r}"
            body, rest = body + rest[:size], rest[size + 2 :]
    length = int(headers["content-length"])
    assert len(rest) == length, f"body of {len(rest)} bytes, said {length}: {raw[-300:]!r}"
    return Answer(status, headers, rest)


def check_error(error: dict) -> str:
    assert isinstance(error["message"], str) and isinstance(error["type"], str), error
    assert isinstance(error["code"], str), error
    return error["code"]


def judge(client: Client) -> str:
    """What ``client`` got, as a label for the tally; fails on anything not allowed."""
    if client.left:
        return "left"
    if client.after_term and (client.refused or not client.received):
        return "not taken"
    assert not client.refused and client.received, f"no answer: {client.errors}"
    answer = parse(client.received)
    if answer.status in (429, 503):
        assert answer.headers["content-type"].startswith("application/json"), answer.headers
        assert int(answer.headers["retry-after"]) >= 1, answer.headers
        return f"{answer.status} {check_error(json.loads(answer.body)['error'])}"
    assert answer.status == 200, (answer.status, answer.body[:300])
    if not client.send.stream:
        assert json.loads(answer.body)["choices"], answer.body[:300]
        return "200"
    assert answer.headers["content-type"].startswith("text/event-stream"), answer.headers
    events = [e for e in answer.body.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in events), answer.body[-300:]
    assert events and events[-1] == b"data: [DONE]", answer.body[-300:]
    data = [json.loads(e[6:]) for e in events[:-1]]
    errors = [d for d in data if "error" in d]
    assert not errors or (len(errors) == 1 and errors[0] is data[-1]), answer.body[-300:]
    if errors:
        return f"200 stream ended by {check_error(errors[0]['error'])}"
    assert all("choices" in d for d in data), answer.body[-300:]
    return "200 stream"


# ---- one case ----------------------------------------------------------------------------------


async def play(case: Case, proc: subprocess.Popen, port: int, workers) -> tuple[list, float]:
    """Play ``case``'s actions with the SIGTERM at its point; returns the clients and the
    SIGTERM's time."""
    clients: list[Client] = []
    confirmed = 0  # requests known to have entered flow control
    term_time = 0.0
    admin = {"authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
        for i, (kind, arg) in enumerate([*case.actions, ("end", None)]):
            if i == case.term_at:
                await all_entered(port, len(clients))
                proc.send_signal(signal.SIGTERM)
                term_time = time.monotonic()
            after = i >= case.term_at
            if kind == "send":
                clients.append(await open_client(port, arg, after))
            elif kind == "leave" and clients:
                if not after and confirmed < len(clients):
                    await all_entered(port, len(clients))
                    confirmed = len(clients)
                client = clients[arg % len(clients)]
                client.left = True
                if client.writer is not None:
                    client.writer.close()
                    client.task.cancel()
            elif kind == "remove" and not after:
                r = await http.request("DELETE", "/workers", json={"url": workers[arg].url},
                                       headers=admin)  # fmt: skip
                assert r.status_code in (200, 404), r.text  # 404: removed already
            elif kind == "pause":
                await asyncio.sleep(arg)
    await asyncio.gather(*(c.task for c in clients if c.task), return_exceptions=True)
    for client in clients:
        if client.writer is not None:
            client.writer.close()
    return clients, term_time


@pytest.fixture(scope="module")
def workers():
    """Two fake workers for every case (quick by default; a request's headers slow it)."""
    made = [FakeWorker(f"w{i}", delay=0.05, chunks=4, chunk_delay=0.05).start() for i in range(2)]
    yield made
    for worker in made:
        worker.close()


@pytest.fixture(scope="module")
def routers(workers, tmp_path_factory):
    made = Routers(workers, tmp_path_factory.mktemp("routers"))
    yield made
    made.close()


def idle(workers: list[FakeWorker], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while sum(w.in_flight for w in workers) and time.monotonic() < deadline:
        time.sleep(0.02)
    return sum(w.in_flight for w in workers) == 0


@pytest.mark.parametrize("seed", range(CASES))
async def test_fuzzed_shutdown_answers_each_request_once_and_exits_clean(
    workers, routers, seed
) -> None:
    case = draw(seed)
    assert idle(workers), "a case before this one left work at the fake workers"
    proc, port, log = routers.take(seed)
    try:
        clients, term_time = await play(case, proc, port, workers)
        try:
            code = await asyncio.to_thread(proc.wait, case.shutdown_timeout_s + EXIT_MARGIN_S)
        except subprocess.TimeoutExpired:
            tail = log.read_text()[-2000:]
            raise AssertionError(f"seed {seed}: no exit in time: {tail}") from None
        took = time.monotonic() - term_time
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    out = log.read_text(errors="replace")
    tally: dict[str, int] = {}
    for n, client in enumerate(clients):
        try:
            label = judge(client)
        except (AssertionError, KeyError, ValueError) as exc:
            raise AssertionError(f"seed {seed}, request {n} {client.send}: {exc!r}") from exc
        label = ("after SIGTERM: " if client.after_term else "") + label
        tally[label] = tally.get(label, 0) + 1
    assert code == 0, (seed, out[-2000:])
    assert took < case.shutdown_timeout_s + EXIT_MARGIN_S, (seed, took)
    assert "Traceback" not in out and "Exception in ASGI application" not in out, out[-3000:]
    assert DRAINED in out, (seed, out[-2000:])
    assert await asyncio.to_thread(idle, workers), (seed, [w.in_flight for w in workers])
    print(f"seed {seed}: {len(clients)} requests, exit {took:.1f} s after SIGTERM: {tally}")
