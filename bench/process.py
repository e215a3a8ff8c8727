"""Servers as child processes on 127.0.0.1, for every benchmark and test: a free port, the command (`infinity serve`
by default), its log, its CPUs, readiness, its memory, stop."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

HOST = "127.0.0.1"
WAIT = 120.0  # a hang guard, never a performance expectation
# a benchmark serves whatever it is given: a tiny or random model's failed parity, another host's target
BENCH_ENV = {"INFINITY_ALLOW_FAILED_PARITY": "true", "INFINITY_ALLOW_CPU_MISMATCH": "true"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def cpu_list(text: str) -> set[int]:
    """CPUs as taskset and /proc/cpuinfo number them: "0-3,8" -> {0, 1, 2, 3, 8}."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (the peak since the process started), in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def serve_command(artifact: Path | str, *flags: str, port: int) -> list[str]:
    return [sys.executable, "-m", "infinity", "serve", str(artifact), "--port", str(port), *flags]


class Server:
    """One child process serving on `port`. `log`: its stdout and stderr (else discarded); `env`: its whole
    environment (else this one's with BENCH_ENV); `cpus`: the only CPUs its threads may run on; `cwd`: where it
    starts; `preexec_fn`: run in the child first (e.g. to lower its open-file limit)."""

    def __init__(self, command: list[str], port: int, cpus: set[int] | None = None, cwd: Path | None = None,
                 log: Path | None = None, env: Mapping[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        self.port, self.log = port, log
        environ = dict(env) if env is not None else {**os.environ, **BENCH_ENV}

        def setup() -> None:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)
            if preexec_fn is not None:
                preexec_fn()

        with open(log if log is not None else os.devnull, "wb") as out:  # the child keeps its own copy
            self.process = subprocess.Popen(command, env=environ, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                            preexec_fn=setup if cpus is not None or preexec_fn else None)

    @classmethod
    def infinity(cls, artifact: Path | str, *flags: str, port: int | None = None, cpus: set[int] | None = None,
                 cwd: Path | None = None, log: Path | None = None, env: Mapping[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> Server:
        """`python -m infinity serve ARTIFACT --port PORT FLAGS...`, on a free port unless given one."""
        port = port or free_port()
        return cls(serve_command(artifact, *flags, port=port), port, cpus, cwd, log, env, preexec_fn)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def logged(self) -> str:
        return self.log.read_text(errors="replace") if self.log is not None else ""

    def wait_ready(self, seconds: float = WAIT, path: str = "/health/ready") -> None:
        """Until `path` answers 200; the process exiting first, or the time running out, is an error that
        carries the end of its log."""
        deadline = time.monotonic() + seconds
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server on port {self.port} exited with {self.process.returncode}: "
                                   f"{self.logged()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:  # not listening yet, or an HTTPError: not ready yet
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server on port {self.port} was not ready after {seconds:.0f} s: "
                                   f"{self.logged()[-4000:]}")
            time.sleep(0.2)

    def memory(self) -> dict[str, float]:
        return memory_mib(self.pid)

    def stop(self, grace: float = 30) -> int:
        """SIGTERM (the server drains), SIGKILL after `grace` seconds; its exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                return self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def kill(self) -> int:
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait()
