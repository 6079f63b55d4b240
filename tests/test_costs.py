"""What the per-batch mechanisms cost, and the planner turning off what
does not pay (`hmgraph.cache.costs`, `hmgraph.cachebuild`)."""

import logging
import math

import dgl
import numpy as np
import pytest
import torch

import hmgraph
from hmgraph.cache.costs import (
    KernelCosts,
    Verdict,
    lost_hit_share,
    measure_kernel_costs,
    random_rows,
    reuse_verdict,
    reused_rows,
    spared_read_seconds,
    window_verdict,
)
from hmgraph.cache.disk import DiskModel
from hmgraph.cache.feature import TensorFeature
from hmgraph.cache.reuse import BatchReuse, reuse_profile

#: Round figures: 10 ns a lookup, 5 a table write, 2 a radix pass, 40 a
#: row copied; nothing transferred (a CPU device).
COSTS = KernelCosts(scan=10e-9, stamp=5e-9, sort_pass=2e-9, copy_row=40e-9,
                    row_bytes=400)


def test_kernel_costs_are_measured_once_and_positive():
    costs = measure_kernel_costs(400)
    for name in ("scan", "stamp", "sort_pass", "copy_row"):
        value = getattr(costs, name)
        assert math.isfinite(value) and 0 < value < 1e-5, (name, value)
    assert costs.transfer_bytes_per_s is None and costs.transfer_row() == 0
    assert measure_kernel_costs(400) is costs  # cached for the process
    # A longer row takes longer to copy.
    assert measure_kernel_costs(4096).copy_row > costs.copy_row
    with pytest.raises(ValueError, match="row_bytes must be positive, got 0"):
        measure_kernel_costs(0)


def test_verdict_says_on_off_or_kept():
    pays = Verdict("window of 4", 2e-3, 1e-3, "x")
    assert pays.pays
    assert pays.describe("window=4") == (
        "window of 4 on: saves 2.00 ms a batch, costs 1.00 ms (x)")
    loses = Verdict("window of 4", 1e-3, 2e-3, "x")
    assert not loses.pays
    assert loses.describe("window=4").endswith("(x); window=4 forces it")
    assert "off" in loses.describe("window=4")
    kept = loses.describe("reuse='two-level'", forced=True)
    assert "kept though it does not pay" in kept
    assert kept.endswith("reuse='two-level' asks for it")


def test_reuse_profile_counts_rows_and_kept_rows_per_batch():
    trace = [torch.tensor(t) for t in ([1, 2, 3], [2, 3, 4, 5], [1, 5])]
    one = reuse_profile(trace, 1)
    assert one["rows_per_batch"] == pytest.approx(9 / 3)
    assert one["kept_per_batch"] == pytest.approx((2 + 1 + 0) / 3)
    two = reuse_profile(trace, 2)
    # Batch 0 keeps {2, 3} and {1} (for batch 2); batch 1 keeps {5}.
    assert two["kept_per_batch"] == pytest.approx((3 + 1 + 0) / 3)


def test_reuse_verdict_prices_the_work_and_what_it_spares():
    sizing = {"reuse_rate": 0.5, "rows_per_batch": 1000.0,
              "kept_per_batch": 600.0}
    # In memory on a CPU: a reused row spares one gather (40 ns) and
    # costs a scan, stamps, copies: it never pays.
    memory = reuse_verdict(1, sizing, COSTS, hit_rate=0.2, read_s=0.0,
                           num_rows=1 << 22)
    assert memory.saves == pytest.approx(500 * 40e-9)
    passes = 2  # 22-bit ids, 11 bits a pass
    assert memory.costs == pytest.approx(
        1000 * (10e-9 + 5e-9) + 500 * passes * 2e-9 + 500 * 40e-9
        + 600 * (40e-9 + 5e-9))
    assert not memory.pays
    # Sparing 1 ms of reads a batch, it pays.
    disk = reuse_verdict(2, sizing, COSTS, hit_rate=0.2, read_s=1e-3,
                         num_rows=1 << 22)
    assert disk.saves == pytest.approx(500 * 40e-9 + 1e-3)
    assert disk.pays and disk.mechanism == "batch reuse (two-level)"
    assert "1.00 ms of reads spared" in disk.detail
    # A transfer spared counts too.
    gpu = KernelCosts(**{**COSTS.__dict__, "transfer_bytes_per_s": 400e6})
    spared = reuse_verdict(1, sizing, gpu, 1.0, 0.0, 1 << 22)
    assert spared.saves == pytest.approx(500 * (40e-9 + 1e-6))


def test_the_ring_is_charged_the_device_room_it_takes():
    counts = torch.tensor([5.0, 1.0, 3.0, 1.0])
    # Held by count: rows 0, 2, then 1 and 3; from 3 rows to 1, rows 2
    # and 1 (stable) go: 4 of 10 requests.
    assert lost_hit_share(counts, counts, 3, 1) == pytest.approx(0.4)
    assert lost_hit_share(counts, counts, 3, 3) == 0
    # Ranked by another score (layer-aware), its order decides.
    score = torch.tensor([0.0, 3.0, 2.0, 1.0])
    assert lost_hit_share(counts, score, 2, 1) == pytest.approx(0.3)
    sizing = {"reuse_rate": 0.5, "rows_per_batch": 1000.0,
              "kept_per_batch": 600.0}
    gpu = KernelCosts(**{**COSTS.__dict__, "transfer_bytes_per_s": 400e6})
    free = reuse_verdict(1, sizing, gpu, 0.5, 0.0, 1 << 22)
    charged = reuse_verdict(1, sizing, gpu, 0.5, 0.0, 1 << 22, lost=0.1,
                            lost_read_s=2e-3)
    # 100 rows a batch cross that the device held, and 2 ms of reads.
    assert charged.costs - free.costs == pytest.approx(100 * 1e-6 + 2e-3)
    assert charged.saves == free.saves
    assert "10.0% of rows lost to the ring" in charged.detail
    assert "2.00 ms added" in charged.detail


def test_the_ring_room_is_what_the_plan_reserves():
    """`reuse_ring_rows` prices a ring before planning it: the device rows
    of the id table and the buffers `make_plan` reserves (at most: the
    plan may shrink the ring by the rows its device tier holds for
    good)."""
    from hmgraph.cache.plan import make_plan, reuse_ring_rows

    rng = np.random.default_rng(0)
    trace = [torch.from_numpy(np.unique(rng.integers(0, 5000, 800)))
             for _ in range(8)]
    counts = torch.bincount(torch.cat(trace), minlength=5000).float()
    args = ("hmgraph", 5000, 400, 400 * 2000, 400 * 500)
    plain = make_plan(*args, counts=counts, trace=trace)
    table = 5000 * 12
    for levels in (1, 2):
        ring = make_plan(*args, counts=counts, trace=trace,
                         reuse_levels=levels)
        taken = reuse_ring_rows(ring, levels, reuse_profile(trace, levels),
                                table)
        assert taken == -(-table // 400) + levels * ring.reuse_rows
        assert ring.device_rows + taken == plain.device_rows
        priced = reuse_ring_rows(plain, levels,
                                 reuse_profile(trace, levels), table)
        assert taken <= priced <= plain.device_rows


def test_auto_reuse_skips_levels_the_budget_cannot_hold(tiny, caplog):
    """A device budget below the id table: ``reuse="auto"`` plans none
    and says why; an explicit level still refuses the budget."""
    kwargs = dict(device_budget_bytes=1000)
    loader = _loader(tiny, caplog, reuse="auto", **kwargs)
    assert loader.plan["_N"].reuse_levels == 0
    said = [r.getMessage() for r in caplog.records]
    assert any(s.startswith("batch reuse (one-level) not planned: its "
                            "id table takes ") and s.endswith("is 1000")
               for s in said), said
    for batch in loader:
        assert torch.equal(batch.x, tiny.features[batch.input_nodes])
    loader.close()
    with pytest.raises(ValueError, match="bytes of device memory for its"):
        _loader(tiny, caplog, reuse="one-level", **kwargs)


def test_window_verdict():
    off = window_verdict(4, 1000.0, 0.0, COSTS, 0.0)
    assert off.saves == 0 and off.costs == pytest.approx(3 * 4 * 1000 * 5e-9)
    assert not off.pays
    on = window_verdict(4, 1000.0, 0.01, COSTS, 2e-4)
    assert on.saves == pytest.approx(2e-4) and on.pays


class _File:
    """What `spared_read_seconds` reads of a storage tier: 8-byte rows,
    512 B blocks, no gap read through, 1,000 reads/s and 1 MB/s."""

    geometry = (8, 0, 512)
    max_gap_blocks = 0
    disk = DiskModel(iops=1000.0, bandwidth=1e6, queue_depth=1,
                     block_bytes=512)


def test_spared_reads_are_planned_and_priced_as_the_tier_reads():
    assert spared_read_seconds(TensorFeature(torch.zeros(4, 2)),
                               [torch.arange(4)], 1.0, random_rows(1.0)) == 0
    # Rows 0, 64 and 128 lie on blocks 0, 1 and 2: one run of 3 blocks.
    trace = [torch.tensor([0, 64, 128])]
    whole = 1 / 1000 + 3 * 512 / 1e6
    middle = spared_read_seconds(
        _File(), trace, 1.0, lambda t, ids: np.array([False, True, False]))
    assert middle == pytest.approx(whole - (2 / 1000 + 2 * 512 / 1e6))
    assert middle < 0  # two runs cost more than one: nothing is saved
    last = spared_read_seconds(
        _File(), trace, 1.0, lambda t, ids: np.array([False, False, True]))
    assert last == pytest.approx(512 / 1e6)
    # All spared: the whole read; no misses: nothing.
    assert spared_read_seconds(_File(), trace, 1.0, random_rows(1.0)) == \
        pytest.approx(whole)
    assert spared_read_seconds(_File(), trace, 0.0, random_rows(1.0)) == 0


def test_reused_rows_are_those_of_the_last_levels_batches():
    trace = [torch.tensor(t) for t in ([1, 2, 3], [2, 3, 4, 5], [1, 5])]
    one, two = reused_rows(trace, 1), reused_rows(trace, 2)
    assert not one(0, trace[0]).any()
    assert one(1, trace[1]).tolist() == [True, True, False, False]
    assert one(2, trace[2]).tolist() == [False, True]
    assert two(2, trace[2]).tolist() == [True, True]


def _loader(tiny, caplog, **kwargs):
    feature_bytes = tiny.features.numel() * 4
    kwargs = {"device_budget_bytes": feature_bytes // 2,
              "host_budget_bytes": feature_bytes // 4, **kwargs}
    with caplog.at_level(logging.INFO, logger="hmgraph.cachebuild"):
        return hmgraph.DataLoader(
            tiny.graph, tiny.split["train"][:700],
            dgl.dataloading.NeighborSampler([4, 4]), batch_size=96,
            shuffle=True, features=tiny.features, cache="hmgraph",
            profile_batches=4, **kwargs)


def test_features_in_memory_turn_reuse_and_window_off(tiny, caplog):
    """On a CPU with rows in memory neither mechanism saves more than it
    costs: the plan turns both off, says so, and rows stay exact."""
    loader = _loader(tiny, caplog, reuse="auto")
    assert not isinstance(loader.feature["_N"], BatchReuse)
    assert loader.plan["_N"].reuse_levels == 0
    assert loader.window == 0 and loader.plan["_N"].window == 0
    said = [r.getMessage() for r in caplog.records]
    assert any(s.startswith("batch reuse (") and " off: " in s
               and "forces it" in s for s in said), said
    assert any(s.startswith("window of 4 off: ") and "window=4 forces it"
               in s for s in said), said
    for batch in loader:
        assert torch.equal(batch.x, tiny.features[batch.input_nodes])
    loader.close()


def test_an_explicit_setting_forces_what_does_not_pay(tiny, caplog):
    loader = _loader(tiny, caplog, reuse="two-level", window=4)
    assert isinstance(loader.feature["_N"], BatchReuse)
    assert loader.window == 4 and loader.plan["_N"].window == 4
    said = [r.getMessage() for r in caplog.records]
    assert any("batch reuse (two-level) kept though it does not pay" in s
               and s.endswith("reuse='two-level' asks for it")
               for s in said), said
    assert not any(s.startswith("window of") for s in said), said
    for batch in loader:
        assert torch.equal(batch.x, tiny.features[batch.input_nodes])
    loader.close()
