"""A multi-target bundle (infinity/bundle.py): each target's artifact as the pipeline writes it alone, in a folder of
its own (the stages before quantize run once for all of them), the files they have alike stored once, bundle.json
beside them, published with one rename."""
from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from infinity.artifact import sha256_file, staging_beside, write_atomically
from infinity.bundle import Bundle, BundleTarget
from infinity.manifest import Manifest
from optimize.options import Log, OptimizeOptions
from optimize.pipeline import Builds
from optimize.stages.s7_validate.validate import ParityFailed
from optimize.stages.s8_package import now


@dataclasses.dataclass
class BuiltBundle:
    bundle: Bundle
    manifests: list[Manifest]  # in the bundle's order
    shared: list[str]  # files stored once for several targets, as "target/name"
    disk_bytes: int  # every file once (hard links counted once)
    apart_bytes: int  # what the targets' artifacts take as separate directories


def optimize_bundle(options: OptimizeOptions, targets: Sequence[str], log: Log = print) -> BuiltBundle:
    """One artifact per target (CPU targets, in preference order), each as `optimize` writes it alone, into
    `options.out`/<target>, and bundle.json listing them; nothing is written unless every target is. The stages
    before quantize run once for all of them (`Builds`)."""
    out = Path(options.out).resolve()
    staging = staging_beside(out)
    try:
        manifests = []
        with Builds(log) as builds:
            for index, name in enumerate(targets, 1):
                log(f"multiverse: bundle target {index} of {len(targets)}: {name}")
                try:
                    manifests.append(builds.optimize(dataclasses.replace(options, target=name, out=staging / name)))
                except ParityFailed as exc:
                    raise ParityFailed(exc.result, f"target {name}: {exc}") from None
        apart = sum(path.stat().st_size for path in staging.rglob("*") if path.is_file())
        shared = store_once(staging, list(targets))
        bundle = Bundle(targets=[BundleTarget(name=manifest.target.name, directory=name,
                                              required_cpu_flags=list(manifest.target.required_cpu_flags))
                                 for name, manifest in zip(targets, manifests)], created_at=now())
        bundle.save(staging)
        built = BuiltBundle(bundle, manifests, shared, disk_bytes(staging), apart)
        write_atomically(staging, out)
        return built
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def store_once(root: Path, folders: list[str]) -> list[str]:
    """Each file with the same bytes as one of an earlier target's becomes a hard link to it (each target's
    artifact stays whole: its manifest's checksums hold, and it loads alone); the files linked, as folder/name.
    Where the filesystem has no hard links, the copies stay."""
    seen: dict[tuple[int, str], Path] = {}
    linked = []
    for folder in folders:
        for path in sorted(p for p in (root / folder).rglob("*") if p.is_file()):
            key = (path.stat().st_size, sha256_file(path))
            first = seen.setdefault(key, path)
            if first is path:
                continue
            temporary = path.with_name(f".{path.name}.link")
            try:
                os.link(first, temporary)
            except OSError:
                continue
            os.replace(temporary, path)
            linked.append(path.relative_to(root).as_posix())
    return linked


def disk_bytes(root: Path) -> int:
    """The bytes of every file under `root`, each hard-linked file once."""
    inodes = {}
    for path in root.rglob("*"):
        if path.is_file():
            stat = path.stat()
            inodes[(stat.st_dev, stat.st_ino)] = stat.st_size
    return sum(inodes.values())
