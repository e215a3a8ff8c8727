"""How long the server took from its process's start to listening, phase by phase (one log line): what a
scaled-to-zero deployment waits on before its first answer."""
from __future__ import annotations

import os
import time


def _now() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic()


def process_start() -> float | None:
    """When this process was created, on _now()'s clock (Linux: /proc/self/stat, to the clock tick), else None."""
    try:
        fields = open("/proc/self/stat").read().rpartition(")")[2].split()
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks since boot
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Startup:
    def __init__(self) -> None:
        began = process_start()
        self.began = began if began is not None else _now()
        self.last = self.began
        self.phases: list[tuple[str, float]] = []

    def mark(self, phase: str) -> None:
        """The phase that ends now."""
        now = _now()
        self.phases.append((phase, max(0.0, now - self.last)))
        self.last = now

    def line(self) -> str:
        split = ", ".join(f"{phase} {seconds:.3f}" for phase, seconds in self.phases)
        return f"ready in {self.last - self.began:.3f} s from the process's start: {split}"
