"""Replicas behind a real load balancer, on one machine: `infinity serve` processes on loopback ports behind HAProxy
(the distribution's package) with active health checks on /health/ready, clients sending traffic throughout, and

  rolling: each replica replaced in turn as a Deployment's rolling update does (a new one started on a spare port
           and admitted once ready, then the old one sent SIGTERM and left to drain);
  kill:    one replica sent SIGKILL mid-load.

Every answer is compared, byte for byte, with the one a replica gave alone before the load.

    python -m bench replicas <artifact> [--replicas 3] [--clients 4] [--settle 2]

HAProxy's configuration is `deploy/haproxy/haproxy.cfg`'s, with this run's ports."""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.process import Server, free_port
from bench.stats import percentile
from infinity.engine.hostinfo import cpu_name

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
TEXTS = ["The cat sat on the mat.", "Replicas come and go; answers stay the same.", "A rolling update loses nothing.",
         "Health checks keep traffic off a replica that is not ready."]
WAIT = 120.0


def post(port: int, text: str, timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/predict", json.dumps({"inputs": text}), {"content-type": "application/json"})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def until(condition: Callable[[], bool], what: str, seconds: float = WAIT) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {seconds:.0f} s")
        time.sleep(0.02)


class Replica:
    def __init__(self, artifact: Path, port: int, log: Path) -> None:
        self.port = port
        env = {**os.environ, "INFINITY_THREADS": "1", "INFINITY_SPIN_WAIT": "false"}
        self.process = Server.infinity(artifact, port=port, cwd=ROOT, env=env, log=log).process

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"the replica on port {self.port} exited with {self.process.returncode}")
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            connection.request("GET", "/health/ready")
            return connection.getresponse().status == 200
        except OSError:
            return False
        finally:
            connection.close()

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.process.send_signal(sig)
        return self.process.wait(timeout=WAIT)


class Proxy:
    """HAProxy with `slots` server lines, named s0, s1, ...; a slot with no replica is simply down."""

    def __init__(self, ports: list[int], work: Path) -> None:
        self.port = free_port()
        self.socket = work / "haproxy.sock"
        servers = "\n".join(f"    server s{i} 127.0.0.1:{port}" for i, port in enumerate(ports))
        text = CONFIG.read_text().replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")
        text = text.replace("/run/haproxy/admin.sock", str(self.socket))
        head, _, _ = text.partition("    # replicas")
        (work / "haproxy.cfg").write_text(head + servers + "\n")
        check = subprocess.run(["haproxy", "-c", "-f", str(work / "haproxy.cfg")], capture_output=True, text=True)
        if check.returncode:
            raise RuntimeError(f"haproxy -c: {check.stdout}{check.stderr}")
        self.process = subprocess.Popen(["haproxy", "-f", str(work / "haproxy.cfg")], stdout=subprocess.DEVNULL,
                                        stderr=open(work / "haproxy.log", "ab"))

    def stats(self) -> list[dict[str, str]]:
        """HAProxy's `show stat` rows of the backend and its slots, by column name."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(self.socket))
            sock.sendall(b"show stat\n")
            data = b"".join(iter(lambda: sock.recv(65536), b""))
        header, *lines = [line for line in data.decode().splitlines() if line]
        names = header.lstrip("# ").split(",")
        rows = [dict(zip(names, line.split(","))) for line in lines]
        return [row for row in rows if row["pxname"] == "replicas"]

    def status(self) -> dict[str, str]:
        """Each slot's state as HAProxy's health checks see it (UP, DOWN, ...)."""
        return {row["svname"]: row["status"].split()[0] for row in self.stats() if row["svname"].startswith("s")}

    def retries(self) -> dict[str, int]:
        """What the proxy did for the clients: requests retried and sent to another replica, and why (connection
        errors: a port closed or refused; response errors: a connection closed before its answer)."""
        rows = self.stats()
        backend = next(row for row in rows if row["svname"] == "BACKEND")
        servers = [row for row in rows if row["svname"].startswith("s")]
        return {"retried": int(backend["wretr"] or 0), "redispatched": int(backend["wredis"] or 0),
                "connection_errors": sum(int(row["econ"] or 0) for row in servers),
                "response_errors": sum(int(row["eresp"] or 0) for row in servers)}

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@dataclass
class Sent:
    began: float
    ms: float
    ok: bool
    served_by: str
    error: str = ""


@dataclass
class Load:
    port: int
    expected: dict[str, bytes]
    clients: int
    sent: list[Sent] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def client(self, index: int) -> None:
        n = index
        while not self.stopping.is_set():
            text = TEXTS[n % len(TEXTS)]
            n += 1
            began = time.monotonic()
            try:
                status, headers, body = post(self.port, text)
                ok = status == 200 and body == self.expected[text]
                error = "" if ok else f"{status} {body[:120]!r}"
                served_by = headers.get("x-served-by", "")
            except OSError as exc:
                ok, error, served_by = False, f"{type(exc).__name__}: {exc}", ""
            self.sent.append(Sent(began, (time.monotonic() - began) * 1000, ok, served_by, error))

    @contextmanager
    def running(self) -> Iterator[Load]:
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(self.clients)]
        for thread in threads:
            thread.start()
        try:
            yield self
        finally:
            self.stopping.set()
            for thread in threads:
                thread.join(timeout=WAIT)

    def between(self, start: float, end: float) -> list[Sent]:
        return [s for s in self.sent if start <= s.began < end]


def summary(sent: list[Sent]) -> dict[str, object]:
    latencies = [s.ms for s in sent if s.ok]
    return {"requests": len(sent), "failed": sum(not s.ok for s in sent),
            "errors": sorted({s.error for s in sent if not s.ok})[:5],
            "p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "p99_ms": round(percentile(latencies, 99), 1) if latencies else None}


@dataclass
class Fleet:
    """`replicas` live replicas over 2 x replicas slots (a replacement starts on the spare slot of its pair)."""
    artifact: Path
    work: Path
    replicas: int
    ports: list[int] = field(default_factory=list)
    live: dict[int, Replica] = field(default_factory=dict)  # slot -> replica

    def __post_init__(self) -> None:
        self.ports = [free_port() for _ in range(2 * self.replicas)]
        self.proxy = Proxy(self.ports, self.work)
        for slot in range(self.replicas):
            self.live[slot] = Replica(self.artifact, self.ports[slot], self.work / f"replica-{slot}.log")
        until(lambda: all(r.ready() for r in self.live.values()), "replicas ready")
        until(lambda: all(self.proxy.status().get(f"s{slot}") == "UP" for slot in self.live), "replicas admitted")

    def replace(self, slot: int) -> int:
        """A rolling update's step: the new replica up and admitted, then the old one drained; the new slot."""
        spare = (slot + self.replicas) % (2 * self.replicas)
        new = Replica(self.artifact, self.ports[spare], self.work / f"replica-{spare}.log")
        until(new.ready, f"the replica on slot {spare} ready")
        until(lambda: self.proxy.status().get(f"s{spare}") == "UP", f"slot {spare} admitted")
        old = self.live.pop(slot)
        self.live[spare] = new
        code = old.stop(signal.SIGTERM)
        if code != 0:
            raise RuntimeError(f"the replica on slot {slot} exited {code} after SIGTERM")
        return spare

    def close(self) -> None:
        for replica in self.live.values():
            if replica.process.poll() is None:
                replica.stop(signal.SIGKILL)
        self.proxy.close()


def rolling(fleet: Fleet, load: Load, settle: float) -> dict[str, object]:
    time.sleep(settle)
    start = time.monotonic()
    for slot in list(fleet.live):
        fleet.replace(slot)
    end = time.monotonic()
    time.sleep(settle)
    return {"replacement_s": round(end - start, 2), "during": summary(load.between(start, end)),
            "whole": summary(load.sent), "proxy": fleet.proxy.retries()}


def kill(fleet: Fleet, load: Load, settle: float) -> dict[str, object]:
    """SIGKILL one replica mid-load; the slot must turn DOWN and get no answer after its health checks tell."""
    time.sleep(settle)
    slot = next(iter(fleet.live))
    victim = fleet.live.pop(slot)
    killed = time.monotonic()
    victim.stop(signal.SIGKILL)
    until(lambda: fleet.proxy.status().get(f"s{slot}") == "DOWN", f"slot {slot} marked down", 30)
    down = time.monotonic()
    time.sleep(settle)
    end = time.monotonic()
    return {"marked_down_after_s": round(down - killed, 3), "after_kill": summary(load.between(killed, end)),
            "served_by_killed_after_down": sum(s.served_by == f"s{slot}" for s in load.between(down, end)),
            "whole": summary(load.sent), "proxy (both runs)": fleet.proxy.retries()}


def run(artifact: Path, work: Path, replicas: int = 3, clients: int = 4, settle: float = 2.0) -> dict[str, object]:
    work.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(artifact, work, replicas)
    try:
        expected = {text: post(fleet.ports[0], text)[2] for text in TEXTS}
        results: dict[str, object] = {}
        load = Load(fleet.proxy.port, expected, clients)
        with load.running():
            results["rolling"] = rolling(fleet, load, settle)
        load = Load(fleet.proxy.port, expected, clients)
        with load.running():
            results["kill"] = kill(fleet, load, settle)
        return results
    finally:
        fleet.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench replicas", description=__doc__.split("\n\n")[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of load before and after each event")
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "work" / "replicas")
    args = parser.parse_args(argv)
    results = run(args.artifact, args.work, args.replicas, args.clients, args.settle)
    print(f"{cpu_name()} ({os.cpu_count()} CPUs); {args.replicas} replicas of {args.artifact.name}, "
          f"1 thread each, {args.clients} clients, behind HAProxy")
    print(json.dumps(results, indent=2))
    return 0
