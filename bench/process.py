"""Servers under test as child processes on 127.0.0.1: a free port, start, wait until ready, stop."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_list(text: str) -> set[int]:
    """CPUs as taskset and /proc/cpuinfo number them: "0-3,8" -> {0, 1, 2, 3, 8}."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


class Server:
    def __init__(self, command: list[str], port: int, cpus: set[int] | None = None, cwd: Path | None = None) -> None:
        """cpus: the only CPUs the server's threads may run on (all of them where None); cwd: where it starts."""
        self.port = port
        env = {**os.environ, "INFINITY_ALLOW_FAILED_PARITY": "true", "INFINITY_ALLOW_CPU_MISMATCH": "true"}
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        preexec_fn=pin, cwd=cwd)

    def wait_ready(self, seconds: float = 120, path: str = "/health/ready") -> None:
        import urllib.request
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server on port {self.port} exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"server on port {self.port} not ready after {seconds}s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
