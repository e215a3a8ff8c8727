"""An artifact's files on disk: the checksums the manifest vouches for, the paths it names kept inside the
directory, and a directory written whole or not at all."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from infinity.manifest import Manifest, ManifestError


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def artifact_file(directory: Path | str, name: str) -> Path:
    """The path of a file the manifest names, refused if it (or a link on its way) leads out of the directory."""
    root = Path(directory).resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise ManifestError(f"{name} leads outside the artifact directory")
    return path


def checksummed_files(manifest: Manifest) -> list[tuple[str, str]]:
    """Every file the manifest vouches for, with its sha256: the graph, its weights file if any, the tokenizer."""
    return [(manifest.model.file, manifest.model.sha256), *manifest.model.external_data.items(),
            (manifest.tokenizer.file, manifest.tokenizer.sha256)]


def verify_present(directory: Path | str, manifest: Manifest) -> None:
    """Every file the manifest vouches for is there (cheap: before anything loads, where verify_checksums may
    run beside the load)."""
    for name, _ in checksummed_files(manifest):
        if not artifact_file(directory, name).is_file():
            raise ManifestError(f"{name} is missing from {directory}")


def verify_checksums(directory: Path | str, manifest: Manifest) -> None:
    directory = Path(directory)
    verify_present(directory, manifest)
    for name, expected in checksummed_files(manifest):
        actual = sha256_file(artifact_file(directory, name))
        if actual != expected:
            raise ManifestError(f"checksum mismatch for {name}: manifest says {expected[:12]}..., "
                                f"file is {actual[:12]}...")


def staging_beside(destination: Path) -> Path:
    """A new empty folder beside `destination` to write it in (write_atomically then moves it into place), readable
    by the unprivileged user the server runs as."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.tmp-", dir=destination.parent))
    staging.chmod(0o755)
    return staging


def write_atomically(staging: Path, destination: Path) -> None:
    """Move a fully written staging directory to its destination in one rename."""
    destination = Path(destination).resolve()
    destination.parent.mkdir(parents=True, exist_ok=True)
    if destination.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{destination.name}.old-", dir=destination.parent))
        os.replace(destination, old / destination.name)
        os.replace(staging, destination)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, destination)
