"""What this host offers: CPU flags, physical cores, execution providers."""
from __future__ import annotations

import os
from functools import lru_cache


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_name(cpuinfo: str | None = None) -> str:
    """The first CPU's model name with its family and model numbers, e.g. "AMD EPYC (family 26, model 2)": a VM
    often shows only "AMD EPYC", and the numbers tell its generations apart."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as handle:
                cpuinfo = handle.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or os.uname().machine
    numbers = [f"{label} {fields[key]}" for label, key in (("family", "cpu family"), ("model", "model"))
               if fields.get(key)]
    return f"{name} ({', '.join(numbers)})" if numbers else name


def physical_cores() -> int:
    """Physical cores usable by this process (cgroup quota and affinity respected)."""
    try:
        import psutil  # optional: better physical-core count when installed
        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        cores = _physical_from_cpuinfo() or os.cpu_count() or 1
    cores = min(cores, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores)
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, int(quota)))
    return max(1, cores)


def _physical_from_cpuinfo() -> int | None:
    pairs = set()
    physical, core = None, None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("physical id"):
                    physical = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                elif not line.strip() and core is not None:
                    pairs.add((physical, core))
                    physical, core = None, None
    except OSError:
        return None
    return len(pairs) or None


def _cgroup_cpu_quota() -> float | None:
    """CPUs allowed by the container's quota: cgroup v2 cpu.max, else v1 cfs_quota_us / cfs_period_us."""
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="utf-8") as handle:
            quota, period = handle.read().split()
        return int(quota) / int(period) if quota != "max" else None
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="utf-8") as handle:
            quota_us = int(handle.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="utf-8") as handle:
            period_us = int(handle.read())
        return quota_us / period_us if quota_us > 0 else None
    except (OSError, ValueError):
        return None


def missing_cpu_flags(required: list[str]) -> list[str]:
    flags = cpu_flags()
    return [flag for flag in required if flag not in flags]
