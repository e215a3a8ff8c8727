"""The container images: scripts/container-check.sh builds both with podman and smoke-runs them.

It needs root (it installs podman, buildah, runc and mmdebstrap with apt-get when they are missing)
and takes a few minutes; INFINITY_CONTAINER_CHECK=0 skips it on a workstation.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "container-check.sh"
CANNOT_RUN_HERE = 77


def _reason_to_skip() -> str | None:
    if os.environ.get("INFINITY_CONTAINER_CHECK", "1").lower() in ("0", "false", "no", "off"):
        return "INFINITY_CONTAINER_CHECK=0"
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "the container check needs root on Linux (podman, mmdebstrap)"
    if not (shutil.which("podman") or shutil.which("apt-get")):
        return "no podman, and no apt-get to install it"
    return None


SKIP = _reason_to_skip()


@pytest.mark.skipif(SKIP is not None, reason=str(SKIP))
def test_images_build_and_serve(minilm_fp32_artifact: Path, artifact_for) -> None:
    cuda_artifact = artifact_for("feature-extraction", "fp16", target="cuda")
    result = subprocess.run(["bash", str(SCRIPT), "--cpu-artifact", str(minilm_fp32_artifact),
                             "--gpu-artifact", str(cuda_artifact)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
    print(result.stdout)
    if result.returncode == CANNOT_RUN_HERE:
        pytest.skip(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0, result.stdout[-4000:]
