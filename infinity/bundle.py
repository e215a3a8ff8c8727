"""A multi-target bundle: one image for a mixed fleet.

`multiverse optimize --target avx2,icelake` writes one complete artifact per CPU target, each in a folder of its
own, and `bundle.json` listing them in preference order with the CPU flags each needs; files the targets share
(the tokenizer's) are stored once, as hard links. The server serves the first target this CPU fits, by the rule
`--target auto` follows (choose_target: a pure function of the CPU flags), and reads nothing of the others.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from infinity.manifest import Manifest, ManifestError, read_json
from infinity.manifest_schema import conform

BUNDLE_FILE = "bundle.json"
BUNDLE_SCHEMA_VERSION = 1


class BundleError(ManifestError):
    """bundle.json is missing, malformed, or names what is not there; or no target fits this CPU."""


def choose_target(candidates: Iterable[tuple[str, Sequence[str]]], flags: Iterable[str]) -> str | None:
    """The first of `candidates` (name, required CPU flags), in preference order, whose flags are all among `flags`
    (a host's /proc/cpuinfo flags); None where none fits. `--target auto` and the server's choice in a bundle both
    follow this rule."""
    have = frozenset(flags)
    for name, required in candidates:
        if set(required) <= have:
            return name
    return None


def needs(name: str, required: Sequence[str]) -> str:
    return f"{name} needs {', '.join(required) if required else 'no CPU flag'}"


@dataclass
class BundleTarget:
    name: str  # the target's name, as its manifest's target.name
    directory: str  # its artifact: a folder of the bundle
    required_cpu_flags: list[str] = field(default_factory=list)  # as its manifest's target.required_cpu_flags


@dataclass
class Bundle:
    targets: list[BundleTarget]  # in preference order: the server serves the first this CPU fits
    schema_version: int = BUNDLE_SCHEMA_VERSION
    created_at: str = ""

    @property
    def names(self) -> list[str]:
        return [target.name for target in self.targets]

    def choose(self, flags: Iterable[str]) -> BundleTarget | None:
        name = choose_target(((t.name, t.required_cpu_flags) for t in self.targets), flags)
        return next((t for t in self.targets if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, directory: Path) -> None:
        text = json.dumps(self.to_dict(), indent=2)
        (Path(directory) / BUNDLE_FILE).write_text(text + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: Any) -> Bundle:
        if not isinstance(data, dict):
            raise BundleError(f"{BUNDLE_FILE} is malformed: it must be a JSON object")
        version = data.get("schema_version")
        if type(version) is not int:
            raise BundleError(f"{BUNDLE_FILE} schema_version must be the integer {BUNDLE_SCHEMA_VERSION}, "
                              f"not {version!r}")
        if version != BUNDLE_SCHEMA_VERSION:
            raise BundleError(f"{BUNDLE_FILE} schema version {version} is not supported "
                              f"(expected {BUNDLE_SCHEMA_VERSION})")
        try:
            bundle = conform(cls, data, "")
        except ValueError as exc:
            raise BundleError(f"{BUNDLE_FILE} is malformed: {exc}") from None
        check_bundle(bundle)
        return bundle

    @classmethod
    def load(cls, directory: Path | str) -> Bundle:
        return cls.from_dict(read_json(directory, BUNDLE_FILE, BundleError, "not a bundle"))


def is_bundle(directory: Path | str) -> bool:
    return (Path(directory) / BUNDLE_FILE).is_file()


def _bad(where: str, expected: str, value: Any) -> BundleError:
    return BundleError(f"{BUNDLE_FILE} field {where} must be {expected}, not {value!r}")


def check_bundle(bundle: Bundle) -> None:
    """What the types alone do not say; every failure is one line naming the field."""
    if not bundle.targets:
        raise _bad("targets", "a list of at least one target", bundle.targets)
    names: set[str] = set()
    folders: set[str] = set()
    for index, target in enumerate(bundle.targets):
        where = f"targets[{index}]"
        if not target.name.strip() or target.name != target.name.strip():
            raise _bad(f"{where}.name", "a target's name", target.name)
        if target.name in names:
            raise _bad(f"{where}.name", "a name no other target has", target.name)
        folder = target.directory
        if (not folder.strip() or "\x00" in folder or "\\" in folder or PureWindowsPath(folder).is_absolute()
                or PurePosixPath(folder).parts != (folder,) or folder in (".", "..")):
            raise _bad(f"{where}.directory", "a folder directly inside the bundle", folder)
        if folder in folders:
            raise _bad(f"{where}.directory", "a folder no other target has", folder)
        for flag_index, flag in enumerate(target.required_cpu_flags):
            if not flag or any(c.isspace() for c in flag):
                raise _bad(f"{where}.required_cpu_flags[{flag_index}]", "a CPU flag as /proc/cpuinfo names it", flag)
        names.add(target.name)
        folders.add(folder)


@dataclass(frozen=True)
class Selection:
    """The target of a bundle this host serves, and why."""
    root: Path
    bundle: Bundle
    target: BundleTarget
    fits: bool  # False: none fits, and --allow-cpu-mismatch serves the first anyway
    why: str

    @property
    def directory(self) -> Path:
        return self.root / self.target.directory

    def check(self, manifest: Manifest) -> None:
        """The chosen folder's manifest is the target the bundle lists there."""
        target = manifest.target
        if target.name != self.target.name or list(target.required_cpu_flags) != self.target.required_cpu_flags:
            raise BundleError(f"{BUNDLE_FILE} lists {self.target.name!r} (needs "
                              f"{', '.join(self.target.required_cpu_flags) or 'no CPU flag'}) in "
                              f"{self.target.directory}/, whose manifest is {target.name!r} (needs "
                              f"{', '.join(target.required_cpu_flags) or 'no CPU flag'})")

    def info(self) -> dict[str, Any]:
        """What /info shows of the bundle."""
        return {"targets": [asdict(target) for target in self.bundle.targets], "chosen": self.target.name,
                "fits": self.fits, "why": self.why}


def select(root: Path | str, flags: Iterable[str], allow_mismatch: bool = False) -> Selection:
    """The target of the bundle in `root` that a host with `flags` serves: the first it fits; where it fits none,
    a BundleError naming what each needs, or with `allow_mismatch` the first target. Reads bundle.json only."""
    root = Path(root)
    bundle = Bundle.load(root)
    have = frozenset(flags)
    chosen = bundle.choose(have)
    passed = bundle.targets[:bundle.targets.index(chosen)] if chosen is not None else []
    lacking = "; ".join(f"this CPU lacks {t.name}'s {', '.join(f for f in t.required_cpu_flags if f not in have)}"
                        for t in passed)
    order = ", ".join(bundle.names)
    if chosen is not None:
        why = (f"the first of the bundle's targets ({order}) whose CPU flags this CPU has "
               f"({', '.join(chosen.required_cpu_flags) or 'it needs none'})" + (f"; {lacking}" if lacking else ""))
        return Selection(root, bundle, chosen, True, why)
    each = "; ".join(needs(t.name, t.required_cpu_flags) for t in bundle.targets)
    first = bundle.targets[0]
    if not allow_mismatch:
        raise BundleError(f"no target of this bundle fits this CPU: {each}; pass --allow-cpu-mismatch to serve "
                          f"{first.name} anyway")
    return Selection(root, bundle, first, False,
                     f"no target of the bundle fits this CPU ({each}): its first, with --allow-cpu-mismatch")
