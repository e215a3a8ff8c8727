"""The optimizer's modules in pipeline order: what every stage reads (the texts, the checkpoint, the tasks, graph
I/O) comes first, then load, export, fuse, calibrate, quantize, validate, package; no module imports a later stage
than its own, and adding a task touches the task registry alone."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZE = ROOT / "optimize"
# each module's place, by its first name under optimize/; a module may import its own place and earlier ones
ORDER = ["onnxio", "agreement", "texts", "checkpoint", "tasks", "source", "export", "padding_mask", "fuse",
         "calibrate", "quantize", "presets", "validate", "package", "pipeline", "bundle", "cli", "__main__", "__init__"]


def place(module: str) -> int:
    parts = module.split(".")
    return ORDER.index(parts[1] if len(parts) > 1 else "__init__")


def imports(path: Path) -> set[str]:
    """The optimize modules a file imports, outside `if TYPE_CHECKING:` (names for the type checker only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("optimize"):
            found.update([node.module] if node.module != "optimize" else [f"optimize.{a.name}" for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("optimize"))
    return found


def modules() -> dict[str, Path]:
    return {".".join(path.relative_to(ROOT).with_suffix("").parts): path for path in OPTIMIZE.rglob("*.py")}


def test_every_module_has_a_place():
    assert all(place(name) >= 0 for name in modules())


def test_no_stage_imports_a_later_one():
    backward = [f"{name} -> {target}" for name, path in modules().items() for target in imports(path)
                if place(target) > place(name)]
    assert not backward, backward


def test_task_names_are_compared_only_in_the_registry():
    """Tasks are objects (optimize/tasks/): no stage branches on a task's name."""
    compared = re.compile(r"\btask(?:\.name)? (==|!=|in) ")
    found = [f"{path.relative_to(ROOT)}:{number}" for path in OPTIMIZE.rglob("*.py")
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if compared.search(line) and not line.lstrip().startswith("#")
             and path.parent.name != "tasks"]
    assert not found, found
