"""A real dnsmasq for the discovery tests (tests/router/fleet/test_discovery*.py), on 127.0.0.1.

It skips without dnsmasq, unless ``CACHE_ROUTER_DNS=1`` (set by CI), where it fails.
dnsmasq re-reads ``--addn-hosts`` on SIGHUP but not the ``srv-host=`` lines of its config
file, so an SRV change restarts it (same port).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import pytest

from router.service.supervisor import end_process


def need_dnsmasq() -> str:
    """The path of dnsmasq; skip (or fail under ``CACHE_ROUTER_DNS=1``) without it."""
    # /usr/sbin is not on a non-root user's PATH on Debian
    path = shutil.which("dnsmasq", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"]))
    if path is None:
        message = "dnsmasq is not installed (apt-get install dnsmasq)"
        if os.environ.get("CACHE_ROUTER_DNS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def free_udp_tcp_port() -> int:
    """A port free for both UDP and TCP on 127.0.0.1 (dnsmasq answers on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port = udp.getsockname()[1]
            with socket.socket() as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise RuntimeError("no free port")


class Dnsmasq:
    """A dnsmasq in the foreground, authoritative for ``.test``: names from a hosts file
    (changed with :meth:`set_hosts`, a SIGHUP) and SRV records from its config file."""

    def __init__(self, folder: Path) -> None:
        self.binary = need_dnsmasq()
        self.folder = folder
        self.port = free_udp_tcp_port()
        self.hosts = folder / "hosts"
        self.conf = folder / "dnsmasq.conf"
        self.log = folder / "dnsmasq.log"
        self.hosts.write_text("")
        self.conf.write_text("")
        self.process: subprocess.Popen | None = None

    @property
    def nameserver(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Dnsmasq:
        args = [
            self.binary,
            "--no-daemon",  # foreground, one process (TCP too), keeps our uid: reads tmp_path
            f"--port={self.port}",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--no-resolv",  # no upstream: a name outside .test is REFUSED
            "--no-hosts",
            "--local=/test/",  # .test answered from our files only: unknown → NXDOMAIN
            f"--addn-hosts={self.hosts}",
            f"--conf-file={self.conf}",  # instead of /etc/dnsmasq.conf
            "--pid-file=",
            "--log-facility=-",
        ]
        with self.log.open("a") as out:
            self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 5
        probe = dns.message.make_query("probe.test", "A")
        while True:  # ready once it answers (NXDOMAIN)
            if self.process.poll() is not None:
                raise RuntimeError(f"dnsmasq exited: {self.log.read_text()}")
            try:
                dns.query.udp(probe, "127.0.0.1", port=self.port, timeout=0.1)
                return self
            except (dns.exception.Timeout, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"dnsmasq did not answer: {self.log.read_text()}") from None

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            end_process(process, 5.0)

    def restart(self) -> None:
        self.stop()
        self.start()

    def set_hosts(self, *lines: str) -> None:
        """Replace the A/AAAA records (``ADDRESS NAME`` lines): dnsmasq re-reads on SIGHUP."""
        self.hosts.write_text("".join(line + "\n" for line in lines))
        if self.process is not None:
            self.process.send_signal(signal.SIGHUP)

    def set_srv(self, *records: tuple[str, str, int]) -> None:
        """Replace the SRV records (name, target, port); takes effect at the next start."""
        self.conf.write_text("".join(f"srv-host={n},{t},{p}\n" for n, t, p in records))
