"""bench.coldstart against a real server: exec to first answer, and the server's own account of its start."""
from __future__ import annotations

import re

import pytest

from bench import coldstart


def test_a_cold_start_is_timed_to_the_first_answer_with_the_servers_phases(minilm_fp32_artifact,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    start = coldstart.start_once(minilm_fp32_artifact, coldstart.Path(coldstart.__file__).parents[1], "artifact")
    assert list(start.phases) == ["ready (server's count)", "imports", "checks", "load", "max-length probe",
                                  "routes", "warm-up"]
    phases = [seconds for name, seconds in start.phases.items() if name != "ready (server's count)"]
    assert all(seconds >= 0 for seconds in phases)
    # the phases add up to the server's total (each printed to the millisecond), which the client's count includes
    assert abs(sum(phases) - start.phases["ready (server's count)"]) < 0.01
    assert start.phases["ready (server's count)"] < start.first_answer_s + 0.02  # the process's start is to a tick
    assert start.peak_rss_mib > 0

    assert coldstart.main(["minilm=" + str(minilm_fp32_artifact), "--runs", "1"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "| minilm |" in line)
    assert re.search(r"\| [\d.]+ \([\d.]+-[\d.]+\) \| \d+ \| ready \(server's count\) [\d.]+, imports", row)
