"""The feature cache: every tier and policy returns the feature file's rows.

One contract (`contract.check_feature_contract`) runs against every cache
configuration, in memory and over the O_DIRECT storage tier, with
Hypothesis-generated id sequences; counters and budgets are asserted too.
"""

from __future__ import annotations

import threading

import dgl
import numpy as np
import pytest
import torch
from contract import check_feature_contract
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hmgraph
from hmgraph.cache.budget import check_available, parse_budget
from hmgraph.cache.coordinated import (
    CacheStats,
    FeatureCache,
    FrozenView,
)
from hmgraph.cache.feature import TensorFeature, check_ids
from hmgraph.cache.plan import (
    build_cache,
    make_plan,
    metadata_bytes,
    replay,
)
from hmgraph.cache.policies import (
    POLICIES,
    BeladyPolicy,
    make_policy,
)
from hmgraph.cache.storage import StorageFeature

NUM_ROWS = 600
ROW_SHAPE = (7,)  # 28-byte rows: rows straddle pages on disk
CACHE_POLICIES = [name for name in POLICIES if name != "belady"]
BUDGETS = {  # (device rows, host rows)
    "small": (20, 60),
    "device-only": (50, 0),
    "host-only": (0, 80),
    "all-rows": (200, 400),
}


def reference_rows(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((NUM_ROWS, *ROW_SHAPE)).astype(np.float32)


def profile_trace(seed: int = 1, batches: int = 8) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = 1.0 / torch.arange(1, NUM_ROWS + 1).double()
    return [torch.multinomial(weights, 90, replacement=True,
                              generator=generator).unique()
            for _ in range(batches)]


def make_cache(policy: str, budget, source, staging=0.0,
               engine="compiled") -> FeatureCache:
    trace = profile_trace()
    counts = torch.zeros(NUM_ROWS, dtype=torch.int64)
    for ids in trace:
        counts[ids] += 1
    row_bytes = source.row_bytes
    host = budget[1] * row_bytes
    if host:  # the host budget pays for the cache's bookkeeping too
        host += metadata_bytes(policy, NUM_ROWS, budget[0], budget[1])
    plan = make_plan(policy, NUM_ROWS, row_bytes, budget[0] * row_bytes,
                     host, counts=counts, trace=trace, window=2,
                     staging=staging)
    degrees = torch.arange(NUM_ROWS).flip(0)
    hop_counts = torch.stack([counts, counts // 2])
    cache = build_cache(source, plan, counts=counts, degrees=degrees,
                        hop_counts=hop_counts, engine=engine)
    cache.test_plan, cache.test_host_budget = plan, host
    return cache


SOURCES = ["memory", "storage", "storage-staged"]


def make_source(kind, rows, feature_path):
    if kind == "memory":
        return TensorFeature(torch.from_numpy(rows.copy()))
    return StorageFeature(feature_path, num_threads=2)


def staging_of(source_kind: str) -> float:
    """Window read planning with half the host budget, over storage."""
    return 0.5 if source_kind == "storage-staged" else 0.0


id_batches = st.lists(
    st.lists(st.integers(0, NUM_ROWS - 1), max_size=120),
    min_size=1, max_size=6,
)


@pytest.mark.parametrize("budget", BUDGETS.values(), ids=BUDGETS.keys())
@pytest.mark.parametrize("policy", CACHE_POLICIES)
@pytest.mark.parametrize("source_kind", SOURCES)
@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=id_batches)
def test_contract_every_policy(rows, feature_path, source_kind, policy,
                               budget, batches):
    """Every read equals the feature file, whatever the ids and policy.

    The counters are checked against what the stores held before each
    read: a row is counted as a hit of the first store that held it,
    staged rows as ``staged``, the rest as ``source`` (and read from it);
    admissions and evictions are the rows each store gained and lost.
    """
    source = make_source(source_kind, rows, feature_path)
    with make_cache(policy, budget, source,
                    staging_of(source_kind)) as cache:
        expected = CacheStats()
        batches = [*batches, [NUM_ROWS - 1, 0, NUM_ROWS - 1], []]
        for index, ids in enumerate(batches):
            future = [torch.tensor(sorted(set(b)), dtype=torch.int64)
                      for b in batches[index + 1:index + 3]]
            before = snapshot(cache)
            check_feature_contract(cache, rows, ids, future=future)
            add_expected(expected, cache, before, set(ids))
            assert nonzero(cache.stats.hits) == nonzero(expected.hits)
            assert nonzero(cache.stats.admitted) == nonzero(expected.admitted)
            assert nonzero(cache.stats.evicted) == nonzero(expected.evicted)
            assert cache.stats.bytes == expected.bytes
        assert cache.stats.requests == len(batches)
        assert cache.stats.rows_requested == sum(len(set(b))
                                                 for b in batches)
        assert store_ids_are_consistent(cache)
        # No tier ever holds more than its budget; staging is host memory,
        # and so is the bookkeeping, charged to the host budget.
        held = tier_bytes(cache)
        metadata = cache.metadata_nbytes()["host"]
        charged = cache.test_plan.metadata_bytes()["host"]
        assert metadata <= charged
        assert held["device"] <= budget[0] * cache.row_bytes, held
        if budget[1]:
            assert held["host"] + charged <= cache.test_host_budget, held
        else:  # no host budget: no host rows, the bookkeeping unbudgeted
            assert held["host"] == 0
            assert cache.test_plan.as_dict()[
                "metadata_unbudgeted_bytes"] == charged
        if cache.staging is not None:
            # Nothing outlives the window (the last batch has no future).
            assert cache.staging.size == 0


def tier_bytes(cache) -> dict[str, int]:
    """Bytes of the row buffers allocated on the device and in host memory
    (host and staged stores)."""
    stores = list(cache.stores)
    if cache.staging is not None:
        stores.append(cache.staging)
    held = {"device": 0, "host": 0}
    for store in stores:
        tier = "device" if store.name == "device" else "host"
        held[tier] += store.buffer.numel() * store.buffer.element_size()
    return held


def held_ids(store) -> set[int]:
    """Ids a slot store holds, read from its slot -> id table."""
    return set(store.id_of[store.id_of >= 0].tolist())


def nonzero(counter: dict) -> dict:
    return {key: value for key, value in counter.items() if value}


def snapshot(cache) -> dict:
    """What a cache holds, before a read (see `add_expected`)."""
    source_stats = getattr(cache.source, "stats", None)
    return {
        "stores": [(store, held_ids(store)) for store in cache.stores],
        "staged": (held_ids(cache.staging) if cache.staging is not None
                   else set()),
        "source_rows": getattr(source_stats, "rows_read", None),
    }


def add_expected(expected: CacheStats, cache, before: dict,
                 asked: set[int]) -> None:
    """Add to ``expected`` what the counters of one read must show.

    Worked out from what the stores held before the read and after it, not
    from the cache's own bookkeeping: each asked row is a hit of the first
    store that held it (layer by layer, device first), else of the staging
    store, else it is read from the source; admissions and evictions are
    the rows each store gained and lost.
    """
    pending = set(asked)
    hits = {}
    for store, held in before["stores"]:
        served = pending & held
        hits[store.name] = hits.get(store.name, 0) + len(served)
        pending -= served
    hits["staged"] = len(pending & before["staged"])
    pending -= before["staged"]
    hits["source"] = len(pending)
    changes = [(store.name, held, held_ids(store))
               for store, held in before["stores"]]
    brought = 0  # rows staged for the next batches, read along
    if cache.staging is not None:
        staged_now = held_ids(cache.staging)
        changes.append(("staged", before["staged"], staged_now))
        brought = len(staged_now - before["staged"])
    for name, held, now in changes:
        if name != "staged":  # the tiers admit rows of this read only
            assert now - held <= asked, name
        for counter, rows in ((expected.admitted, now - held),
                              (expected.evicted, held - now)):
            counter[name] = counter.get(name, 0) + len(rows)
    for tier, count in hits.items():
        expected.hits[tier] = expected.hits.get(tier, 0) + count
    row_bytes = cache.row_bytes
    expected.bytes["host->device"] += row_bytes * (
        len(asked) - hits.get("device", 0))
    expected.bytes["storage->host"] += row_bytes * (len(pending) + brought)
    if before["source_rows"] is not None:  # the source read exactly those
        assert cache.source.stats.rows_read - before["source_rows"] == \
            len(pending) + brought


def store_ids_are_consistent(cache) -> bool:
    """Slot tables agree, and the hmgraph layer is exclusive."""
    seen = torch.zeros(cache.num_rows, dtype=torch.int64)
    for store in cache.stores:
        held = store.id_of[store.id_of >= 0]
        assert held.numel() == store.size
        assert torch.equal(store.slots(held),
                           (store.id_of >= 0).nonzero().squeeze(1))
        seen[held] += 1
        # Every held row is the file's row.
        slots = store.slots(held)
        assert torch.equal(store.gather(slots).cpu(),
                           cache.source.read(held))
    if cache.layers and len(cache.layers[0].stores) > 1:
        assert int(seen.max()) <= 1, "a row in two tiers of one layer"
    return True


@pytest.mark.parametrize("policy", ["lru", "clock", "hmgraph"])
def test_second_read_makes_no_storage_read(rows, feature_path, policy):
    source = make_source("storage", rows, feature_path)
    with make_cache(policy, BUDGETS["all-rows"], source) as cache:
        ids = torch.randperm(NUM_ROWS)[:150]
        check_feature_contract(cache, rows, ids)
        pages = source.stats.blocks_read
        missed = cache.stats.hits["source"]
        assert pages > 0 and missed <= 150
        check_feature_contract(cache, rows, ids)
        assert source.stats.blocks_read == pages
        assert cache.stats.hits["source"] == missed


def test_static_policies_fill_the_hottest_rows_device_first(rows):
    source = TensorFeature(torch.from_numpy(rows))
    cache = make_cache("degree", BUDGETS["small"], source)
    device, host = cache.stores
    degrees = torch.arange(NUM_ROWS).flip(0)  # row 0 has the top degree
    assert set(device.id_of.tolist()) == set(range(20))
    assert set(host.id_of.tolist()) == set(range(20, 80))
    assert degrees[device.id_of].min() > degrees[host.id_of].max()


@pytest.mark.parametrize("policy", ["presample", "hmgraph"])
def test_static_fill_reads_the_file_in_order(rows, feature_path, monkeypatch,
                                             policy):
    # Chunks of 16 rows; in rank order each would span most of the file.
    monkeypatch.setattr("hmgraph.cache.layer.WARM_CHUNK_ROWS", 16)
    source = make_source("storage", rows, feature_path)
    chunks, read = [], source.read
    monkeypatch.setattr(source, "read", lambda ids: chunks.append(ids)
                        or read(ids))
    with make_cache(policy, BUDGETS["small"], source) as cache:
        device, host = cache.stores
        warm = cache.layers[0].policy.warm()
        assert len(chunks) > 2 and torch.equal(torch.cat(chunks),
                                               warm.sort().values)
        # File order: no block is read twice but where two chunks meet.
        blocks = -(-feature_path.stat().st_size // source.stats.block_bytes)
        assert source.stats.blocks_read <= blocks + len(chunks)
        # The ranking still decides the store: the device's are the first.
        assert set(device.id_of.tolist()) == set(
            warm[:device.capacity].tolist())
        assert set(host.id_of[host.id_of >= 0].tolist()) == set(
            warm[device.capacity:].tolist())
        check_feature_contract(cache, rows, warm)


def test_hmgraph_plan_is_chosen_from_the_profile(rows):
    trace = profile_trace(batches=10)
    counts = torch.zeros(NUM_ROWS, dtype=torch.int64)
    for ids in trace:
        counts[ids] += 1
    # hmgraph's bookkeeping: per node 10 B of policy state and the 4 B
    # id -> slot table its two stores share; per row 8 B of held ids, 20 B
    # of slot tables.
    metadata = NUM_ROWS * (10 + 4) + (20 + 60) * (8 + 20)
    plan = make_plan("hmgraph", NUM_ROWS, 28, 20 * 28, 60 * 28 + metadata,
                     counts=counts, trace=trace, window=2)
    assert len(plan.curve) > 2
    best = max(point["hit_rate"] for point in plan.curve)
    chosen = [p for p in plan.curve if p["static_rows"] == plan.static_rows]
    assert chosen and chosen[0]["hit_rate"] == pytest.approx(best, abs=1e-4)
    record = plan.as_dict()
    assert record["device_rows"] == 20 and record["host_rows"] == 60
    assert record["device_static_rows"] + record["host_static_rows"] == \
        plan.static_rows
    assert "static" in plan.describe()


@settings(max_examples=30, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 59), min_size=1,
                                 max_size=25), min_size=1, max_size=12),
       capacity=st.integers(0, 40))
def test_belady_is_the_ceiling(batches, capacity):
    """No policy hits more than Belady's on the same trace and capacity."""
    trace = [torch.tensor(sorted(set(b)), dtype=torch.int64)
             for b in batches]
    num_rows = 60
    opt = BeladyPolicy(num_rows, capacity)
    opt.set_trace(trace)
    best = replay(opt, trace)
    hotness = torch.zeros(num_rows)
    for ids in trace:
        hotness[ids] += 1
    context = dict(degrees=hotness, hotness=hotness, window=3,
                   static_rows=capacity // 2,
                   hop_counts=torch.stack([hotness, hotness.flip(0)]))
    for name in CACHE_POLICIES:
        rate = replay(make_policy(name, num_rows, capacity, **context),
                      trace)
        assert rate <= best + 1e-12, (name, rate, best)


def test_unknown_policy_lists_the_names():
    with pytest.raises(ValueError, match="available: none, degree"):
        make_policy("fifo", 10, 5)
    with pytest.raises(ValueError, match="unknown cache policy 'fifo'"):
        make_plan("fifo", 10, 4, 0, 0)


BUDGET_TEXTS = {
    "512MB": ("512MB", None, 512 * 10**6),
    "2GB": ("2GB", None, 2 * 10**9),
    "1GiB": ("1GiB", None, 2**30),
    "bytes": ("4096", None, 4096),
    "share": ("10%", 1000, 100),
    "int": (77, None, 77),
}


@pytest.mark.parametrize("text,total,expected", BUDGET_TEXTS.values(),
                         ids=BUDGET_TEXTS.keys())
def test_parse_budget(text, total, expected):
    assert parse_budget(text, total) == expected


@pytest.mark.parametrize("text,match", [
    ("lots", "invalid budget 'lots'"), ("5XB", "invalid budget '5XB'"),
    ("120%", "more than 100%"), ("-3MB", "invalid budget"),
], ids=["word", "unit", "over-100", "negative"])
def test_parse_budget_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_budget(text, 1000)


def test_budget_larger_than_memory_is_refused():
    with pytest.raises(ValueError, match=r"host budget .* exceeds the .* "
                       r"available on cpu"):
        check_available("host", 10**18, "cpu")


def test_check_ids_names_the_largest_bad_id():
    with pytest.raises(ValueError, match=r"id 912 out of range: 2 ids "
                       r"outside \[0, 600\) for 600 rows"):
        check_ids(torch.tensor([3, 700, 912, 5]), 600)
    with pytest.raises(TypeError, match="int64 or int32"):
        check_ids(torch.tensor([1.0]), 600)


def test_rows_in_memory_come_in_reused_buffers_never_overwritten(rows):
    """An in-memory feature gathers into buffers kept for the batches in
    flight: the rows equal ``rows[ids]``, a buffer nobody holds is
    reused, and rows a caller holds are never written over."""
    feature = TensorFeature(torch.from_numpy(rows.copy()))
    ids = torch.randperm(len(rows))[:300]
    fresh = feature.read(ids)  # no buffers kept: a fresh tensor each read
    assert torch.equal(fresh, torch.from_numpy(rows)[ids])
    assert feature.read(ids).data_ptr() != fresh.data_ptr()
    feature.keep_buffers(2)
    first = feature.read(ids)
    kept = first.clone()
    address = first.data_ptr()
    second = feature.read(ids.flip(0))  # ``first`` is held: another one
    assert second.data_ptr() != address
    assert torch.equal(first, kept)
    del first
    again = feature.read(ids[:200])  # let go of: reused
    assert again.data_ptr() == address
    assert torch.equal(again, torch.from_numpy(rows)[ids[:200]])
    assert torch.equal(second, torch.from_numpy(rows)[ids.flip(0)])
    feature.release_buffers()
    assert feature._pool.nbytes == 0


def test_loader_without_a_cache_reuses_its_batch_buffers(tiny):
    """``cache=None`` with rows in memory: DGL's rows, gathered into at
    most the batches in flight's buffers (no fresh tensor a batch)."""
    sampler = dgl.dataloading.NeighborSampler([5, 3])
    loader = hmgraph.DataLoader(tiny.graph, tiny.split["train"], sampler,
                                features=tiny.features, batch_size=64,
                                shuffle=True, prefetch=1)
    addresses = set()
    for input_nodes, _, blocks in loader:
        assert torch.equal(blocks[0].srcdata["feat"],
                           tiny.features[input_nodes])
        addresses.add(blocks[0].srcdata["feat"].data_ptr())
    pool = loader.feature["_N"]._pool
    made = pool.size + pool.overflows + pool.regrown
    assert 1 < len(addresses) <= made
    assert len(loader) > 2 * made
    loader.close()


# The loader with a cache: DGL contract, thread lifecycle, failures.

@pytest.mark.parametrize("prefetch", [0, 2], ids=["inline", "threads"])
@pytest.mark.parametrize("policy", ["hmgraph", "presample", "lru", None])
def test_loader_over_disk_keeps_the_contract(tiny, policy, prefetch):
    sampler = dgl.dataloading.NeighborSampler([5, 3])
    budget = tiny.features.numel()  # a quarter of the feature bytes
    loader = hmgraph.DataLoader(
        tiny.graph, tiny.split["train"], sampler,
        features=tiny.feature_path, batch_size=256, shuffle=True,
        cache=policy, device_budget_bytes=budget // 4,
        host_budget_bytes=budget // 2, prefetch=prefetch,
        profile_batches=4,
    )
    for _ in range(2):
        for input_nodes, output_nodes, blocks in loader:
            assert torch.equal(blocks[0].srcdata["feat"],
                               tiny.features[input_nodes])
            assert torch.equal(blocks[-1].dstdata["label"],
                               tiny.labels[output_nodes])
    stats = loader.stats.as_dict()
    assert stats["storage"]["blocks_read"] > 0
    hits = stats["cache"]["hits"]
    assert sum(hits.values()) == stats["rows_requested"]
    if policy is not None:
        assert hits.get("device", 0) + hits.get("host", 0) > 0
    held = loader.cache["_N"].held_bytes()
    assert held.get("device", 0) <= budget // 4
    assert held.get("host", 0) <= budget // 2
    loader.close()


def test_break_mid_epoch_leaves_no_thread(tiny):
    before = threading.active_count()
    loader = hmgraph.DataLoader(
        tiny.graph, tiny.split["train"],
        dgl.dataloading.NeighborSampler([3]), batch_size=64, prefetch=3)
    for index, _ in enumerate(loader):
        if index == 2:
            break
    assert threading.active_count() == before


class _FailingSampler(dgl.dataloading.NeighborSampler):
    def __init__(self, fail_at: int):
        super().__init__([3])
        self.calls = 0
        self.fail_at = fail_at

    def sample(self, g, seeds, exclude_eids=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise OSError("disk vanished")
        return super().sample(g, seeds, exclude_eids)


def test_error_in_a_loader_thread_reaches_the_training_loop(tiny):
    before = threading.active_count()
    loader = hmgraph.DataLoader(tiny.graph, tiny.split["train"],
                                _FailingSampler(fail_at=3), batch_size=64,
                                prefetch=2)
    seen = 0
    with pytest.raises(OSError, match="disk vanished"):
        for _ in loader:
            seen += 1
    assert seen == 2
    assert threading.active_count() == before


def test_a_dead_thread_is_an_error_not_a_hang():
    from hmgraph.pipeline import Prefetcher

    class Dies(Prefetcher):
        def _run(self):  # ends without a result or an error
            return

    with pytest.raises(RuntimeError, match="'dying' died without a result"):
        next(Dies("dying", iter([1, 2]), depth=1))


def test_window_planning_reads_a_block_once_per_window(rows, feature_path):
    """Rows the next batch needs, on blocks this batch reads, are staged."""
    from hmgraph.cache.disk import DiskModel

    model = DiskModel(512, iops=10_000.0, bandwidth=500e6, queue_depth=2)
    source = StorageFeature(feature_path, num_threads=2, disk=model,
                            max_gap_bytes=0)
    with FeatureCache(source, [], staging_rows=4) as cache:
        # 28-byte rows: rows 0-17 share the first 512 B block with row 0.
        first, second, third = (torch.tensor(ids) for ids in
                                ([0, 300], [5, 6, 301], [7]))
        check_feature_contract(cache, rows, first, future=[second, third])
        assert cache.stats.hits == {"source": 2}
        # 5, 6, 7, and 301 (on row 300's block).
        assert cache.stats.admitted == {"staged": 4}
        assert source.stats.io_requests == 2
        check_feature_contract(cache, rows, second, future=[third])
        assert cache.stats.hits == {"source": 2, "staged": 3}
        assert source.stats.io_requests == 2  # no read at all
        assert cache.staging.size == 1  # row 7, for the next batch
        check_feature_contract(cache, rows, third, future=[])
        assert cache.stats.hits["staged"] == 4
        assert source.stats.io_requests == 2
        assert cache.staging.size == 0
        assert cache.held_bytes()["staged"] == 4 * cache.row_bytes


def test_staging_is_charged_to_the_host_budget():
    plan = make_plan("lru", 1000, 100, 0, 40_000, staging=0.25)
    # Staging gets a quarter of the budget: per node 1 B of window marks
    # and its store's 4 B id -> slot table, per row 100 B and 20 B of
    # slot tables. The host tier gets the rest: per node LRU's 9 B and
    # its store's 4 B, per row 100 B, 20 B of slot tables, 16 B of LRU
    # groups.
    staging_rows = (10_000 - 1000 * (1 + 4)) // (100 + 20)
    spent = 1000 * (1 + 4) + staging_rows * (100 + 20)
    host_rows = (40_000 - spent - 1000 * (9 + 4)) // (100 + 20 + 16)
    assert (plan.host_rows, plan.staging_rows) == (host_rows, staging_rows)
    assert (host_rows, staging_rows) == (125, 41)
    assert plan.as_dict()["staging_bytes"] == staging_rows * 100
    with pytest.raises(ValueError, match=r"staging must be .* got 1.0"):
        make_plan("lru", 1000, 100, 0, 40_000, staging=1.0)


def test_a_host_budget_that_holds_every_row_stages_none():
    # 1000 rows of 100 B with LRU's bookkeeping for all of them fit: the
    # host tier holds every row and the staging share is not taken.
    whole = metadata_bytes("lru", 1000, 0, 1000) + 1000 * 100
    plan = make_plan("lru", 1000, 100, 0, whole, staging=0.25)
    assert (plan.host_rows, plan.staging_rows) == (1000, 0)
    plan = make_plan("hmgraph", 1000, 100, 0, metadata_bytes(
        "hmgraph", 1000, 0, 1000) + 1000 * 100, counts=torch.ones(1000),
        trace=[torch.arange(500), torch.arange(500, 1000)], staging=0.25)
    assert (plan.host_rows, plan.staging_rows, plan.static_rows) == (
        1000, 0, 1000)
    # A byte less: staging takes its share again.
    plan = make_plan("lru", 1000, 100, 0, whole - 1, staging=0.25)
    assert plan.staging_rows > 0 and plan.host_rows < 1000


@pytest.mark.parametrize("policy", ["hmgraph", "presample"])
def test_a_cache_that_pins_every_row_reads_without_its_policy(
        rows, feature_path, policy, monkeypatch):
    """Every row pinned across both tiers: reads never miss, are the
    file's rows in request order (repeats too), are counted per row, and
    no policy step runs; a row short of the file, the policy decides."""
    source = make_source("storage", rows, feature_path)
    with make_cache(policy, (NUM_ROWS // 3, NUM_ROWS), source) as cache:
        assert cache.complete and len(cache.stores) == 2
        monkeypatch.setattr(cache.layers[0].policy, "step", None)
        read = source.stats.rows_read
        ids = torch.randperm(NUM_ROWS)[:200]
        for asked in (ids, torch.cat([ids[:50], ids[:10]])):
            torch.testing.assert_close(
                cache.read(asked), torch.from_numpy(rows[asked.numpy()]),
                rtol=0, atol=0)
        view = FrozenView(cache)
        check_feature_contract(view, rows, ids)
        assert source.stats.rows_read == read  # nothing read from disk
        assert cache.stats.rows_requested == 250
        assert sum(cache.stats.hits.values()) == 250
        assert cache.stats.hits["source"] == 0 and cache.stats.requests == 2
        assert view.stats.hits["source"] == 0
    source = make_source("storage", rows, feature_path)
    with make_cache(policy, (0, NUM_ROWS - 1), source) as cache:
        assert not cache.complete


# Bookkeeping (metadata) is charged to the host budget it lives in.

#: Per policy: host bytes per node (policy state, then a 4 B id -> slot
#: table per store, one for both stores of a shared layer) and per cached
#: row (policy state, then 20 B of slot tables), as the classes allocate
#: them, written out independently.
METADATA = {
    # (policy bytes per node, per row; layers: one over both stores or
    # one per store)
    "degree": (1, 8, "one"),        # resident; held ids
    "presample": (1, 8, "one"),
    "layer-aware": (1, 8, "one"),
    "hmgraph": (1 + 1 + 4 + 4, 8, "one"),  # resident, static, rank, next
    "lru": (1 + 8, 16, "each"),     # resident, last use; 2x groups
    "clock": (1 + 8, 8 + 1, "each"),  # resident, slot of; slots, bits
}


@pytest.mark.parametrize("policy", list(METADATA))
def test_metadata_is_counted_against_the_host_budget(rows, feature_path,
                                                      policy):
    """Host rows = what the budget holds after the bookkeeping, computed
    here from the table above; the cache allocates no more than the plan
    charged, and its rows stay those of the file."""
    node, slot, layers = METADATA[policy]
    row_bytes, device_rows, budget = 28, 20, 20_000
    stores = 2  # device and host: a policy and a table each, or shared
    per_node = (node + 4) * (1 if layers == "one" else stores)
    per_row = slot + 20
    trace = profile_trace()
    counts = torch.zeros(NUM_ROWS, dtype=torch.int64)
    for ids in trace:
        counts[ids] += 1
    plan = make_plan(policy, NUM_ROWS, row_bytes, device_rows * row_bytes,
                     budget, counts=counts, trace=trace, window=2)
    expected_host = (budget - NUM_ROWS * per_node - device_rows * per_row) \
        // (row_bytes + per_row)
    assert 0 < expected_host < NUM_ROWS - device_rows
    assert (plan.device_rows, plan.host_rows) == (device_rows, expected_host)
    metadata = NUM_ROWS * per_node + per_row * (device_rows + expected_host)
    record = plan.as_dict()
    assert record["metadata_bytes"] == {"device": 0, "host": metadata}
    assert record["metadata_unbudgeted_bytes"] == 0
    assert record["host_bytes"] + metadata <= budget
    # Rows that fit = (budget - metadata) // row_bytes, give or take the
    # last row's slot bookkeeping.
    assert expected_host <= (budget - metadata) // row_bytes \
        <= expected_host + 1
    assert "metadata" in plan.describe()
    source = StorageFeature(feature_path, num_threads=2)
    with build_cache(source, plan, counts=counts,
                     degrees=torch.arange(NUM_ROWS).flip(0),
                     hop_counts=torch.stack([counts, counts])) as cache:
        for index, ids in enumerate(trace):
            check_feature_contract(cache, rows, ids,
                                   future=trace[index + 1:index + 3])
        measured = cache.metadata_nbytes()["host"]
        assert cache.stats.as_dict()["metadata_bytes"]["host"] <= measured
        if policy in ("lru", "hmgraph"):  # held ids / groups grow in use
            assert measured <= metadata + 16 * max(t.numel() for t in trace)
        else:
            assert measured == metadata
        cache.stats.reset()
        assert cache.stats.metadata_bytes["host"] > 0


def test_host_budget_below_the_metadata_is_refused_in_one_line():
    num_rows = 100_000
    counts = torch.zeros(num_rows)
    # hmgraph with a host tier only: 10 B of policy state and the host
    # store's 4 B table per node; the least budget adds one row and its
    # 8 + 20 B of slot bookkeeping.
    with pytest.raises(ValueError) as info:
        make_plan("hmgraph", num_rows, 400, 0, 1_000_000, counts=counts)
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        "host budget 1.0 MB cannot hold the cache's metadata of 1.40 MB "
        "(14 B per node x 100,000 nodes); give at least 1.41 MB")
    least = 14 * num_rows + 8 + 20 + 400
    assert least <= parse_budget("1.41MB")
    plan = make_plan("hmgraph", num_rows, 400, 0, least, counts=counts)
    assert plan.host_rows == 1
    assert plan.as_dict()["metadata_bytes"]["host"] == least - 400
    with pytest.raises(ValueError, match="host budget"):
        make_plan("hmgraph", num_rows, 400, 0, least - 1, counts=counts)
    # LRU over both tiers: two layers of 9 + 4 B per node; the device
    # rows' slot bookkeeping (20 + 16 B) lives in host memory too.
    with pytest.raises(ValueError, match=(
            r"^host budget 1\.0 MB cannot hold the cache's metadata of "
            r"2\.69 MB \(26 B per node x 100,000 nodes \+ 90\.0 KB for "
            r"2,500 device rows\); give at least 2\.70 MB$")):
        make_plan("lru", num_rows, 400, 2500 * 400, 1_000_000)


def test_metadata_without_a_host_budget_is_reported_unbudgeted():
    plan = make_plan("clock", 1000, 100, 50 * 100, 0)
    assert (plan.device_rows, plan.host_rows) == (50, 0)
    metadata = 1000 * (9 + 4) + 50 * (9 + 20)
    assert plan.as_dict()["metadata_bytes"]["host"] == metadata
    assert plan.as_dict()["metadata_unbudgeted_bytes"] == metadata
    assert "not charged" in plan.describe()
    # A small graph's bookkeeping past a tiny budget: no host rows, no
    # refusal, reported.
    plan = make_plan("lru", 1000, 100, 50 * 100, 3000)
    assert plan.host_rows == 0
    assert plan.as_dict()["metadata_unbudgeted_bytes"] == \
        1000 * (9 + 4) + 50 * (16 + 20)
    none = make_plan("none", 1000, 100, 10**6, 10**6)
    assert none.as_dict()["metadata_bytes"] == {"device": 0, "host": 0}


def test_tiers_of_one_layer_share_one_slot_table():
    """Two stores on one `SlotTable`: each finds only its own rows, frees
    only its own, and the table costs 4 B per node once."""
    from hmgraph.cache.slots import SlotStore, SlotTable

    table = SlotTable(10, 5)
    device = SlotStore("device", 10, (1,), torch.float32, 2, table=table)
    host = SlotStore("host", 10, (1,), torch.float32, 3, table=table)
    assert device.slot_of is host.slot_of and device.slot_of.dtype == \
        torch.int32
    device.insert(torch.tensor([4, 7]), torch.tensor([[4.0], [7.0]]))
    host.insert(torch.tensor([1, 9]), torch.tensor([[1.0], [9.0]]))
    ids = torch.tensor([1, 4, 7, 9, 0])
    assert device.slots(ids).tolist() == [-1, 1, 0, -1, -1]
    assert host.slots(ids).tolist() == [1, -1, -1, 0, -1]
    assert host.gather(host.slots(torch.tensor([9, 1]))).flatten().tolist() \
        == [9.0, 1.0]
    assert device.remove(torch.tensor([1, 4])).tolist() == [4]  # 1: host's
    assert host.slots(torch.tensor([1])).tolist() == [1]
    assert device.slots(torch.tensor([4, 7])).tolist() == [-1, 0]
    with pytest.raises(ValueError, match="slots are taken"):
        SlotStore("more", 10, (1,), torch.float32, 1, table=table)
