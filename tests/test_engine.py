"""The compiled engine against the reference, on the same traces.

Two caches are built from one plan, one reading through the compiled
engine (`hmgraph.cache.engine`), one through the tensor code it replaces
(``engine="torch"``), and both read the same recorded batches with the
same lookahead: rows, counters, storage counters and every policy
decision (what each store holds, the policy's state) must be identical
after every batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cache import (
    BUDGETS,
    NUM_ROWS,
    make_cache,
    make_source,
    staging_of,
)

from hmgraph.cache.disk import read_plan
from hmgraph.cache.engine import select_along

#: The policies the compiled engine serves; the others read through the
#: reference whatever the engine asked.
COMPILED = ["hmgraph", "presample", "degree", "layer-aware", "none"]
#: Policies stepped in torch (`compiled.STEPPED`): compiled with one
#: store (one layer); a layer a store, they read through the reference.
STEPPED = ["lru", "clock"]
ONE_STORE = {k: v for k, v in BUDGETS.items() if 0 in v}
SOURCES = ["memory", "storage", "storage-staged"]
WINDOW = 3


def pair(policy, budget, kind, rows, feature_path):
    caches = []
    for engine in ("compiled", "torch"):
        source = make_source(kind, rows, feature_path)
        cache = make_cache(policy, budget, source, staging_of(kind))
        if engine == "torch":
            cache._compiled, cache.engine = None, "torch"
        caches.append(cache)
    return caches


def state(cache) -> dict:
    """Everything a decision changes: store contents, policy state."""
    record = {"stats": {k: v for k, v in cache.stats.as_dict().items()
                        if k != "seconds"}}
    for store in cache.stores + ([cache.staging] if cache.staging else []):
        held = store.id_of[store.id_of >= 0]
        record[store.name] = sorted(held.tolist())
        slots = store.slots(held)
        record[store.name + "-rows"] = store.gather(slots).numpy().tobytes() \
            if held.numel() else b""
    for layer in cache.layers:
        policy = layer.policy
        record["resident"] = policy.resident.nonzero().flatten().tolist()
        record["size"] = policy.size
        if hasattr(policy, "_held"):
            record["held"] = sorted(policy._held.tolist())
    storage = getattr(cache.source, "stats", None)
    if storage is not None:
        record["storage"] = {k: v for k, v in storage.as_dict().items()
                             if "seconds" not in k}
    return record


def run_trace(caches, batches, rows):
    """Read ``batches`` (lists of ids) through both caches, comparing."""
    uniques = [torch.from_numpy(np.unique(np.asarray(b, dtype=np.int64)))
               for b in batches]
    for index, batch in enumerate(batches):
        ids = torch.tensor(batch, dtype=torch.int64)
        future = uniques[index + 1:index + 1 + WINDOW]
        got = [cache.read(ids, future) for cache in caches]
        expected = rows[np.asarray(batch, dtype=np.int64)]
        for out in got:
            assert out.numpy().tobytes() == expected.tobytes()
        compiled, reference = (state(cache) for cache in caches)
        assert compiled == reference, f"batch {index} decided otherwise"


def recorded_trace(seed: int, batches: int = 12) -> list[list[int]]:
    """Batches like DGL's input nodes: unique, in no order, skewed."""
    generator = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, NUM_ROWS + 1).double() ** 0.7
    trace = []
    for _ in range(batches):
        ids = torch.multinomial(weights, 150, generator=generator)
        trace.append(ids.tolist())
    return trace


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("budget", BUDGETS.values(), ids=BUDGETS.keys())
@pytest.mark.parametrize("policy", COMPILED)
def test_compiled_engine_decides_as_the_reference(policy, budget, kind,
                                                  rows, feature_path):
    caches = pair(policy, budget, kind, rows, feature_path)
    try:
        assert caches[0].engine == "compiled"
        run_trace(caches, recorded_trace(seed=7), rows)
    finally:
        for cache in caches:
            cache.close()


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("budget", ONE_STORE.values(), ids=ONE_STORE.keys())
@pytest.mark.parametrize("policy", STEPPED)
def test_a_stepped_policy_is_compiled_and_decides_as_the_reference(
        policy, budget, kind, rows, feature_path):
    """lru and clock step in torch once the reads succeed; the engine
    does the rest: the same rows, tables, counters and policy state."""
    caches = pair(policy, budget, kind, rows, feature_path)
    try:
        assert caches[0].engine == "compiled"
        # (host-only with staging: staging and the policy's bookkeeping
        # take the whole host budget, and no layer is built)
        assert caches[0]._compiled.stepped == bool(caches[0].layers)
        run_trace(caches, recorded_trace(seed=7), rows)
    finally:
        for cache in caches:
            cache.close()


#: Hypothesis draws: a policy, a budget, a source and batches of any ids.
ANY_BATCHES = {
    "policy": st.sampled_from(["hmgraph", "presample"]),
    "budget": st.sampled_from(list(BUDGETS.values())),
    "kind": st.sampled_from(SOURCES),
    "batches": st.lists(st.lists(st.integers(0, NUM_ROWS - 1),
                                 max_size=150), min_size=1, max_size=8)}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**ANY_BATCHES)
def test_compiled_engine_equals_the_reference_on_any_batches(
        policy, budget, kind, batches, rows, feature_path):
    """Any ids, repeats and empty batches included."""
    read_alike(policy, budget, kind, batches, rows, feature_path)


def read_alike(policy, budget, kind, batches, rows, feature_path):
    """`run_trace` of ``batches`` on a fresh `pair`, closed after."""
    caches = pair(policy, budget, kind, rows, feature_path)
    try:
        run_trace(caches, batches, rows)
    finally:
        for cache in caches:
            cache.close()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**dict(ANY_BATCHES, policy=st.sampled_from(STEPPED),
              budget=st.sampled_from(list(ONE_STORE.values()))))
def test_a_stepped_policy_equals_the_reference_on_any_batches(
        policy, budget, kind, batches, rows, feature_path):
    """lru and clock, one store: any ids, repeats and empty batches."""
    read_alike(policy, budget, kind, batches, rows, feature_path)


def test_layouts_the_engine_does_not_serve_read_through_the_reference(
        rows, feature_path):
    source = make_source("memory", rows, feature_path)
    cache = make_cache("lru", (20, 60), source)
    assert cache.engine == "torch"
    assert cache._compiled is None


@pytest.mark.parametrize("batch_size", [8, 512], ids=["sparse", "dense"])
def test_window_read_planning_follows_its_verdict(data_root, batch_size,
                                                  caplog):
    """synth-tiny at fanouts 10,10 from the disk: staging is planned where
    its priced verdict says it pays, said in one log line either way
    (`hmgraph.cache.staging_model`); batches of 512 ask for most rows,
    and a staging area taken from the cache spares no read there. An
    explicit share is kept; features in memory are never staged."""
    import logging

    import dgl

    from hmgraph import DataLoader, datasets

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    sampler = dgl.dataloading.NeighborSampler([10, 10])
    budget = data.feature_bytes // 5
    options = dict(batch_size=batch_size, cache="hmgraph",
                   host_budget_bytes=budget, profile_batches=8, seed=0)
    seeds = data.split["train"][:8 * batch_size]
    with caplog.at_level(logging.INFO, logger="hmgraph.cachebuild"):
        loader = DataLoader(data.graph, seeds, sampler,
                            features=data.feature_path, **options)
    loader.close()
    said = [r.getMessage() for r in caplog.records
            if r.getMessage().startswith("window read planning")]
    assert len(said) == 1, said
    staged = loader.plan["_N"].staging_rows > 0
    assert said[0].startswith("window read planning on" if staged
                              else "window read planning off")
    if batch_size == 512:
        assert not staged
    forced = DataLoader(data.graph, seeds, sampler, staging=0.5,
                        features=data.feature_path, **options)
    forced.close()
    assert forced.plan["_N"].staging_rows > 0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hmgraph.cachebuild"):
        memory = DataLoader(data.graph, seeds, sampler, features=datasets.load(
            "synth-tiny", data_root).features, **options)
    memory.close()
    assert memory.plan["_N"].staging_rows == 0
    assert "window read planning" not in caplog.text


def test_a_batch_buffer_is_reused_only_once_nobody_holds_it():
    from hmgraph.cache.buffers import BufferPool

    pool = BufferPool((4,), torch.float32, size=2)
    first = pool.empty(100)
    first.fill_(1.0)
    kept = first[10:20]  # a view the caller keeps
    del first
    second = pool.empty(100)
    assert second.data_ptr() != kept.data_ptr() - 10 * 16
    second.fill_(2.0)
    assert bool((kept == 1.0).all())  # never overwritten
    as_numpy = second.numpy()
    del second
    third = pool.empty(50)  # both pooled buffers are still held
    assert third.data_ptr() not in (kept.data_ptr() - 10 * 16,
                                    as_numpy.ctypes.data)
    del kept, as_numpy
    fourth = pool.empty(80)
    assert fourth.shape == (80, 4)
    pointers = {base.data_ptr() for base, _ in pool._buffers}
    assert fourth.data_ptr() in pointers  # memory reused


def test_an_outgrown_batch_buffer_is_remade_for_the_largest_batch():
    """A batch larger than every idle buffer replaces one of them, sized
    for the largest batch so far: batches that shrink and grow again do
    not remake it each time (the CI once saw four buffers in a pool of
    three, uncounted)."""
    from hmgraph.cache.buffers import BufferPool

    pool = BufferPool((4,), torch.float32, size=1)
    pool.empty(100)  # let go of at once
    pool.empty(400)  # outgrows the first: remade
    assert pool.regrown == 1 and pool.overflows == 0
    base = pool._buffers[0][0].data_ptr()
    for rows in (50, 400, 120, 390, 410):  # within the room kept
        assert pool.empty(rows).data_ptr() == base
    assert pool.regrown == 1 and pool.overflows == 0


def test_a_full_batch_pool_waits_for_the_consumer_then_stays_bounded():
    """A reader that finds every kept buffer held waits a moment for the
    consumer to let go of its last batch (it does so just after taking the
    next), so the batches in flight stay at the pool's size."""
    import threading

    from hmgraph.cache.buffers import BufferPool

    pool = BufferPool((4,), torch.float32, size=2)
    pool.wait_seconds = 2.0  # a loaded machine's thread may start late
    held = [pool.empty(100), pool.empty(100)]
    bases = {base.data_ptr() for base, _ in pool._buffers}
    release = threading.Timer(0.05, held.pop, args=(0,))
    release.start()
    third = pool.empty(100)
    release.join()
    assert third.data_ptr() in bases and len(pool._buffers) == 2
    # Nobody lets go: one more buffer is made, but not kept.
    pool.wait_seconds = 0.01
    fourth = pool.empty(100)
    assert fourth.data_ptr() not in bases and len(pool._buffers) == 2
    pool.resize(1)
    assert len(pool._buffers) == 1 and pool.size == 1


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("policy", ["hmgraph", "presample"])
def test_frozen_views_read_alike_through_both_engines(policy, kind, rows,
                                                      feature_path):
    """Evaluation reads (`FrozenView`) after a trace: same rows, same
    counters, and the cache left exactly as it was."""
    from hmgraph.cache.coordinated import FrozenView

    caches = pair(policy, BUDGETS["small"], kind, rows, feature_path)
    try:
        run_trace(caches, recorded_trace(seed=3, batches=5), rows)
        def held(cache):  # what the stores and the policy hold
            return {k: v for k, v in state(cache).items() if k != "storage"}

        before = [held(cache) for cache in caches]
        views = [FrozenView(cache) for cache in caches]
        for ids in ([5, 1, 5, 300, 2], list(range(0, 600, 7)), []):
            got = [view.read(torch.tensor(ids, dtype=torch.int64))
                   for view in views]
            for out in got:
                assert out.numpy().tobytes() == rows[ids].tobytes()
        assert views[0].stats.as_dict() | {"seconds": 0} == \
            views[1].stats.as_dict() | {"seconds": 0}
        assert [held(cache) for cache in caches] == before
    finally:
        for cache in caches:
            cache.close()


def test_batch_buffers_are_let_go_at_an_epochs_end(data_root):
    """Within an epoch the cache's batches land in reused buffers; when
    the epoch ends none is kept, through every tier."""
    import dgl

    from hmgraph import DataLoader, datasets

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    loader = DataLoader(
        data.graph, data.split["train"][:512],
        dgl.dataloading.NeighborSampler([5, 5]), batch_size=64,
        features=data.feature_path, cache="hmgraph",
        host_budget_bytes=data.feature_bytes // 5, seed=0)
    from hmgraph.cache.storage import StorageFeature

    pool = loader.cache["_N"]._compiled.pool
    pointers = set()
    file = StorageFeature(data.feature_path)
    try:
        for batch in loader:
            assert torch.equal(batch.x, file.read(batch.input_nodes))
            pointers.add(batch.x.data_ptr())
            del batch
            assert len(pool._buffers) <= pool.size
        assert len(pointers) < len(loader)  # memory was reused
        assert pool._buffers == []
        assert loader.cache["_N"].source._rows._buffers == []
    finally:
        loader.close()
        file.close()


@pytest.mark.parametrize("prefetch", [0, 1])
def test_an_interleaving_loader_keeps_a_buffer_per_batch_in_flight(
        data_root, prefetch):
    """The cache reads batch i + 1 while batch i trains and looks up batch
    i + 2, even at ``prefetch=0``: the pool keeps a buffer for each, and
    no batch finds them all held (sized one short, it made a fresh one,
    page faults and all, for every batch)."""
    import dgl

    from hmgraph import DataLoader, datasets

    data = datasets.load("synth-tiny", data_root, features_on="disk")
    loader = DataLoader(
        data.graph, data.split["train"][:768],
        dgl.dataloading.NeighborSampler([5, 5]), batch_size=64,
        features=data.feature_path, cache="hmgraph", prefetch=prefetch,
        host_budget_bytes=data.feature_bytes // 5, seed=0)
    try:
        assert loader.cache["_N"].interleaves
        pool = loader.cache["_N"]._compiled.pool
        batches = 0
        for batch in loader:  # the loop holds each batch until the next
            batches += batch.x.shape[0] > 0
        assert batches == 12 and pool.size == 3 and pool.overflows == 0
    finally:
        loader.close()


def test_a_staged_hit_is_copied_before_its_slot_is_refilled(rows,
                                                            feature_path):
    """Batch 1 hits row 1 in staging and no later batch needs it: its slot
    is let go and refilled at once by a row brought along with batch 1's
    own read (row 41, on row 40's block). The hit must be the old row.
    The reads finish before `read_into_later` returns here, so a copy of
    the hit after the refill would be caught every time, not by a race."""
    from hmgraph.cache.coordinated import FeatureCache
    from hmgraph.cache.storage import StorageFeature

    class Eager(StorageFeature):
        def read_into_later(self, *args):
            super().read_into_later(*args)()
            return lambda: None

    for engine in ("compiled", "torch"):
        source = Eager(feature_path, num_threads=2)
        with FeatureCache(source, [], staging_rows=4, engine=engine) as cache:
            batches = [([0], [[1], [2]]), ([1, 40], [[41]]), ([41], [])]
            for ids, future in batches:
                got = cache.read(torch.tensor(ids), [torch.tensor(f)
                                                      for f in future])
                assert got.numpy().tobytes() == rows[ids].tobytes(), engine
            assert cache.stats.hits["staged"] == 2  # rows 1 and 41


def select_along_reference(future, bounds, marks, resident, layered,
                           staged_slot_of, missed, run_first, run_last,
                           row_bytes, data_offset, block_bytes, limit):
    """`engine.select_along` by the definition: binary searches, no walk."""
    chosen, missed = [], set(missed.tolist())
    for d in range(1, len(bounds)):
        for node in future[bounds[d - 1]:bounds[d]]:
            if marks[node] != min(d, 127) or (layered and resident[node]) \
                    or staged_slot_of[node] >= 0 or node in missed:
                continue
            start = data_offset + node * row_bytes
            low = start // block_bytes
            high = (start + row_bytes - 1) // block_bytes
            run = np.searchsorted(run_first, low, side="right") - 1
            if run >= 0 and high <= run_last[run]:
                chosen.append(int(node))
    chosen.sort(key=lambda node: (marks[node], node))
    return sorted(chosen[:limit])


@settings(max_examples=200, deadline=None)
@given(data=st.data(), sort=st.booleans(), layered=st.booleans())
def test_select_along_walks_sorted_batches_as_binary_search_finds(
        data, sort, layered):
    """The walk over sorted window batches (and the search again where a
    batch is not sorted) takes the rows the definition takes."""
    num_rows, row_bytes = 300, 100
    ids = st.integers(0, num_rows - 1)
    batches = data.draw(st.lists(st.lists(ids, unique=True, max_size=60),
                                 min_size=1, max_size=4))
    if sort:
        batches = [sorted(batch) for batch in batches]
    future = np.array([i for batch in batches for i in batch], np.int64)
    bounds = np.cumsum([0] + [len(batch) for batch in batches])
    marks = np.zeros(num_rows, np.int8)
    for d in range(len(batches), 0, -1):  # the nearest batch's distance
        marks[np.asarray(batches[d - 1], np.int64)] = d
    resident = np.array(data.draw(st.lists(st.booleans(), min_size=num_rows,
                                           max_size=num_rows)))
    staged = np.where(np.array(data.draw(st.lists(
        st.booleans(), min_size=num_rows, max_size=num_rows))), 0, -1)
    missed = np.array(sorted(data.draw(st.sets(ids, min_size=1))), np.int64)
    plan = read_plan(missed, row_bytes, 4096, 512, data.draw(
        st.integers(0, 8)))
    limit = data.draw(st.integers(0, 80))
    args = (future, bounds, marks, resident, layered, staged, missed,
            plan.run_first, plan.run_last, row_bytes, 4096, 512, limit)
    got = select_along(*args, num_rows)
    assert got.tolist() == select_along_reference(*args)
