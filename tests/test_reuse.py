"""Batch reuse: exact rows, counted reuse, bounded buffers."""

from __future__ import annotations

import time

import dgl
import numpy as np
import pytest
import test_cache
import test_engine
import torch
from contract import check_feature_contract
from hypothesis import given, settings
from hypothesis import strategies as st

import hmgraph
from hmgraph.analysis import reuse_filtered
from hmgraph.cache import reuse_engine
from hmgraph.cache.coordinated import FeatureCache, Layer
from hmgraph.cache.feature import TensorFeature
from hmgraph.cache.format import write_feature_file
from hmgraph.cache.plan import make_plan, replay_hits
from hmgraph.cache.policies import make_policy
from hmgraph.cache.reuse import (
    ENGINES,
    TABLE_BYTES_PER_ROW,
    BatchReuse,
    member,
    reuse_profile,
)
from hmgraph.cache.slots import SlotStore
from hmgraph.samplers.presample import Profile, presample

NUM_ROWS = 300


def reference() -> np.ndarray:
    return np.random.default_rng(3).standard_normal(
        (NUM_ROWS, 5)).astype(np.float32)


def make_reuse(levels: int, capacity: int = NUM_ROWS) -> BatchReuse:
    source = TensorFeature(torch.from_numpy(reference()))
    return BatchReuse(FeatureCache(source, []), levels, capacity)


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 50), max_size=40),
       held=st.sets(st.integers(0, 50), max_size=40))
def test_member_matches_sets(ids, held):
    ids_t = torch.tensor(ids, dtype=torch.int64)
    held_t = torch.tensor(sorted(held), dtype=torch.int64)
    found, position = member(ids_t, held_t)
    assert found.tolist() == [i in held for i in ids]
    assert held_t[position].tolist() == [i for i in ids if i in held]


@pytest.mark.parametrize("levels", [1, 2], ids=["one-level", "two-level"])
@pytest.mark.parametrize("capacity", [NUM_ROWS, 7], ids=["roomy", "tight"])
@settings(max_examples=25, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, NUM_ROWS - 1),
                                 max_size=60), min_size=1, max_size=8))
def test_reuse_keeps_the_contract(levels, capacity, batches):
    rows = reference()
    reuse = make_reuse(levels, capacity)
    for ids in batches:
        check_feature_contract(reuse, rows, ids)
        assert reuse.nbytes <= reuse.stats.peak_bytes <= \
            levels * capacity * reuse.row_bytes + reuse.table_bytes
    stats = reuse.stats
    assert stats.rows_requested == sum(len(b) for b in batches)
    reused = sum(stats.reused.values())
    assert stats.bytes_saved == reused * reuse.row_bytes
    # Whatever was not reused was asked of the cache below (which counts
    # an id repeated within a request once; DGL's input nodes never are).
    asked = stats.rows_requested - reused
    if all(len(set(b)) == len(b) for b in batches):
        assert reuse.inner.stats.rows_requested == asked
    else:
        assert reuse.inner.stats.rows_requested <= asked


def test_levels_reuse_what_they_should():
    reuse = make_reuse(levels=2)
    a, b = [1, 2, 3, 4], [3, 4, 5]
    reuse.read(torch.tensor(a))
    reuse.read(torch.tensor(b))  # 3, 4 from level 1
    assert reuse.stats.reused == {"level1": 2, "level2": 0}
    reuse.read(torch.tensor([1, 2, 5, 9]))  # 5 from level 1; 1, 2 level 2
    assert reuse.stats.reused == {"level1": 3, "level2": 2}
    one = make_reuse(levels=1)
    for batch in (a, b, [1, 2, 5, 9]):
        one.read(torch.tensor(batch))
    assert one.stats.reused == {"level1": 3, "level2": 0}


def test_reuse_profile_sizes_and_rate():
    trace = [torch.tensor(t) for t in ([1, 2, 3], [2, 3, 4, 5], [1, 5])]
    one = reuse_profile(trace, 1)
    assert one["rows_per_level"] == [2]  # {2, 3} kept for the next batch
    assert one["reuse_rate"] == pytest.approx(3 / 9)  # 2, 3 then 5
    two = reuse_profile(trace, 2)
    # {2, 3} for the next batch, {1} for the one after: 3 rows, then
    # {5} and the {1} kept: 2; the levels share the 3.
    assert two["rows_per_level"] == [2, 2]
    assert two["reuse_rate"] == pytest.approx(4 / 9)  # and 1 from level 2


@pytest.mark.parametrize("levels", [1, 2])
def test_lookahead_keeps_only_what_comes_and_reuses_as_much(levels):
    """With the next batches' ids a batch keeps only the rows they ask
    for, and reuse serves as many rows as keeping whole batches (the last
    batch, with none to come, keeps its first rows)."""
    rows = torch.from_numpy(reference())
    gen = torch.Generator().manual_seed(levels)
    batches = [torch.randperm(NUM_ROWS, generator=gen)[:40]
               for _ in range(12)]
    whole, ahead = make_reuse(levels), make_reuse(levels)
    for t, ids in enumerate(batches):
        future = [b.sort().values for b in batches[t + 1:t + 1 + levels]]
        assert torch.equal(whole.read(ids), rows[ids])
        assert torch.equal(ahead.read(ids, future), rows[ids])
        if future:
            coming = set(torch.cat(future).tolist())
            wanted = sum(i in coming for i in ids.tolist())
            assert ahead.level_rows(1).shape[0] == wanted < ids.numel()
    assert ahead.stats.reused == whole.stats.reused
    assert sum(ahead.stats.reused.values()) > 0


@pytest.mark.parametrize("capacity", [3, 17])
def test_tight_ring_wraps_and_rows_stay_exact(capacity):
    """Two levels with a lookahead in a ring smaller than a batch: kept
    rows wrap around the ring over rows no level holds, and every batch
    still equals the feature file's rows."""
    rows = torch.from_numpy(reference())
    gen = torch.Generator().manual_seed(capacity)
    batches = [torch.randperm(60, generator=gen)[:25] for _ in range(30)]
    reuse = make_reuse(2, capacity)
    for t, ids in enumerate(batches):
        future = [b.sort().values for b in batches[t + 1:t + 3]]
        assert torch.equal(reuse.read(ids, future), rows[ids])
        assert reuse.held_rows <= 2 * capacity
        for age in (1, 2):
            held = reuse.level_rows(age)
            assert torch.equal(held, rows[_held_ids(reuse, held)])
    assert reuse.stats.reused["level1"] > 0
    # 3 rows a level: the next batch's rows fill the ring; 17: room left.
    assert (reuse.stats.reused["level2"] > 0) == (capacity == 17)
    assert reuse.stats.staging_bytes >= 25 * reuse.row_bytes // 2


def _held_ids(reuse, held):
    """The ids whose rows ``held`` are (rows of `reference` are unique)."""
    table = torch.from_numpy(reference())
    return torch.tensor([int((table == row).all(1).nonzero()[0])
                         for row in held], dtype=torch.int64)


def test_lookahead_keeps_the_next_batch_first_when_tight():
    rows = torch.from_numpy(reference())
    reuse = make_reuse(levels=2, capacity=2)  # 4 rows for both levels
    now = torch.tensor([1, 2, 3, 4, 5, 6])
    reuse.read(now, [torch.tensor([5, 6, 9]), torch.tensor([1, 2, 3])])
    assert torch.equal(reuse.level_rows(1), rows[torch.tensor([5, 6, 1, 2])])
    # Rows 1 and 2 stay for the batch after next; 5 and 6 go after this.
    reuse.read(torch.tensor([5, 7]), [torch.tensor([1, 8])])
    assert torch.equal(reuse.level_rows(2), rows[torch.tensor([1, 2])])
    assert reuse.stats.reused == {"level1": 1, "level2": 0}
    reuse.read(torch.tensor([1, 6]))
    assert reuse.stats.reused == {"level1": 1, "level2": 1}


def test_rows_a_static_device_tier_holds_are_never_buffered():
    """Over a cache whose static device tier holds rows, reuse leaves
    them to the tier (no transfer to save) and buffers only the others;
    rows stay exact, and reset keeps the tier's rows out."""
    rows = reference()
    hot = torch.zeros(NUM_ROWS)
    hot[:10] = 1.0  # rows 0..9 on the device for good
    layer = Layer(make_policy("presample", NUM_ROWS, 10, hotness=hot),
                  [SlotStore("device", NUM_ROWS, (5,), torch.float32, 10)])
    cache = FeatureCache(TensorFeature(torch.from_numpy(rows)), [layer])
    assert cache.static_on_device().nonzero().squeeze(1).tolist() == \
        list(range(10))
    reuse = BatchReuse(cache, 2, NUM_ROWS)
    batches = [torch.arange(0, 30), torch.arange(5, 35),
               torch.arange(8, 40)]
    for step, ids in enumerate(batches):
        assert np.array_equal(reuse.read(ids, batches[step + 1:]).numpy(),
                              rows[ids.numpy()])
        kept = _held_ids(reuse, reuse.level_rows(1))
        assert kept.numel() and int(kept.min()) >= 10
        if step == 0:
            reuse.reset()
            assert reuse.held_rows == 0
    # After the reset batch 1 reuses nothing; batch 2 asks 8..39: 8, 9
    # from the tier, 10..34 from level 1.
    assert reuse.stats.reused == {"level1": 25, "level2": 0}
    assert cache.stats.hits["device"] == 10 + 5 + 2


@pytest.mark.parametrize("policy, pinned", [
    ("hmgraph", list(range(4))), ("lru", None)])
def test_only_pinned_rows_count_as_on_the_device_for_good(policy, pinned):
    """hmgraph pins its static rows (its dynamic region evicts); LRU pins
    none; rows pinned in the host tier are not on the device, though a
    CPU-only run keeps both tiers in one memory."""
    hot = torch.zeros(NUM_ROWS)
    hot[:8] = torch.arange(8, 0, -1).float()
    layer = Layer(make_policy(policy, NUM_ROWS, 10, hotness=hot,
                              static_rows=6, window=2), [
        SlotStore("device", NUM_ROWS, (5,), torch.float32, 4),
        SlotStore("host", NUM_ROWS, (5,), torch.float32, 6)])
    cache = FeatureCache(TensorFeature(torch.from_numpy(reference())),
                         [layer])
    on_device = cache.static_on_device()
    assert (on_device if on_device is None else
            on_device.nonzero().squeeze(1).tolist()) == pinned


def test_plan_takes_reuse_out_of_the_device_budget():
    trace = [torch.arange(i, i + 40) for i in range(0, 100, 20)]
    counts = torch.zeros(NUM_ROWS, dtype=torch.int64)
    table = TABLE_BYTES_PER_ROW * NUM_ROWS
    budget = 200 * 20 + table
    plan = make_plan("lru", NUM_ROWS, 20, budget, 50 * 20,
                     counts=counts, trace=trace, reuse_levels=2)
    # Each batch keeps the 20 rows the next one shares (none reach two
    # ahead): 20 rows held at most, shared by the two levels, 10 each,
    # with 25% headroom: 13.
    assert plan.reuse_rows == 13 and plan.reuse_resident_rows == 0
    assert plan.device_rows == 200 - 2 * 13
    assert "reuse 2 level(s) of 13 device rows" in plan.describe()
    assert plan.as_dict()["reuse_bytes"] == 2 * 13 * 20 + table
    assert plan.as_dict()["reuse_table_bytes"] == table
    with pytest.raises(ValueError, match=f"needs {table} bytes of device "
                       "memory for its id table"):
        make_plan("none", NUM_ROWS, 20, table - 1, 0, trace=trace,
                  reuse_levels=1)


def test_reuse_buffers_are_sized_without_the_rows_the_device_holds():
    """A static device tier serves its rows for good, so batch reuse keeps
    none of them: the buffers are sized again without them, and the rows
    they give back go to the cache."""
    trace = [torch.arange(i, i + 40) for i in range(0, 100, 20)]
    counts = torch.zeros(NUM_ROWS, dtype=torch.int64)
    hot = torch.cat([torch.arange(i, i + 10) for i in (20, 40, 60, 80)])
    counts[hot] = 5  # half of each overlap of two batches
    table = TABLE_BYTES_PER_ROW * NUM_ROWS
    plan = make_plan("presample", NUM_ROWS, 20, 66 * 20 + table, 0,
                     counts=counts, trace=trace, reuse_levels=2,
                     trace_covers_epoch=True)
    # First layout: 13 rows per level (as above) and 66 - 26 = 40 device
    # rows, the hot ones. Without them each batch keeps 10 rows for the
    # next: 5 per level, 7 with headroom; the device gets 52.
    assert plan.reuse_resident_rows == 40
    assert plan.reuse_rows == 7 and plan.device_rows == 66 - 2 * 7
    assert "sized without the 40 rows the device holds" in plan.describe()
    resident = torch.zeros(NUM_ROWS, dtype=torch.bool)
    resident[hot] = True
    profile = reuse_profile(trace, 2, resident)
    assert profile["rows_per_level"] == [5, 5]
    # Rows 30-39, 50-59, 70-79, 90-99 reused, of 200 requested.
    assert profile["reuse_rate"] == 40 / 200
    # A trace of part of the epoch: rows pinned by the first half's counts
    # (batches 0-1 count rows 0-59; the 40 most counted are 0-39), the
    # ring sized on the second half (batches 2-4), as the epoch's batches
    # the profile did not see. None of those rows is in it: each batch
    # still keeps 20 rows for the next, 13 per level, and one sizing
    # stands.
    plan = make_plan("presample", NUM_ROWS, 20, 66 * 20 + table, 0,
                     counts=counts, trace=trace, reuse_levels=2)
    assert plan.reuse_rows == 13 and plan.reuse_resident_rows == 0


SEED_ORDERS = {"shuffled": True, "in-order": False}


@pytest.mark.parametrize("cache", ["hmgraph", "presample"])
def test_buffers_sized_without_pinned_rows_return_file_rows(tiny, cache):
    """A profile of the whole epoch: the plan sizes the buffers again
    without the rows the device tier pins, and rows stay exact."""
    seeds, row_bytes = tiny.split["train"][:700], tiny.features.shape[1] * 4
    loader = hmgraph.DataLoader(
        tiny.graph, seeds, dgl.dataloading.NeighborSampler([4, 4]),
        batch_size=96, shuffle=True, features=tiny.feature_path,
        cache=cache, device_budget_bytes=1500 * row_bytes
        + TABLE_BYTES_PER_ROW * tiny.graph.num_nodes(),
        host_budget_bytes=1000 * row_bytes, prefetch=2, reuse="two-level",
        profile_batches=len(seeds) // 96 + 1)
    plan = loader.plan["_N"]
    assert plan.reuse_resident_rows > 0
    assert plan.device_rows + 2 * plan.reuse_rows <= 1500
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            assert torch.equal(batch.x, tiny.features[batch.input_nodes])
    stats = loader.stats.as_dict()["reuse"]
    assert stats["reused"]["level1"] > 0 and stats["reused"]["level2"] > 0
    assert loader.feature["_N"].nbytes <= plan.as_dict()["reuse_bytes"]
    loader.close()


@pytest.mark.parametrize("reuse", ["one-level", "two-level"])
@pytest.mark.parametrize("cache", [None, "hmgraph", "lru", "presample"])
@pytest.mark.parametrize("shuffle", SEED_ORDERS.values(),
                         ids=SEED_ORDERS.keys())
def test_loader_with_reuse_returns_file_rows(tiny, reuse, cache, shuffle):
    feature_bytes = tiny.features.numel() * 4
    loader = hmgraph.DataLoader(
        tiny.graph, tiny.split["train"][:700],
        dgl.dataloading.NeighborSampler([4, 4]), batch_size=96,
        shuffle=shuffle, features=tiny.feature_path, cache=cache,
        device_budget_bytes=feature_bytes // 2,
        host_budget_bytes=feature_bytes // 4, prefetch=2, reuse=reuse,
        profile_batches=4,
    )
    sizes = []
    for epoch in range(2):  # the second epoch starts after the last batch
        loader.set_epoch(epoch)
        for batch in loader:
            assert torch.equal(batch.x, tiny.features[batch.input_nodes])
            assert torch.equal(batch.y, tiny.labels[batch.output_nodes])
            sizes.append(batch.output_nodes.numel())
    assert sizes[-1] == 700 % 96  # a smaller last batch
    # 4 profiled batches of 8: with a static tier, the buffers are sized
    # on the last 2 without the rows the first 2 pin (held out).
    assert (loader.plan["_N"].reuse_resident_rows > 0) == (
        cache in ("hmgraph", "presample"))
    stats = loader.stats.as_dict()["reuse"]
    assert stats["reused"]["level1"] > 0
    if reuse == "one-level":
        assert stats["reused"]["level2"] == 0
    plan = loader.plan["_N"]
    assert loader.feature["_N"].nbytes <= plan.as_dict()["reuse_bytes"]
    loader.close()


def test_unknown_reuse_is_refused(tiny):
    with pytest.raises(ValueError, match="unknown reuse 'three-level'"):
        hmgraph.DataLoader(tiny.graph, tiny.split["train"],
                           dgl.dataloading.NeighborSampler([2]),
                           reuse="three-level")


@settings(max_examples=60, deadline=None)
@given(ids=st.lists(st.integers(0, 30), max_size=25))
def test_unique_sorted(ids):
    from hmgraph.cache.feature import unique_sorted

    tensor = torch.tensor(ids, dtype=torch.int64)
    unique, inverse = unique_sorted(tensor)
    assert unique.tolist() == sorted(set(ids))
    got = unique if inverse is None else unique[inverse]
    assert got.tolist() == ids


@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize("capacity", [NUM_ROWS, 2], ids=["roomy", "tight"])
def test_writing_into_a_batch_leaves_the_buffers_alone(levels, capacity):
    rows = reference()
    reuse = make_reuse(levels, capacity)
    for ids in ([1, 2, 3], [4, 5], [1, 2, 3], [2, 4, 1]):
        reuse.read(torch.tensor(ids)).zero_()
    again = reuse.read(torch.tensor([1, 2, 3, 4]))
    assert reuse.stats.reused["level1"] + reuse.stats.reused["level2"] > 0
    assert torch.equal(again, torch.from_numpy(rows[[1, 2, 3, 4]]))


class SlowFeature(TensorFeature):
    """Rows from memory, each read taking `DELAY` seconds more."""

    DELAY = 0.05

    def read(self, ids, future=()):
        time.sleep(self.DELAY)
        return super().read(ids)


def test_reuse_seconds_are_all_but_the_reads_below():
    reuse = BatchReuse(SlowFeature(torch.from_numpy(reference())), 2, 50)
    began = time.perf_counter()
    for start in range(0, 200, 20):
        reuse.read(torch.arange(start, start + 40))
    total = time.perf_counter() - began
    stats = reuse.stats
    assert 0 < stats.copy_seconds <= stats.seconds
    assert stats.seconds <= total - 10 * SlowFeature.DELAY
    assert 0 < stats.cpu_seconds <= stats.seconds + 1e-3


def test_reuse_without_a_cache_reuses(tiny):
    loader = hmgraph.DataLoader(
        tiny.graph, tiny.split["train"][:400],
        dgl.dataloading.NeighborSampler([4, 4]), batch_size=100,
        features=tiny.feature_path, device_budget_bytes=2**22,
        host_budget_bytes=0, reuse="two-level", profile_batches=4)
    for _ in loader:
        pass
    loader.close()
    assert loader.stats.reuse is not None


def test_analyze_replays_what_the_loader_runs_with_reuse(tiny):
    """`hmgraph analyze`'s hmgraph+reuse2: the cache is asked for the rows
    reuse did not serve and looks ahead at the next batches whole."""
    n, row_bytes = tiny.num_nodes, tiny.feat_dim * 4
    seeds = tiny.split["train"]
    sampler = dgl.dataloading.NeighborSampler([4, 3])
    profile = presample(tiny.graph, sampler, seeds, 100, 10, seed=5)
    # Two profiled batches of every node: reuse buffers that never cap.
    profile = Profile(profile.counts, profile.hop_counts,
                      [*profile.trace, torch.arange(n), torch.arange(n)])
    table = TABLE_BYTES_PER_ROW * n
    loader = hmgraph.DataLoader(
        tiny.graph, seeds, sampler, batch_size=100, shuffle=True, seed=0,
        features=tiny.features, cache="hmgraph", reuse="two-level",
        device_budget_bytes=n * row_bytes + table,
        host_budget_bytes=1500 * row_bytes, window=4, profile=profile)
    loader.trace = []
    for _ in loader:
        pass
    loader.close()
    plan, stats = loader.plan["_N"], loader.stats
    # The levels share 2 x n / 2 rows: a batch holds at most n at once.
    assert plan.reuse_rows == n // 2 and plan.device_rows == 0
    rest, reused = reuse_filtered(loader.trace, 2)
    assert reused == sum(stats.reuse.reused.values())
    policy = make_policy("hmgraph", n, plan.host_rows,
                         hotness=profile.counts,
                         static_rows=plan.static_rows, window=4)
    hits, requested = replay_hits(policy, rest, 4, lookahead=loader.trace)
    assert requested == stats.cache.rows_requested
    assert hits == stats.cache.hits.get("host", 0)


# The compiled engine against the reference: the same rows and counters
# after every batch of the same recorded traces.

def _counters(reuse: BatchReuse) -> dict:
    """Batch reuse's counters and the cache below's, less the timings."""
    counters = reuse.stats.as_dict()
    del counters["seconds"], counters["cpu_seconds"], \
        counters["copy_seconds"]
    below = reuse.inner.stats.as_dict()
    below.pop("seconds", None)
    return {"reuse": counters, "below": below, "held": reuse.held_rows,
            "nbytes": reuse.nbytes}


def _recorded_trace(tiny, shuffle: bool) -> list[torch.Tensor]:
    """Input nodes of DGL's sampler, batches of 64 train seeds."""
    seeds = tiny.split["train"][:640]
    if shuffle:
        seeds = seeds[torch.randperm(
            seeds.numel(), generator=torch.Generator().manual_seed(5))]
    sampler = dgl.dataloading.NeighborSampler([4, 4])
    dgl.seed(5)
    return [sampler.sample(tiny.graph, seeds[start:start + 64])[0]
            for start in range(0, seeds.numel(), 64)]


def _reuse_over(tiny, trace, levels, capacity, static, engine):
    """Batch reuse over a cache of ``tiny``'s rows; with ``static``, a
    static device tier below holding the trace's 300 most asked rows."""
    layers = []
    if static:
        hot = torch.bincount(torch.cat(trace), minlength=tiny.num_nodes)
        layers = [Layer(
            make_policy("presample", tiny.num_nodes, 300,
                        hotness=hot.float()),
            [SlotStore("device", tiny.num_nodes, (tiny.feat_dim,),
                       torch.float32, 300)])]
    cache = FeatureCache(TensorFeature(tiny.features), layers)
    return BatchReuse(cache, levels, capacity, engine=engine)


@pytest.mark.parametrize("levels", [1, 2], ids=["one-level", "two-level"])
@pytest.mark.parametrize("lookahead", [True, False],
                         ids=["lookahead", "no-lookahead"])
@pytest.mark.parametrize("static", [False, True],
                         ids=["no-tier", "static-tier"])
@pytest.mark.parametrize("capacity", [10_000, 150], ids=["roomy", "tight"])
@pytest.mark.parametrize("shuffle", SEED_ORDERS.values(),
                         ids=SEED_ORDERS.keys())
def test_compiled_reuse_equals_the_reference(tiny, levels, lookahead,
                                             static, capacity, shuffle):
    """Two epochs of a recorded trace (a reset between them): the compiled
    engine returns the reference's rows and moves its counters (and the
    cache below's) alike after every batch."""
    trace = _recorded_trace(tiny, shuffle)
    reference, compiled = (
        _reuse_over(tiny, trace, levels, capacity, static, engine)
        for engine in ("torch", "compiled"))
    assert (reference.engine, compiled.engine) == ("torch", "compiled")
    for epoch in range(2):
        for t, ids in enumerate(trace):
            future = [b.sort().values for b in trace[t + 1:t + 1 + levels]] \
                if lookahead else ()
            expected = reference.read(ids, future)
            got = compiled.read(ids, future)
            assert torch.equal(got, expected)
            assert torch.equal(got, tiny.features[ids])
            assert _counters(compiled) == _counters(reference)
            for age in range(1, levels + 1):
                assert torch.equal(compiled.level_rows(age),
                                   reference.level_rows(age))
        if epoch == 0:
            reference.reset()
            compiled.reset()
    assert sum(compiled.stats.reused.values()) > 0


@pytest.mark.parametrize("levels", [1, 2])
@settings(max_examples=40, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 59), max_size=50),
                        min_size=1, max_size=12),
       capacity=st.integers(0, 40), lookahead=st.booleans())
def test_compiled_reuse_equals_the_reference_on_any_ids(levels, batches,
                                                        capacity, lookahead):
    """Any ids (repeats, empty batches) and ring sizes: the same rows and
    counters."""
    rows = torch.from_numpy(reference())
    tensors, compiled = (
        BatchReuse(FeatureCache(TensorFeature(rows), []), levels, capacity,
                   engine=engine) for engine in ("torch", "compiled"))
    assert ENGINES == ("compiled", "torch")
    trace = [torch.tensor(b, dtype=torch.int64) for b in batches]
    for t, ids in enumerate(trace):
        future = [b.unique() for b in trace[t + 1:t + 1 + levels]] \
            if lookahead else ()
        got = compiled.read(ids, future)
        assert torch.equal(got, tensors.read(ids, future))
        assert torch.equal(got, rows[ids])
        assert _counters(compiled) == _counters(tensors)


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="unknown engine 'numba'; "
                       "available: compiled, torch"):
        BatchReuse(make_reuse(1).inner, 1, 5, engine="numba")


def test_batches_alive_are_never_written_and_let_go_are_reused():
    """The compiled engine hands batches out of buffers it takes again:
    only once nothing (a view, a NumPy array) holds a batch any more."""
    rows = torch.from_numpy(reference())
    reuse = make_reuse(2, 50)
    assert reuse.engine == "compiled"
    starts = range(0, 200, 20)
    alive = {s: reuse.read(torch.arange(s, s + 40)) for s in starts}
    view, array = alive.pop(0)[:3], alive.pop(20).numpy()
    for start in (5, 45, 85, 5, 45):
        reuse.read(torch.arange(start, start + 40)).fill_(-1.0)
    assert torch.equal(view, rows[:3])
    assert np.array_equal(array, rows[20:60].numpy())
    for start, batch in alive.items():
        assert torch.equal(batch, rows[start:start + 40])
    del alive, view, array
    let_go = reuse.read(torch.arange(40)).data_ptr()
    assert reuse.read(torch.arange(1, 41)).data_ptr() == let_go
    assert reuse._batches.nbytes
    reuse.release_buffers()  # an epoch's end: none kept
    assert reuse._batches.nbytes == 0
    assert torch.equal(reuse.read(torch.arange(40)), rows[:40])


@pytest.mark.parametrize("engine", ENGINES)
def test_lookahead_ids_out_of_range_raise_and_change_nothing(engine):
    rows = torch.from_numpy(reference())
    reuse = BatchReuse(FeatureCache(TensorFeature(rows), []), 2, 50,
                       engine=engine)
    reuse.read(torch.arange(10), [torch.arange(5, 15)])
    with pytest.raises((ValueError, IndexError)):
        reuse.read(torch.arange(5, 15), [torch.tensor([3, NUM_ROWS])])
    assert torch.equal(reuse.read(torch.arange(5, 15)), rows[5:15])
    assert reuse.stats.reused["level1"] >= 5


# `FeatureCache.read_into`: batch reuse's cache below writes the rest of
# a batch straight into the batch's rows.

INTO_POLICIES = ["hmgraph", "presample", "lru", "none"]


@pytest.mark.parametrize("kind", test_engine.SOURCES)
@pytest.mark.parametrize("budget", test_cache.BUDGETS.values(),
                         ids=test_cache.BUDGETS.keys())
@pytest.mark.parametrize("policy", INTO_POLICIES)
def test_read_into_decides_and_counts_as_read(policy, budget, kind,
                                              tmp_path):
    """Two caches of one plan read the same batches, one with `read`, one
    with `read_into` at shuffled rows of a larger tensor: the same rows
    at those rows (the others untouched), the same decisions, counters
    and storage counters after every batch."""
    rows = test_cache.reference_rows()
    path = tmp_path / "feat.bin"
    write_feature_file(path, rows)
    caches = [test_cache.make_cache(
        policy, budget, test_cache.make_source(kind, rows, path),
        test_cache.staging_of(kind)) for _ in range(2)]
    read, into = caches
    assert into.reads_in_place == (into.engine == "compiled"
                                   and not into.complete)
    assert into.reads_in_place or policy == "lru" or into.complete
    generator = torch.Generator().manual_seed(2)
    try:
        trace = test_engine.recorded_trace(seed=7)
        uniques = [torch.tensor(b).unique() for b in trace]
        for index, batch in enumerate(trace):
            ids = torch.tensor(batch, dtype=torch.int64)
            future = uniques[index + 1:index + 1 + test_engine.WINDOW]
            out = torch.full((len(batch) + 9, *test_cache.ROW_SHAPE), -7.0)
            at = torch.randperm(out.shape[0], generator=generator)[
                :len(batch)]
            into.read_into(ids, out, at, future)
            expected = read.read(ids, future)
            assert torch.equal(out[at], expected)
            assert np.array_equal(expected.numpy(), rows[batch])
            untouched = torch.ones(out.shape[0], dtype=torch.bool)
            untouched[at] = False
            assert bool((out[untouched] == -7.0).all())
            assert test_engine.state(into) == test_engine.state(read), \
                f"batch {index} decided otherwise"
    finally:
        for cache in caches:
            cache.close()


def test_read_into_with_repeated_ids_reads_each_once():
    rows = torch.from_numpy(reference())
    cache = FeatureCache(TensorFeature(rows), [])
    assert cache.reads_in_place
    out = torch.zeros((6, 5))
    cache.read_into(torch.tensor([4, 9, 4]), out, torch.tensor([5, 0, 2]))
    assert torch.equal(out[[5, 0, 2]], rows[[4, 9, 4]])
    assert cache.stats.rows_requested == 2  # each row read once


@pytest.mark.parametrize("out, positions, message", [
    (torch.zeros((4, 5), dtype=torch.float64), [0, 1], "out must be"),
    (torch.zeros((4, 6)), [0, 1], "out must be"),
    (torch.zeros((4, 5)), [0], "positions must be 2 int64"),
    (torch.zeros((4, 5)), torch.tensor([0, 1], dtype=torch.int32),
     "positions must be 2 int64"),
    (torch.zeros((4, 5)), [0, 4], r"positions must lie in \[0, 4\)"),
    (torch.zeros((4, 5)), [-1, 2], r"positions must lie in \[0, 4\)"),
], ids=["dtype", "row-shape", "count", "int32", "past-the-end", "negative"])
def test_read_into_refuses_bad_targets(out, positions, message):
    cache = FeatureCache(TensorFeature(torch.from_numpy(reference())), [])
    before = out.clone()
    with pytest.raises(ValueError, match=message):
        cache.read_into(torch.tensor([1, 2]), out, torch.as_tensor(
            positions, dtype=torch.int64) if isinstance(positions, list)
            else positions)
    assert torch.equal(out, before)
    assert cache.stats.rows_requested == 0


def test_kernels_are_ready_at_construction():
    """Construction loads every kernel for the types a read passes: the
    first batches add no compiled version (no compile in the epoch)."""
    kernels = [reuse_engine.stamp_ids, reuse_engine.scan_batch,
               reuse_engine.sort_rest, reuse_engine.gather_batch,
               reuse_engine.gather_reused, reuse_engine.write_ring]
    rows = torch.from_numpy(reference())
    reuse = make_reuse(2, 40)
    assert reuse.engine == "compiled"
    loaded = [len(kernel.signatures) for kernel in kernels]
    assert all(loaded)
    for start in range(0, 200, 30):
        ids = torch.arange(start, start + 60).flip(0)
        got = reuse.read(ids, [torch.arange(start + 30, start + 90)])
        assert torch.equal(got, rows[ids])
    assert sum(reuse.stats.reused.values()) > 0
    assert [len(kernel.signatures) for kernel in kernels] == loaded
