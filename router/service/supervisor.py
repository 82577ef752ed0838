"""``cache-router serve --processes N``: N full router processes on one port, supervised here.

Each child is ``cache-router serve`` with the same options plus ``--processes 1 --reuse-port
--state-url URL``: it binds the port with ``SO_REUSEPORT``, so the kernel spreads new
connections over the children, and it shares bookings, load, sessions and membership with its
siblings (and with other machines' replicas on the same Redis) through
:mod:`router.fleet.state_sync`. Without ``--state-url`` this process starts a private
``redis-server`` on a unix socket in a temporary folder: the same mechanism as between
machines, tested once.

Supervision: a child that dies is started again (after a pause that grows while it keeps
dying young); a private ``redis-server`` that dies is restarted too (the children route on
their own view meanwhile). SIGTERM or SIGINT here sends SIGTERM to every child, which drains
its requests (``shutdown_timeout_s``), then stops Redis; the exit status is 0. Children run in
their own session, so a terminal's Ctrl-C reaches them once, through here, and they get
SIGTERM if this process dies (Linux ``PR_SET_PDEATHSIG``).

Each child also listens on a private unix socket in this process's run folder, so a scrape of
``/metrics`` that reaches any one of them answers for all (:mod:`router.service.process_metrics`).
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from router.config import Settings

log = logging.getLogger("cache_router.supervisor")

POLL_S = 0.2
YOUNG_S = 5.0  # a child dying younger than this is restarted after a growing pause
MAX_PAUSE_S = 10.0
REDIS_START_S = 10.0


class SetupError(RuntimeError):
    """Nothing was started: the message says what to change."""


def check(settings: Settings) -> None:
    """Refuse what cannot work with several processes, before anything starts."""
    if settings.port == 0:
        raise SetupError("--processes needs a fixed --port (0 would give each its own port)")
    if settings.kv_events and not settings.kv_events_connect:
        raise SetupError(
            "--processes with --kv-events needs --kv-events-connect (the workers bind their "
            "publishers, every process connects); only one process could bind the port"
        )
    _probe_port(settings.host, settings.port)


def _probe_port(host: str, port: int) -> None:
    """SetupError when the port is held by something that does not share it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SetupError(f"cannot bind {host}:{port}: {exc.strerror}") from None


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on ``host:port`` that other processes may bind too (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def unix_socket(path: Path, backlog: int) -> socket.socket:
    """A listening unix socket at ``path`` (a stale one from a dead process is replaced)."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    path.chmod(0o600)
    sock.listen(backlog)
    return sock


class PrivateRedis:
    """A ``redis-server`` of our own on a unix socket (no TCP port, no persistence), in
    ``folder`` (default: a temporary one, removed on stop). Restartable."""

    def __init__(self, folder: Path | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SetupError(
                "--processes without --state-url starts a private redis-server, and none is "
                "on PATH: install it (Debian/Ubuntu: apt-get install redis-server; or Valkey's "
                "valkey-server as redis-server), or pass --state-url redis://HOST:PORT"
            )
        self.binary = binary
        self.own_folder = folder is None
        self.folder = folder or Path(tempfile.mkdtemp(prefix="cache-router-redis-"))
        self.socket = self.folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port", "0",
                "--unixsocket", str(self.socket),
                "--unixsocketperm", "700",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.folder),
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # a supervisor killed hard leaves no redis behind
        )  # fmt: skip
        deadline = time.monotonic() + REDIS_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SetupError(f"redis-server exited with status {self.proc.returncode}")
            if self.ping():
                log.info("private redis-server (pid %d) on %s", self.proc.pid, self.socket)
                return
            time.sleep(0.02)
        self.stop()
        raise SetupError(f"redis-server did not answer on {self.socket} within 10 s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ping(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(0.5)
                s.connect(str(self.socket))
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            end_process(proc, 5.0)
        if self.own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def end_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout``: only this process, by its PID."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Child:
    """One router process slot: its command, its process, how young it keeps dying."""

    def __init__(self, index: int, command: list[str]) -> None:
        self.index = index
        self.command = command
        self.proc: subprocess.Popen | None = None
        self.started = 0.0
        self.fast_deaths = 0
        self.restart_at = 0.0

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command, start_new_session=True, preexec_fn=_die_with_parent
        )
        self.started = time.monotonic()
        log.info("router process %d started (pid %d)", self.index, self.proc.pid)


def child_command(argv: Sequence[str], state_url: str, process_socket: Path) -> list[str]:
    """The children's command line: ours, with the flags that make a child (last flag wins)."""
    return [
        sys.executable, "-m", "router.cli", *argv,
        "--processes", "1", "--reuse-port", "--state-url", state_url,
        "--process-socket", str(process_socket),
    ]  # fmt: skip


def run_processes(settings: Settings, argv: Sequence[str]) -> int:
    """Start ``settings.process_count()`` routers on one port and supervise them until a
    signal; return the exit status."""
    count = settings.process_count()
    check(settings)
    folder = Path(tempfile.mkdtemp(prefix="cache-router-"))  # private sockets, mode 700
    (folder / "processes").mkdir()
    redis = None
    state_url = settings.state_url
    if state_url is None:
        try:
            redis = PrivateRedis(folder)
            redis.start()
        except SetupError:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        state_url = redis.url
    children = [
        Child(i, child_command(argv, state_url, folder / "processes" / f"{i}.sock"))
        for i in range(count)
    ]
    stopping = False

    def stop(sig: int, frame: object) -> None:
        nonlocal stopping
        if not stopping:
            log.warning("signal %d: draining %d router process(es)", sig, count)
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for child in children:
            child.start()
        log.info("%d router processes on %s:%d", count, settings.host, settings.port)
        while not stopping:
            time.sleep(POLL_S)
            if redis is not None and not redis.alive() and not stopping:
                log.warning("private redis-server died: starting it again")
                try:
                    redis.start()
                except SetupError as exc:
                    log.error("%s", exc)
            for child in children:
                _tend(child)
    finally:
        for child in children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + settings.shutdown_timeout_s + 10
        for child in children:
            if child.proc is not None:
                _end_by(child.proc, deadline)
        if redis is not None:
            redis.stop()
        shutil.rmtree(folder, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _tend(child: Child) -> None:
    """Restart a dead child (at once, or after a pause if it keeps dying young)."""
    proc = child.proc
    now = time.monotonic()
    if proc is not None and proc.poll() is None:
        if now - child.started > YOUNG_S:
            child.fast_deaths = 0
        return
    if proc is not None:  # just found dead
        child.proc = None
        child.fast_deaths = child.fast_deaths + 1 if now - child.started < YOUNG_S else 0
        pause = min(MAX_PAUSE_S, 0.5 * (2 ** (child.fast_deaths - 1))) if child.fast_deaths else 0
        child.restart_at = now + pause
        log.warning(
            "router process %d (pid %d) exited with %s: restarting%s",
            child.index,
            proc.pid,
            proc.returncode,
            f" in {pause:g} s" if pause else "",
        )
    if now >= child.restart_at:
        child.start()


def _end_by(proc: subprocess.Popen, deadline: float) -> None:
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        log.warning("router process %d did not drain in time: killing it", proc.pid)
        proc.kill()
        proc.wait(5)


def main_processes(settings: Settings, argv: Sequence[str]) -> int:
    """``serve --processes N`` from the command line: clear errors, exit status."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
    )
    try:
        return run_processes(settings, argv)
    except SetupError as exc:
        print(f"cache-router serve: {exc}", file=sys.stderr)
        return 2
