"""Replicas behind a real HAProxy (the distribution's package, installed with apt-get when missing and this runs as
root): a rolling replacement of every replica under load loses no request, and a replica killed mid-load stops
getting traffic once its health check fails, its clients answered by the others."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from bench import replicas


def haproxy() -> str | None:
    """Why HAProxy cannot run here, or None once it can."""
    if shutil.which("haproxy"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "no haproxy, and no root apt-get to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
    installed = subprocess.run(["apt-get", "install", "-y", "-q", "haproxy"], env=env, capture_output=True,
                               text=True, timeout=600)
    return None if shutil.which("haproxy") else f"apt-get install haproxy failed: {installed.stderr[-500:]}"


def test_a_rolling_replacement_loses_nothing_and_a_killed_replica_is_routed_around(minilm_fp32_artifact, tmp_path):
    reason = haproxy()
    if reason:
        pytest.skip(reason)
    results = replicas.run(minilm_fp32_artifact, tmp_path, replicas=2, clients=3, settle=0.5)

    rolling = results["rolling"]
    assert rolling["during"]["requests"] > 0 and rolling["whole"]["requests"] > rolling["during"]["requests"]
    assert rolling["whole"]["failed"] == 0, rolling  # every answer 200 and byte for byte the replica's own

    kill = results["kill"]
    assert kill["after_kill"]["requests"] > 0
    # at most the requests in flight on the killed replica fail (the proxy retries them elsewhere: usually none)
    assert kill["whole"]["failed"] <= 3, kill
    assert kill["marked_down_after_s"] < 5  # health checks every 250 ms, one failure takes it out
    assert kill["served_by_killed_after_down"] == 0
