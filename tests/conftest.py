"""Session-wide artifacts: each source model is optimized once per test run and shared, by every xdist worker."""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# xdist workers share the cores: torch's OpenMP threads, a pool per worker that spins while it waits, would take
# turns at each other's cores (a third slower on 2 cores); each worker's torch gets its share of them
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // WORKERS)))

from optimize.presets import resolve_target  # noqa: E402
from tests.models import (  # noqa: E402
    build_minilm_head,
    build_tiny_colbert,
    build_tiny_distilbert,
    build_tiny_family,
    build_tiny_gemma3_embedding,
    build_tiny_m3,
    build_tiny_qwen3_embedding,
    build_tiny_qwen3_reranker,
    build_tiny_splade,
    minilm_dir,
)

ArtifactFactory = Callable[..., Path]
# the CPU target `--target auto` picks on this host: an artifact of another target may not serve here (an icelake
# INT8 graph is refused on an AVX2-only CPU)
HOST_TARGET = resolve_target("auto").name
RERANKERS = {"qwen3-reranker-tiny": "qwen3"}  # causal rerankers' prompts, by source model


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Source models come out bit for bit alike whatever a process's thread count: a head scaled by a forward pass
    (tests/models.py: calibrate_head) takes sums whose order depends on it, and the answers test hashes graphs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ArtifactCache:
    """Builds source models and artifacts on first use, one process at a time (the xdist workers share the cache);
    INFINITY_TEST_ARTIFACTS keeps them between runs. A worker's builds go through one optimizer `Builds`, so two
    artifacts of one model that differ only in their CPU target share the stages before quantize, as a bundle's do."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._builds: Any = None

    def builds(self) -> Any:  # optimize.pipeline.Builds, imported on first use (it imports torch)
        if self._builds is None:
            from optimize.pipeline import Builds

            self._builds = Builds(lambda _: None)
        return self._builds

    def close(self) -> None:
        if self._builds is not None:
            self._builds.__exit__()

    def source(self, name: str) -> Path:
        if name == "minilm":
            return minilm_dir()
        path = self.root / "sources" / name
        path.parent.mkdir(exist_ok=True)  # where the lock file goes
        with FileLock(f"{path}.lock"), one_torch_thread():
            return self._source(name, path)

    def _source(self, name: str, path: Path) -> Path:
        if not (path / "config.json").is_file():
            shutil.rmtree(path, ignore_errors=True)
            if name == "distilbert-tiny":
                build_tiny_distilbert(path)
            elif name == "qwen3-tiny":
                build_tiny_qwen3_embedding(path)
            elif name == "gemma3-tiny":
                build_tiny_gemma3_embedding(path)
            elif name == "qwen3-reranker-tiny":
                build_tiny_qwen3_reranker(path)
            elif name == "splade-tiny":
                build_tiny_splade(path)
            elif name == "colbert-tiny":
                build_tiny_colbert(path)
            elif name == "m3-tiny":
                build_tiny_m3(path)
            else:
                build_minilm_head(name, path)
        return path

    def family(self, family: str, task: str, precision: str, target: str = HOST_TARGET) -> tuple[Path, Path]:
        """(source, artifact) of a tiny `family` model (tests/models.py: FAMILIES or VARIANTS) for `task`; INT8
        artifacts are written whatever their parity, which the manifest records."""
        from optimize.options import OptimizeOptions

        source = self.root / "sources" / f"tiny-{family}-{task}"
        source.parent.mkdir(exist_ok=True)
        with FileLock(f"{source}.lock"), one_torch_thread():
            if not (source / "config.json").is_file():
                shutil.rmtree(source, ignore_errors=True)
                build_tiny_family(family, task, source)
        out = self.root / f"tiny-{family}-{task}-{target}-{precision}"
        with FileLock(f"{out}.lock"):
            if not (out / "manifest.json").is_file():
                self.builds().optimize(OptimizeOptions(model=str(source), task=task, out=out, target=target,
                                                       precision=precision, allow_failed_parity=precision == "int8"))
        return source, out

    def artifact(self, task: str, precision: str = "fp32", target: str = HOST_TARGET, model: str | None = None) -> Path:
        from optimize.options import OptimizeOptions

        model = model or {"feature-extraction": "minilm", "sparse-embedding": "splade-tiny",
                          "multi-vector": "colbert-tiny", "hybrid-embedding": "m3-tiny"}.get(task, task)
        path = self.root / f"{model}-{task}-{target}-{precision}"
        with FileLock(f"{path}.lock"):
            if not (path / "manifest.json").is_file():
                self.builds().optimize(OptimizeOptions(model=str(self.source(model)), task=task, out=path,
                                                       target=target, precision=precision,
                                                       reranker_template=RERANKERS.get(model)))
        return path

    def bundle(self, targets: tuple[str, ...], task: str = "feature-extraction", precision: str = "int8") -> Path:
        """A bundle of `targets` (in preference order) as `multiverse optimize --target A,B` writes it, with the
        options artifact() builds each target's artifact with (the same graphs: the INT8 build is deterministic)."""
        from optimize.cli import main

        model = {"feature-extraction": "minilm"}.get(task, task)
        path = self.root / f"{model}-{task}-{'+'.join(targets)}-{precision}-bundle"
        with FileLock(f"{path}.lock"):
            if not (path / "bundle.json").is_file():
                assert main(["optimize", str(self.source(model)), "--task", task, "--precision", precision,
                             "--target", ",".join(targets), "--out", str(path)]) == 0
        return path


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArtifactCache]:
    keep = os.environ.get("INFINITY_TEST_ARTIFACTS")
    run = tmp_path_factory.getbasetemp()  # under xdist, a worker's folder inside the run's
    cache = ArtifactCache(Path(keep) if keep else
                          (run.parent if os.environ.get("PYTEST_XDIST_WORKER") else run) / "artifacts")
    yield cache
    cache.close()


@pytest.fixture(scope="session")
def artifact_for(artifacts: ArtifactCache) -> ArtifactFactory:
    """artifact_for(task, precision="fp32", target=HOST_TARGET, model=None) -> artifact directory."""
    return artifacts.artifact


@pytest.fixture(scope="session")
def minilm_fp32_artifact(artifacts: ArtifactCache) -> Path:
    return artifacts.artifact("feature-extraction", "fp32")


@pytest.fixture(scope="session")
def minilm_int8_artifact(artifacts: ArtifactCache) -> Path:
    return artifacts.artifact("feature-extraction", "int8")


@pytest.fixture(scope="session")
def family_artifact(artifacts: ArtifactCache) -> Callable[..., tuple[Path, Path]]:
    """family_artifact(family, task, precision, target=HOST_TARGET) -> (source directory, artifact directory)."""
    return artifacts.family


SLOW_FIXTURES = {"artifact_for", "minilm_int8_artifact"}  # build INT8 or other tasks' artifacts
SLOW_MODULES = {"test_containers", "test_optimize"}  # build container images; optimize models in the test


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`pytest -m "not slow"` is the inner loop: everything that needs only the MiniLM fp32 artifact."""
    for item in items:
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)

