"""Start-up: settings from flags and environment, refusals as one line, and a server free of torch and of import
cycles."""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infinity.cli import build_parser, main, settings_from
from infinity.engine.preflight import check, open_checked
from infinity.errors import StartupError
from infinity.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def settings(argv: list[str], environ: dict[str, str] | None = None) -> Settings:
    return settings_from(build_parser().parse_args(["serve", "artifact", *argv]), environ or {})


def test_flags_win_over_environment_which_wins_over_defaults() -> None:
    parsed = settings(["--port", "9000", "--allow-cpu-mismatch"],
                      {"INFINITY_PORT": "9100", "INFINITY_MAX_QUEUE": "7", "INFINITY_DRAIN_TIMEOUT": "2.5",
                       "INFINITY_ACCESS_LOG": "yes"})
    assert (parsed.port, parsed.max_queue, parsed.drain_timeout) == (9000, 7, 2.5)
    assert parsed.allow_cpu_mismatch and parsed.access_log
    assert parsed.max_batch_size == Settings().max_batch_size and parsed.threads is None


def test_a_setting_that_defaults_on_can_be_turned_off_by_flag_or_environment() -> None:
    assert settings([]).spin_wait is True
    assert settings(["--no-spin-wait"]).spin_wait is False
    assert settings([], {"INFINITY_SPIN_WAIT": "false"}).spin_wait is False
    assert settings(["--spin-wait"], {"INFINITY_SPIN_WAIT": "false"}).spin_wait is True
    assert settings(["--no-access-log"], {"INFINITY_ACCESS_LOG": "true"}).access_log is False


@pytest.mark.parametrize(("argv", "environ", "message"), [
    (["--port", "eighty"], {}, "--port must be an integer"),
    ([], {"INFINITY_ALLOW_CPU_MISMATCH": "maybe"}, "INFINITY_ALLOW_CPU_MISMATCH must be true or false"),
    (["--max-batch-size", "0"], {}, "max_batch_size must be at least 1"),
    (["--max-inputs-per-request", "0"], {}, "max_inputs_per_request must be at least 1"),
    (["--log-level", "loud"], {}, "log_level must be one of"),
    (["--spin-wait-us", "0"], {}, "spin_wait_us must be at least 1"),
    ([], {"INFINITY_SPIN_WAIT_US": "2000000"}, "spin_wait_us must be at most 1000000"),
    (["--lone-request-tokens", "-1"], {}, "lone_request_tokens must not be negative"),
    (["--engines", "0"], {}, "engines must be at least 1"),
    (["--threads", "2"], {"INFINITY_ENGINES": "3"}, r"engines \(3\) must be at most threads \(2\)"),
])
def test_bad_settings_are_refused(argv: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(StartupError, match=message):
        settings(argv, environ)


@pytest.mark.parametrize(("argv", "entries"), [
    ([], {"session.intra_op.spin_duration_us": "50", "session.intra_op.allow_spinning": ""}),
    (["--spin-wait-us", "400"], {"session.intra_op.spin_duration_us": "400"}),
    (["--no-spin-wait", "--spin-wait-us", "400"], {"session.intra_op.allow_spinning": "0",
                                                   "session.intra_op.spin_duration_us": ""}),
])
def test_spinning_settings_reach_the_onnx_runtime_session(artifact_for: Any, argv: list[str],
                                                          entries: dict[str, str]) -> None:
    """Workers spin 50 us by default: long enough to bridge one run's operators, short enough to leave the
    cores to the event loop between batches; --no-spin-wait turns spinning off altogether."""
    model = open_checked(artifact_for("ranking"), settings(argv), threads=1)
    options = model.engine.session.get_session_options()

    def entry(key: str) -> str:
        try:
            return options.get_session_config_entry(key)
        except RuntimeError:  # not set
            return ""

    assert {key: entry(key) for key in entries} == entries


def test_engines_split_the_threads_and_do_not_spin(artifact_for: Any) -> None:
    model = open_checked(artifact_for("ranking"), settings(["--engines", "2"]), threads=2)
    options = model.engine.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


@pytest.fixture()
def editable(artifact_for: Any, tmp_path: Path) -> Path:
    """A copy of a real artifact whose manifest and tokenizer may be edited (the model file is hard-linked)."""
    source = artifact_for("ranking")
    copy = tmp_path / "artifact"
    copy.mkdir()
    for path in source.iterdir():
        if path.name == "model.onnx":
            os.link(path, copy / path.name)
        else:
            shutil.copy(path, copy / path.name)
    return copy


def edit(artifact: Path, **sections: dict[str, Any]) -> None:
    data = json.loads((artifact / "manifest.json").read_text())
    for section, values in sections.items():
        if isinstance(data.get(section), dict):
            data[section].update(values)
        else:
            data[section] = values
    (artifact / "manifest.json").write_text(json.dumps(data))


def refusal(artifact: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["serve", str(artifact), *flags], environ={}) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infinity: error: ")
    return lines[0]


def test_more_engines_than_the_default_threads_are_refused_in_one_line(editable: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert "engines (999) must be at most threads" in refusal(editable, capsys, "--engines", "999")


def test_a_failed_parity_check_is_refused_unless_allowed(editable: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(editable, parity={"passed": False, "failures": ["cosine 0.91 < 0.99"]})
    assert "--allow-failed-parity" in refusal(editable, capsys)
    check(editable, Settings(allow_failed_parity=True))


def test_missing_cpu_flags_are_refused_unless_allowed(editable: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(editable, target={"required_cpu_flags": ["avx512_imaginary"]})
    assert "avx512_imaginary" in refusal(editable, capsys)
    check(editable, Settings(allow_cpu_mismatch=True))


def test_a_missing_execution_provider_is_refused(editable: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(editable, target={"name": "imaginary-gpu", "providers": ["ImaginaryExecutionProvider",
                                                                   "CPUExecutionProvider"]})
    line = refusal(editable, capsys, "--allow-cpu-mismatch")
    assert "ImaginaryExecutionProvider" in line


def test_a_changed_file_is_refused(editable: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with open(editable / "tokenizer.json", "a") as handle:
        handle.write(" ")
    assert "checksum mismatch for tokenizer.json" in refusal(editable, capsys)


def test_a_broken_artifact_is_refused_as_such_while_another_process_holds_the_port(
        editable: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """README command 2 run beside command 1's server: the artifact's refusal, not the port's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        with open(editable / "tokenizer.json", "a") as handle:
            handle.write(" ")
        assert "checksum mismatch for tokenizer.json" in refusal(editable, capsys, "--port", port)
        (editable / "tokenizer.json").write_bytes((editable / "tokenizer.json").read_bytes()[:-1])
        assert "address already in use" in refusal(editable, capsys, "--port", port)  # once it is whole


def test_an_unknown_schema_version_is_refused(editable: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(editable, schema_version=99)
    assert "schema version 99" in refusal(editable, capsys)


def test_a_non_integer_label_index_is_refused_in_one_line(editable: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edit(editable, task={"id2label": {"zero": "LABEL_0"}})
    assert "task.id2label keys must be integers, not 'zero'" in refusal(editable, capsys)


def test_a_model_file_outside_the_artifact_is_refused(editable: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "model.onnx"
    outside.parent.mkdir()
    os.replace(editable / "model.onnx", outside)
    edit(editable, model={"file": str(outside)})
    with pytest.raises(StartupError, match="model.file must name a file inside the artifact directory"):
        check(editable, Settings())


def test_a_max_length_beyond_the_position_embeddings_is_refused(editable: Path) -> None:
    edit(editable, tokenizer={"max_length": 100000})
    with pytest.raises(StartupError, match="tokenizer.max_length 100000 is more than the model accepts") as caught:
        open_checked(editable, Settings(), threads=1)
    assert "\n" not in str(caught.value)


def test_a_refusal_is_one_line_without_traceback(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "infinity", "serve", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"infinity: error: no manifest.json in {tmp_path}: "
                                                  "not an artifact directory"]


NO_TORCH = """
import sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"torch", "transformers", "optimize", "sentence_transformers"}:
            raise ImportError(f"{name} is blocked in the server")
        return None

sys.meta_path.insert(0, Blocker())
import infinity.api.app, infinity.api.openapi, infinity.cli
import infinity.engine.service, infinity.engine.batcher, infinity.engine.preflight
from starlette.testclient import TestClient
from infinity.api.app import create_app
from infinity.api.router import Router
from infinity.engine.model import LoadedModel
from infinity.settings import Settings

for artifact, inputs in zip(sys.argv[1::2], sys.argv[2::2]):
    with TestClient(create_app(Router.build(LoadedModel.load(artifact), Settings()))) as client:
        response = client.post("/predict", json={"inputs": inputs})
        assert response.status_code == 200, response.text
        print(response.text)
assert not {m.partition(".")[0] for m in sys.modules} & {"torch", "transformers", "optimize"}
"""


def test_the_server_runs_without_torch_transformers_or_the_optimizer(minilm_fp32_artifact: Path,
                                                                     artifact_for: Any) -> None:
    result = subprocess.run([sys.executable, "-c", NO_TORCH, str(minilm_fp32_artifact), "hello",
                             str(artifact_for("token-classification")), "Anna lives in Berlin"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 2


def server_imports() -> dict[str, set[str]]:
    """Each module of infinity/ and the modules of infinity/ it imports, wherever the import statement stands (in a
    function or under TYPE_CHECKING too)."""
    paths = {".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
             for path in (ROOT / "infinity").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names if alias.name in paths}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in paths:
                # `from package import module` imports the module; `from module import name`, the module
                found |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in paths else node.module
                          for alias in node.names}
        graph[module] = found - {module}
    return graph


def test_the_server_imports_no_module_that_imports_it_back() -> None:
    graph, cycles = server_imports(), []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph[module]):
            if imported in path:
                cycles.append(" -> ".join([*path[path.index(imported):], imported]))
            elif imported not in done:
                visit(imported, [*path, imported])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert len(graph) > 40 and graph["infinity.cli"], graph  # the walk found the package and its imports
    assert cycles == []


def test_help_lists_every_flag_both_ways_for_on_off_options() -> None:
    import dataclasses

    from infinity.cli import build_parser
    from infinity.settings import Settings

    serve = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction").choices["serve"]
    shown = serve.format_help()
    for field in dataclasses.fields(Settings):
        if isinstance(field.default, bool):
            name = field.name.replace("_", "-")
            for flag in (f"--{name}", f"--no-{name}"):
                assert re.search(rf"(?<![\w-]){flag}(?![\w-])", shown), flag
