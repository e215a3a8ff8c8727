"""The bulk benchmark against a real server: a slice of the corpus in multi-text OpenAI requests from two clients."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.bulk import BulkJob, cosine_min, ours, ours_streamed, reference
from bench.corpus import build
from tests.models import minilm_dir


def test_a_bulk_run_reports_every_answer_faithful_little_padding_and_alone_as_batched(minilm_int8_artifact: Path):
    texts = build(count=160)
    run = ours(minilm_int8_artifact, BulkJob(texts, batch=32, clients=2), threads=1, sample=list(range(0, 160, 9)))
    assert not run.errors and run.vectors.shape == (160, 384)
    assert cosine_min(run.vectors, reference(minilm_dir(), texts)) >= 0.99
    assert run.alone_identical is True
    assert run.padded_per_real is not None and run.padded_per_real <= 1.1, run.padded_per_real


def test_the_corpus_as_embedstream_messages_answers_every_text_as_the_bulk_requests_do(minilm_int8_artifact: Path):
    """One message a text, over one stream a client: every text answered, in its place, bit for bit what the OpenAI
    bulk requests answered (a per-token INT8 graph answers alike however it is batched)."""
    texts = build(count=120)
    job = BulkJob(texts, batch=16, clients=2)
    streamed, requested = ours_streamed(minilm_int8_artifact, job, threads=1), ours(minilm_int8_artifact, job, 1, [])
    assert not streamed.errors and streamed.vectors.shape == (120, 384)
    assert np.array_equal(streamed.vectors, requested.vectors)
