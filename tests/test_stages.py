"""The optimizer's modules in run order, read from the tree: the helpers every stage may use (graph I/O, what is
measured with, the checkpoint, the tasks, the attention rewrites, the build's options) come first, then the stages in
their folder's numbered order (optimize/stages/s1_load ... s8_package), which is the order the pipeline runs them in,
then what runs them; no module imports a later place than its own."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIMIZE = ROOT / "optimize"
STAGES = OPTIMIZE / "stages"
HELPERS = ["graph", "measure", "checkpoint", "tasks", "attention", "options"]
PIPELINE = OPTIMIZE / "pipeline.py"
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
    placeless = []
    for name in modules():
        try:
            place(name)
        except ValueError:
            placeless.append(name)
    assert not placeless, placeless


def run_order() -> list[str]:
    """The stages as pipeline.py runs them: the names its `stage("...")` blocks give, in the order of the file."""
    tree = ast.parse(PIPELINE.read_text(encoding="utf-8"))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and node.args
             and getattr(node.func, "id", getattr(node.func, "attr", None)) == "stage"
             and isinstance(node.args[0], ast.Constant)]
    return [node.args[0].value for node in sorted(calls, key=lambda node: (node.lineno, node.col_offset))]


def test_ls_shows_the_stages_in_the_order_the_pipeline_runs_them():
    assert [name.split("_", 1)[1] for name in stage_names()] == run_order()
    assert len(run_order()) == len(set(run_order())) == 8
    assert sorted(path.name for path in OPTIMIZE.iterdir() if path.suffix == ".py" or (path / "__init__.py").is_file()
                  ) == sorted(f"{name}.py" if (OPTIMIZE / f"{name}.py").is_file() else name
                              for name in [*HELPERS, "stages", *RUNNERS])


def test_each_stage_block_runs_its_own_stage_and_the_pipeline_holds_no_stage_body():
    """Inside each `with stage("name")` block of pipeline.py, the calls are to names imported from that stage's module
    alone; and pipeline.py imports from optimize only the options, the presets, the tasks and the stages' entries."""
    tree = ast.parse(PIPELINE.read_text(encoding="utf-8"))
    origin = {alias.asname or alias.name: node.module for node in tree.body if isinstance(node, ast.ImportFrom)
              and node.module for alias in node.names}
    stages = {name.split("_", 1)[1]: f"optimize.stages.{name}" for name in stage_names()}
    blocks = [(item.context_expr.args[0].value, block) for block in ast.walk(tree) if isinstance(block, ast.With)
              for item in block.items if isinstance(item.context_expr, ast.Call) and item.context_expr.args
              and isinstance(item.context_expr.args[0], ast.Constant)]
    wrong = [f"{label}: {call.func.id} from {origin.get(call.func.id)}" for label, block in blocks
             for statement in block.body for call in ast.walk(statement)
             if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in origin
             and not origin[call.func.id].startswith(stages[label])]
    assert not wrong, wrong
    assert sorted(label for label, _ in blocks) == sorted(stages)
    helpers = {module for module in origin.values() if module.startswith("optimize")
               and not module.startswith("optimize.stages.")}
    assert helpers <= {"optimize.options", "optimize.presets", "optimize.tasks", "optimize.tasks.base"}, helpers


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
