"""The ``device`` engine against the reference, on the same traces.

On a GPU the ``device`` engine keeps a cache's bookkeeping (slot tables,
policy state) there and reads pinned host rows in place
(`hmgraph.cache.uva`). Its code is the reference's tensor code run where
the tensors are, so on the CPU it must decide exactly as the reference
does: rows, counters, store contents and policy state after every batch.
``bench/gpu.py`` runs the same comparison on a GPU.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cache import BUDGETS, make_cache, make_source
from test_engine import ANY_BATCHES, recorded_trace, run_trace

from hmgraph.cache import TensorFeature, uva
from hmgraph.cache.coordinated import FeatureCache, FrozenView
from hmgraph.cache.policies import make_policy

#: The policies whose steps run where their state is.
ON_DEVICE = ["hmgraph", "presample", "degree", "layer-aware", "none"]
SOURCES = ["memory", "storage"]


def pair(policy, budget, kind, rows, feature_path) -> list[FeatureCache]:
    return [make_cache(policy, budget,
                       make_source(kind, rows, feature_path), engine=engine)
            for engine in ("device", "torch")]


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("budget", BUDGETS.values(), ids=BUDGETS.keys())
@pytest.mark.parametrize("policy", ON_DEVICE)
def test_device_engine_decides_as_the_reference(policy, budget, kind, rows,
                                                feature_path):
    caches = pair(policy, budget, kind, rows, feature_path)
    try:
        assert [cache.engine for cache in caches] == ["device", "torch"]
        run_trace(caches, recorded_trace(seed=11), rows)
    finally:
        for cache in caches:
            cache.close()


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**{**ANY_BATCHES, "kind": st.sampled_from(SOURCES)})
def test_device_engine_equals_the_reference_on_any_batches(
        policy, budget, kind, batches, rows, feature_path):
    """Any ids, repeats and empty batches included."""
    caches = pair(policy, budget, kind, rows, feature_path)
    try:
        run_trace(caches, batches, rows)
    finally:
        for cache in caches:
            cache.close()


@pytest.mark.parametrize("policy,staging", [("lru", 0.0), ("clock", 0.0),
                                            ("hmgraph", 0.5)])
def test_recency_policies_and_staging_read_through_the_reference(
        policy, staging, rows, feature_path):
    source = make_source("storage", rows, feature_path)
    with make_cache(policy, (0, 80), source, staging,
                    engine="device") as cache:
        assert (cache.staging is not None) == (staging > 0)
        assert cache.engine == "torch"


def test_the_default_engine_on_a_cpu_stays_compiled(rows, feature_path):
    source = make_source("memory", rows, feature_path)
    with make_cache("hmgraph", (20, 60), source) as cache:
        assert cache.engine == "compiled"


def test_a_policy_moves_its_whole_state():
    policy = make_policy("hmgraph", 100, 10, hotness=torch.rand(100),
                         static_rows=4)
    assert policy.to("cpu") is policy
    moved = {name for name, value in vars(policy).items()
             if isinstance(value, torch.Tensor)}
    assert {"resident", "static", "cold_rank", "next_use", "_held"} <= moved


def test_a_device_view_needs_a_gpu(rows):
    assert not uva.available("cpu")
    assert uva.device_view(torch.from_numpy(rows), "cpu") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_device_view_reads_pinned_rows_in_place(rows):
    host = torch.from_numpy(rows).pin_memory()
    view = uva.device_view(host, "cuda")
    ids = torch.tensor([5, 0, 599, 5], device="cuda")
    assert torch.equal(view.index_select(0, ids).cpu(), host[ids.cpu()])
    with pytest.raises(ValueError, match="pinned host memory"):
        uva.device_view(torch.from_numpy(rows), "cuda")
    cache = FeatureCache(TensorFeature(host), [], device="cuda")
    assert cache.engine == "device" and cache.reads_source_in_place


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("policy", ["hmgraph", "presample"])
def test_frozen_views_read_alike_through_the_device_engine(policy, kind,
                                                           rows,
                                                           feature_path):
    """Evaluation reads (`FrozenView`) after a trace: same rows and
    counters as the reference's."""
    caches = pair(policy, BUDGETS["small"], kind, rows, feature_path)
    try:
        run_trace(caches, recorded_trace(seed=3, batches=5), rows)
        views = [FrozenView(cache) for cache in caches]
        for ids in ([5, 1, 5, 300, 2], list(range(0, 600, 7)), []):
            for view in views:
                out = view.read(torch.tensor(ids, dtype=torch.int64))
                assert out.numpy().tobytes() == rows[ids].tobytes()
        assert views[0].stats.as_dict() | {"seconds": 0} == \
            views[1].stats.as_dict() | {"seconds": 0}
    finally:
        for cache in caches:
            cache.close()
