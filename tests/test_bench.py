"""The benchmark's own parts: statistics, exact-length inputs, the load generator, the vanilla baseline."""
from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from bench.inprocess import predict
from bench.loadgen import closed_loop, open_loop
from bench.process import Server, cpu_list
from bench.stats import percentile, summarize
from bench.texts import text_with_tokens
from bench.vanilla_server import create_app
from tests.test_server_process import server  # noqa: F401  (a real server process on a free port)


def test_percentiles_are_nearest_rank():
    samples = [float(v) for v in range(1, 101)]
    assert [percentile(samples, q) for q in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    summary = summarize([2.0, 4.0], wall_s=0.5, requests=2)
    assert summary["throughput_rps"] == 4.0 and summary["avg_ms"] == 3.0 and summary["max_ms"] == 4.0


@pytest.mark.parametrize("tokens", [8, 128, 256])
def test_texts_have_exactly_the_requested_number_of_tokens(minilm_fp32_artifact: Path, tokens: int):
    from infinity.engine.tokenization import TextTokenizer

    path = minilm_fp32_artifact / "tokenizer.json"
    text = text_with_tokens(str(path), tokens)
    assert len(TextTokenizer(path, 512, 0).encode([text])[0]) == tokens


def test_load_generator_drives_a_real_server(server):  # noqa: F811
    _, port, _ = server
    payload = {"inputs": "a short text"}
    closed = asyncio.run(closed_loop(port, payload, concurrency=4, requests=20, max_seconds=60))
    assert not closed.errors and len(closed.latencies_ms) == 20 and len(closed.compute_ms) == 20
    opened = asyncio.run(open_loop(port, payload, rate=20, seconds=1))
    assert not opened.errors and len(opened.latencies_ms) == 20
    refused = asyncio.run(closed_loop(port, {"inputs": ""}, concurrency=1, requests=3, max_seconds=60))
    assert refused.errors == {"400": 3} and not refused.latencies_ms


def test_vanilla_baseline_serves_the_transformers_pipeline(artifacts):
    source = artifacts.source("distilbert-tiny")
    with TestClient(create_app(str(source), threads=1)) as client:
        response = client.post("/predict", json={"inputs": "hello world"})
    assert response.status_code == 200 and "x-compute-time" in response.headers
    [answer] = response.json()
    assert answer["label"] in {"negative", "neutral", "positive"} and 0 < answer["score"] <= 1


def test_bench_runs_as_modules():
    import subprocess
    run = subprocess.run([sys.executable, "-m", "bench", "run", "--help"], capture_output=True, text=True)
    assert run.returncode == 0 and "--quick" in run.stdout


def test_every_suite_is_reached_from_the_one_entry_and_no_module_has_its_own(capsys: pytest.CaptureFixture[str]):
    import bench.__main__ as entry

    modules = {path.stem for path in Path(entry.__file__).parent.glob("*.py")
               if "def main(" in path.read_text(encoding="utf-8")} - {"__main__"}
    assert set(entry.SUITES.values()) == modules
    for path in Path(entry.__file__).parent.glob("*.py"):
        assert path.name == "__main__.py" or 'if __name__ == "__main__"' not in path.read_text(encoding="utf-8")
    for name in entry.SUITES:
        with pytest.raises(SystemExit) as exited:
            entry.main([name, "--help"])
        assert exited.value.code == 0, name
        assert f"python -m bench {name}" in capsys.readouterr().out, name
    assert entry.main(["no-such-suite"]) == 2


def test_short_request_figures_come_from_one_alternating_run(minilm_fp32_artifact: Path):
    """Ours and the bare server, each timed in every round; the bare one does the same work as the pipeline."""
    import numpy as np
    import orjson

    from bench.loadgen import Connection
    from bench.short import servers, short_requests, table
    from infinity.engine.model import LoadedModel

    model = LoadedModel.load(minilm_fp32_artifact, threads=1)
    with servers(minilm_fp32_artifact, 1) as (port, bare_port):
        async def ask(text: str) -> tuple[int, bytes]:
            connection = Connection("127.0.0.1", bare_port)
            try:
                status, _, body = await connection.post("/predict", orjson.dumps({"inputs": text}))
                return status, body
            finally:
                await connection.close()

        status, body = asyncio.run(ask("what the bare server embeds"))
        assert status == 200
        assert np.allclose(orjson.loads(body), predict(model, "what the bare server embeds"), atol=1e-6)
        result = short_requests(port, model, str(minilm_fp32_artifact / "tokenizer.json"), seq=8, rounds=2,
                                seconds=0.2, bare_port=bare_port)
    assert len(result["rounds"]) == 2
    for row in result["rounds"]:
        assert row["c16_over_engine8"] == row["http_c16_rps"] / row["in_process_batch8_seq_s"] > 0
        assert row["c1_overhead_ms"] == row["http_c1_p50_ms"] - row["in_process_p50_ms"]
        assert row["c1_over_bare_ms"] == row["http_c1_p50_ms"] - row["bare_c1_p50_ms"]
        assert row["bare_overhead_ms"] == row["bare_c1_p50_ms"] - row["in_process_p50_ms"]
    assert result["median"]["http_c16_p99_ms"] >= result["median"]["http_c16_p50_ms"] > 0
    assert table("m", result)[0].count("|") == 12 and " - |" not in table("m", result)[0]


def test_well_behaved_clients_are_each_answered_in_turn(server):  # noqa: F811
    from bench.abuse import well_behaved

    _, port, _ = server
    normal = asyncio.run(well_behaved(port, 1.0, 3))
    assert not normal.errors and len(normal.latencies_ms) >= 3 and min(normal.latencies_ms) > 0


def test_the_retry_storm_runs_from_its_own_process_and_sees_429s(server):  # noqa: F811
    from bench.abuse import loop_cpu_s, storm_process

    process, port, _ = server
    before = loop_cpu_s(process.pid)
    summary, latencies, ok, refused, served = storm_process(port, 1.5, nice=5)
    assert ok == len(latencies) == len(served) > 0 and refused > 0  # 300 clients overflow the 160 places by default
    assert all(0 < inside < at_client for inside, at_client in zip(served, latencies))
    assert f"{refused} x 429" in summary
    assert loop_cpu_s(process.pid) > before


def test_the_profile_names_each_operator_types_share(minilm_fp32_artifact: Path):
    from bench.kernels import profile

    by_type, run = profile(minilm_fp32_artifact / "model.onnx", batch=1, sequence=8, runs=3)
    # the fp32 artifact as the server loads it: its residual LayerNorms stay unfused
    assert by_type.get("LayerNormalization", 0) > 0 and "SkipLayerNormalization" not in by_type
    assert by_type.get("Attention", 0) > 0 and run > 0


def test_servers_can_be_pinned_to_cpus_of_their_own():
    assert cpu_list("0-3,8") == {0, 1, 2, 3, 8}
    assert cpu_list("5") == {5}
    one = {min(os.sched_getaffinity(0))}
    pinned = Server([sys.executable, "-c", "import time; time.sleep(60)"], 0, cpus=one)
    try:
        assert os.sched_getaffinity(pinned.process.pid) == one
    finally:
        pinned.stop()


def test_the_efficiency_suite_counts_minilm_int8_work_from_its_graph(minilm_int8_artifact: Path) -> None:
    """Every weight GEMM of the six layers (Q, K, V, output, FFN in and out) and the attention nodes, from the
    graph; then one short measurement whose figures are positive (their size is the host's business)."""
    from bench.efficiency import measure, work
    from infinity.manifest import Manifest

    counted = work(minilm_int8_artifact / Manifest.load(minilm_int8_artifact).model.file)
    assert (counted.hidden, counted.intermediate, counted.layers) == (384, 1536, 6)
    assert counted.gemm_macs == 6 * (4 * 384 * 384 + 2 * 384 * 1536)
    assert counted.ops_per_token(64) == 2 * (counted.gemm_macs + 6 * 2 * 64 * 384)
    [row] = measure(minilm_int8_artifact, [(2, 16)], threads=1, seconds=0.05, rounds=1)
    assert row["tokens_per_s"] > 0 and row["ceiling_tops"] > 0 and row["efficiency"] > 0
