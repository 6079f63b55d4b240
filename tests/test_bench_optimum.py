"""bench/optimum.py: the offline optimum of a budget, priced in requests
and bytes as the storage tier reads them."""

import numpy as np
import pytest
import torch
from benchscripts import load_bench

from hmgraph.cache.disk import DiskModel
from hmgraph.cache.format import write_feature_file
from hmgraph.cache.storage import StorageFeature

optimum = load_bench("optimum")
#: 1,000 reads/s, 1 MB/s: a gap under 1,000 B (one 512 B block) is read
#: through by the tier.
MODEL = DiskModel(block_bytes=512, iops=1_000.0, bandwidth=1e6,
                  queue_depth=4)


@pytest.fixture
def source(tmp_path):
    """64 rows of 128 float32 (512 B: one block each) under `MODEL`."""
    path = tmp_path / "feat.bin"
    write_feature_file(path, torch.arange(64 * 128, dtype=torch.float32)
                       .reshape(64, 128))
    feature = StorageFeature(path, disk=MODEL)
    yield feature
    feature.close()


def test_a_gap_rule_prices_requests_and_bytes(source):
    ids = [np.array([0, 1, 10])]
    alone = optimum.priced(source, ids, 0)
    # Rows 0-1 are one run, row 10 another: 3 blocks in 2 requests.
    assert (alone["requests"], alone["bytes"]) == (2, 3 * 512)
    assert alone["amplification"] == pytest.approx(1.0)
    assert alone["model_seconds"] == pytest.approx(2 / 1e3 + 3 * 512 / 1e6)
    # Gaps under 8 blocks read through: blocks 0-10 in one request.
    through = optimum.priced(source, ids, 8 * 512)
    assert (through["requests"], through["bytes"]) == (1, 11 * 512)
    assert through["amplification"] == pytest.approx(11 / 3)


def test_belady_misses_are_priced_against_no_cache(source):
    trace = [np.array([0, 1, 2, 40]), np.array([0, 1, 3, 50]),
             np.array([2, 3, 60])]
    # Two rows held: warmed with 0 and 1 (asked first), hit twice; then
    # 3, missed by batch 1 and asked by batch 2, replaces them (2 is not
    # read by batch 1, so it cannot come in): 5 hits of 11.
    found = optimum.measure(trace, source, 64, 2)
    assert found["batches"] == 3
    assert found["hit_rate"] == pytest.approx(5 / 11)
    # No cache reads through the one-block gap before row 3: two
    # requests a batch.
    assert found["none"]["requests"] == 2 + 2 + 2
    alone = found["belady"][0]
    assert alone["gap_bytes"] == 0
    # Misses 2, 40 | 3, 50 | 2, 60: six rows, each its own request.
    assert (alone["requests"], alone["bytes"]) == (6, 6 * 512)
    assert alone["seconds_vs_none"] == pytest.approx(
        alone["model_seconds"] / found["none"]["model_seconds"])
    # Holding every row asked: nothing read.
    every = optimum.measure(trace, source, 64, 64)
    assert every["hit_rate"] == pytest.approx(1.0)
    assert all(rule["requests"] == 0 for rule in every["belady"])


def test_targets_name_the_least_seconds_with_low_amplification():
    rules = [dict(gap_bytes=0, amplification=1.0, seconds_vs_none=0.5),
             dict(gap_bytes=4096, amplification=1.8, seconds_vs_none=0.28),
             dict(gap_bytes=9000, amplification=4.0, seconds_vs_none=0.2)]
    best, lean = optimum.targets([{"batches": 10, "belady": rules}])
    assert (best["value"], best["verdict"]) == (0.2, "PASS")
    assert (lean["value"], lean["verdict"]) == (0.28, "PASS")
    assert "gap 4,096 B, amplification 1.80" in lean["what"]
