"""The optimizer's modules in pipeline order, read from the tree: the helpers every stage may use (graph I/O, what is
measured with, the checkpoint, the tasks, the attention rewrites) come first, then the stages in their folder's
numbered order (optimize/stages/s1_load ... s7_package), then what runs them; no module imports a later place than
its own, and adding a task touches the task registry alone."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZE = ROOT / "optimize"
STAGES = OPTIMIZE / "stages"
HELPERS = ["graph", "measure", "checkpoint", "tasks", "attention"]
RUNNERS = ["presets", "pipeline", "bundle", "cli", "__main__", "__init__"]


def stage_names() -> list[str]:
    """The stages in the order `ls optimize/stages` shows them: s1_load, s2_export, ..."""
    found = sorted((path.stem for path in STAGES.iterdir() if re.fullmatch(r"s\d_\w+", path.stem)),
                   key=lambda name: int(name[1]))
    return found


def order() -> list[str]:
    return [*HELPERS, "stages", *(f"stages.{name}" for name in stage_names()), *RUNNERS]


def place(module: str) -> int:
    """A module's place: its first name under optimize/, or its stage under optimize/stages/."""
    parts = module.split(".")
    if len(parts) == 1:
        return order().index("__init__")
    key = parts[1] if parts[1] != "stages" or len(parts) == 2 or parts[2] == "__init__" else f"stages.{parts[2]}"
    return order().index(key)


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


def test_ls_shows_the_seven_stages_in_pipeline_order():
    assert stage_names() == ["s1_load", "s2_export", "s3_fuse", "s4_reference", "s5_quantize", "s6_validate",
                             "s7_package"]
    assert sorted(path.name for path in OPTIMIZE.iterdir() if path.suffix == ".py" or (path / "__init__.py").is_file()
                  ) == sorted(f"{name}.py" if (OPTIMIZE / f"{name}.py").is_file() else name
                              for name in [*HELPERS, "stages", *RUNNERS])


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
