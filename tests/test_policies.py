"""Cache policies keep their rules with bookkeeping that never scans the
graph: LRU evicts exactly the least recently used rows, sizes are counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from hmgraph.cache.feature import TensorFeature
from hmgraph.cache.plan import (
    build_cache,
    make_plan,
    metadata_bytes,
    store_metadata_bytes,
)
from hmgraph.cache.policies import POLICIES, StaticPolicy, make_policy


def random_trace(num_rows, batches, seed):
    generator = torch.Generator().manual_seed(seed)
    trace = []
    for _ in range(batches):
        size = int(torch.randint(1, num_rows // 2, (), generator=generator))
        ids = torch.randperm(num_rows, generator=generator)[:size]
        trace.append(ids.sort().values)
    return trace


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("capacity", [1, 7, 30, 64])
def test_lru_evicts_exactly_the_least_recently_used(seed, capacity):
    num_rows = 64
    policy = make_policy("lru", num_rows, capacity)
    for ids in random_trace(num_rows, 40, seed):
        before = policy.resident.clone()
        step = policy.step(ids)
        assert torch.equal(step.hit, before[ids])
        assert before[step.evict].all()  # only held rows are evicted
        miss = ids[~step.hit]
        assert torch.equal(step.admit, miss[:capacity])
        kept = policy.resident & before  # held before and after
        if step.evict.numel() and kept.any():
            # Every evicted row was used no later than every kept one.
            assert policy.last_use[step.evict].max() <= \
                policy.last_use[kept].min()
        assert policy.size == int(policy.resident.sum()) <= capacity


@pytest.mark.parametrize("name", ["lru", "clock", "hmgraph", "degree"])
def test_size_is_counted_not_scanned(name):
    num_rows = 200
    context = {"hotness": torch.rand(num_rows),
               "degrees": torch.randint(0, 9, (num_rows,)),
               "static_rows": 10}
    policy = make_policy(name, num_rows, 50, **context)
    policy.warm()
    assert policy.size == int(policy.resident.sum())
    trace = random_trace(num_rows, 30, 1)
    for index, ids in enumerate(trace):
        policy.step(ids, trace[index + 1:index + 4])
        assert policy.size == int(policy.resident.sum())


@pytest.mark.parametrize("name", ["lru", "clock", "hmgraph", "degree",
                                  "presample"])
def test_metadata_charge_matches_what_is_allocated(name):
    """The bytes a policy class declares per node and per slot (what the
    plan charges to the host budget) are what it allocates: measured by
    storage, so a view that keeps a graph-long tensor alive shows."""
    num_rows, capacity = 5000, 300
    context = {"hotness": torch.rand(num_rows),
               "degrees": torch.randint(0, 9, (num_rows,)),
               "static_rows": 100}
    policy = make_policy(name, num_rows, capacity, **context)
    policy.warm()
    charge = type(policy).metadata_bytes(num_rows, capacity)
    trace = random_trace(num_rows, 30, 2)
    largest = max(ids.numel() for ids in trace)
    for index, ids in enumerate(trace):
        policy.step(ids, trace[index + 1:index + 4])
        measured = policy.metadata_nbytes()
        # LRU's groups may exceed twice the capacity by a batch or two
        # before compaction: working set, not bookkeeping.
        assert measured <= charge + 2 * 8 * largest, (measured, charge)
    if name != "lru":  # the dynamic region is full by now
        assert policy.metadata_nbytes() == charge


PLAN_SOURCE = Path(__file__).resolve().parents[1] / "cache" / "plan.py"


def test_the_plan_asks_the_policy_not_its_name():
    """No string in cache/plan.py names a policy: what the plan needs of
    one (capacity rules, bookkeeping, pinned rows, window, static split)
    is asked of its class."""
    tree = ast.parse(PLAN_SOURCE.read_text())
    names = set(POLICIES) | {"fifo", "static"}
    found = [(node.lineno, node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in names]
    assert not found, f"cache/plan.py names policies at {found}"


class FirstRowsPolicy(StaticPolicy):
    """A policy new to the plan: holds the rows of lowest id."""

    name = "first-rows"

    def __init__(self, num_rows, capacity, **_):
        super().__init__(num_rows, capacity,
                         -torch.arange(num_rows, dtype=torch.float64))


def test_a_new_policy_is_one_class(monkeypatch):
    """Registered, a policy class is planned and built by its class
    alone: one layer over both stores, its bookkeeping charged."""
    monkeypatch.setitem(POLICIES, FirstRowsPolicy.name, FirstRowsPolicy)
    num_rows, row_bytes = 100, 16
    host = 20 * row_bytes + metadata_bytes("first-rows", num_rows, 10, 20)
    plan = make_plan("first-rows", num_rows, row_bytes, 10 * row_bytes,
                     host)
    assert (plan.device_rows, plan.host_rows) == (10, 20)
    assert plan.metadata_bytes()["host"] == (
        FirstRowsPolicy.node_bytes * num_rows + FirstRowsPolicy.slot_bytes
        * 30 + store_metadata_bytes(num_rows, 30))
    rows = torch.arange(num_rows * 4, dtype=torch.float32).reshape(-1, 4)
    cache = build_cache(TensorFeature(rows), plan, engine="torch")
    assert [layer.policy.name for layer in cache.layers] == ["first-rows"]
    ids = torch.tensor([0, 5, 15, 40])
    assert torch.equal(cache.read(ids), rows[ids])
    assert cache.stats.as_dict()["hits"] == {"device": 2, "host": 1,
                                             "source": 1}


@pytest.mark.parametrize("name", [n for n in POLICIES if n != "belady"])
def test_layer_capacities_follow_the_class(name):
    cls = POLICIES[name]
    layers = cls.layer_capacities((10, 0, 20))
    if not cls.holds_rows:
        assert layers == []
    elif cls.spans_stores:
        assert layers == [30]
    else:
        assert layers == [10, 20]
    assert cls.layout_metadata((10, 20)) == (
        cls.node_bytes * len(layers), cls.slot_bytes * sum(layers))


NEEDED = {"degrees": torch.arange(100).flip(0), "hotness": torch.rand(100),
          "hop_counts": torch.randint(0, 5, (3, 100))}


@pytest.mark.parametrize("name", [n for n in POLICIES if n != "belady"])
def test_a_policy_needs_what_it_says(name):
    """Built with what ``needs`` names it works; without any one of them
    it refuses in one line."""
    cls = POLICIES[name]
    make_policy(name, 100, 10, **{k: NEEDED[k] for k in cls.needs})
    for missing in cls.needs:
        given = {k: NEEDED[k] for k in cls.needs if k != missing}
        with pytest.raises(ValueError, match=f"policy '{name}' needs"):
            make_policy(name, 100, 10, **given)


def test_the_loader_profiles_for_the_policies_that_need_a_profile():
    from hmgraph.loader import PROFILED_POLICIES

    assert set(PROFILED_POLICIES) == {
        n for n, c in POLICIES.items()
        if c.needs & {"hotness", "hop_counts"}}


@pytest.mark.parametrize("window", [0, 1, 4])
@pytest.mark.parametrize("capacity,static", [(0, 0), (40, 0), (150, 50),
                                             (150, 150), (499, 100)])
def test_a_replay_decides_as_the_reference_policy(capacity, static,
                                                  window):
    """`replay_hits` steps the hmgraph policy through the compiled
    engine's kernel: every batch's hits and misses, and the rows held
    after it, equal the reference's `HMGraphPolicy.step`."""
    from hmgraph.cache.trace_replay import replay_hits

    gen = torch.Generator().manual_seed(capacity + window)
    num_rows = 500
    hotness = torch.randint(0, 50, (num_rows,), generator=gen)
    trace = [torch.unique(torch.randint(0, num_rows, (int(size),),
                                        generator=gen))
             for size in torch.randint(0, 300, (12,), generator=gen)]

    def fresh():
        return make_policy("hmgraph", num_rows, capacity, hotness=hotness,
                           static_rows=static, window=window)

    reference, compiled = fresh(), fresh()
    reference.warm()
    expected = []
    for i, ids in enumerate(trace):
        step = reference.step(ids, trace[i + 1:i + 1 + window])
        expected.append(ids[~step.hit])
    missed = []
    hits, requested = replay_hits(compiled, trace, on_miss=missed.append)
    assert requested == sum(ids.numel() for ids in trace)
    assert hits == requested - sum(m.numel() for m in expected)
    assert all(torch.equal(a, b) for a, b in zip(missed, expected,
                                                      strict=True))
    assert torch.equal(compiled.resident, reference.resident)
    assert compiled._size == reference._size
    assert sorted(compiled._held.tolist()) == sorted(
        reference._held.tolist())


def test_one_sort_serves_every_ranking_of_the_same_counts():
    """Within `rankings_kept`, `hot_first` (a stable descending sort)
    and `split_profile` compute once per tensor while it lives and is
    not written to; out of it, and after it, nothing is kept."""
    import gc

    from hmgraph.cache import policy_base
    from hmgraph.cache.policy_base import hot_first, rankings_kept
    from hmgraph.cache.trace_replay import split_profile

    counts = torch.tensor([3, 7, 7, 0, 5])
    assert hot_first(counts).tolist() == [1, 2, 4, 0, 3]
    assert hot_first(counts) is not hot_first(counts)  # no scope
    trace = [torch.tensor([0, 1]), torch.tensor([1, 2]),
             torch.tensor([2, 3]), torch.tensor([4])]
    with rankings_kept():
        order = hot_first(counts)
        with rankings_kept():  # nested: the same store
            assert hot_first(counts) is order
        assert hot_first(counts) is order
        counts[3] = 9  # written to: sorted again
        assert hot_first(counts).tolist() == [3, 1, 2, 4, 0]
        hotness, held_out = split_profile(trace, 5)
        assert hotness.tolist() == [1, 2, 1, 0, 0]
        assert held_out == trace[2:]
        assert split_profile(list(trace), 5)[0] is hotness
        other, _ = split_profile([trace[0], trace[2], trace[3]], 5)
        assert other.tolist() == [1, 1, 0, 0, 0]  # not the first's
        kept = len(policy_base._KEPT)
        del counts, order
        gc.collect()
        assert len(policy_base._KEPT) == kept - 1  # let go with the tensor
    assert policy_base._KEPT is None  # and all of it with the scope
    assert split_profile(trace, 5)[0] is not hotness
