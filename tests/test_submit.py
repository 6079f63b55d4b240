"""Interleaved batches (`FeatureCache.submit`) against reads one at a time.

The compiled engine reads batch i while it looks up batch i + 1 and
copies batch i - 1's admitted rows: every batch's rows, and the state the
batches leave, must be the reference's (the torch engine reading one
batch after the other). A read that fails puts the tables back, as a
failed `read` leaves no trace.
"""

from __future__ import annotations

import errno

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from test_cache import BUDGETS
from test_engine import (
    ANY_BATCHES,
    COMPILED,
    ONE_STORE,
    SOURCES,
    STEPPED,
    WINDOW,
    pair,
    recorded_trace,
    state,
)


def uniques_of(batches) -> list[torch.Tensor]:
    """Each batch's unique ids (the form `FetchStage` reads)."""
    return [torch.from_numpy(np.unique(np.asarray(b, dtype=np.int64)))
            for b in batches]


def interleaved(cache, batches):
    """Rows of every batch, each submitted before the last is asked."""
    got, pending = [], None
    for index, ids in enumerate(batches):
        handle = cache.submit(ids, batches[index + 1:index + 1 + WINDOW])
        if pending is not None:
            got.append(pending.result())
        pending = handle
    got.append(pending.result())
    return got


def one_by_one(cache, batches):
    return [cache.read(ids, batches[index + 1:index + 1 + WINDOW])
            for index, ids in enumerate(batches)]


def compare(policy, budget, kind, batches, rows, feature_path):
    compiled, reference = pair(policy, budget, kind, rows, feature_path)
    try:
        got = interleaved(compiled, batches)
        expected = one_by_one(reference, batches)
        for index, (out, ids) in enumerate(zip(got, batches, strict=True)):
            assert out.numpy().tobytes() == rows[ids.numpy()].tobytes(), \
                f"batch {index}: rows differ from the file"
            assert torch.equal(out, expected[index])
        assert compiled._compiled.inflight is None
        assert state(compiled) == state(reference)
    finally:
        compiled.close()
        reference.close()


@pytest.mark.parametrize("kind", SOURCES)
@pytest.mark.parametrize("budget", BUDGETS.values(), ids=BUDGETS.keys())
@pytest.mark.parametrize("policy", COMPILED)
def test_interleaved_batches_read_as_one_by_one(policy, budget, kind,
                                                rows, feature_path):
    compare(policy, budget, kind, uniques_of(recorded_trace(seed=11)),
            rows, feature_path)


@pytest.mark.parametrize("budget", ONE_STORE.values(), ids=ONE_STORE.keys())
@pytest.mark.parametrize("policy", STEPPED)
def test_a_stepped_policy_submitted_reads_as_one_by_one(policy, budget,
                                                       rows, feature_path):
    """lru and clock take their step once a batch's reads succeeded:
    `submit` finishes the batch before (none overlap), the same rows,
    decisions and counters."""
    compare(policy, budget, "storage", uniques_of(recorded_trace(seed=11)),
            rows, feature_path)


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**ANY_BATCHES)
def test_interleaved_batches_on_any_ids(policy, budget, kind, batches,
                                        rows, feature_path):
    compare(policy, budget, kind, uniques_of(batches), rows, feature_path)


def test_a_repeated_id_is_read_at_once(rows, feature_path):
    """`submit` of ids that repeat reads them now (as `read` does),
    finishing the batch in flight first."""
    compiled, reference = pair("hmgraph", BUDGETS["small"], "storage", rows,
                               feature_path)
    try:
        first = torch.arange(0, 90)
        second = torch.tensor([5, 400, 5, 7, 400])
        a = compiled.submit(first, [torch.tensor([5, 7, 400])])
        b = compiled.submit(second)
        assert compiled._compiled.inflight is None
        assert torch.equal(a.result(), torch.from_numpy(rows[:90]))
        assert torch.equal(b.result(), torch.from_numpy(rows[second]))
        reference.read(first, [torch.tensor([5, 7, 400])])
        reference.read(second)
        assert state(compiled) == state(reference)
    finally:
        compiled.close()
        reference.close()


class FailingWait:
    """Makes the ``fail_at``-th read of a storage tier raise EIO once its
    reads are done (a disk error found when the batch is waited for)."""

    def __init__(self, source, fail_at: int):
        self.calls = 0
        self.fail_at = fail_at
        self.start = source.read_into_later
        source.read_into_later = self

    def __call__(self, *args):
        self.calls += 1
        wait = self.start(*args)
        if self.calls != self.fail_at:
            return wait

        def fail():
            wait()
            raise OSError(errno.EIO, "Input/output error (injected)")
        return fail


@pytest.mark.parametrize("kind", ["storage", "storage-staged"])
@pytest.mark.parametrize("policy", ["hmgraph", "presample"])
def test_a_failed_read_in_flight_leaves_no_trace(policy, kind, rows,
                                                 feature_path):
    """Batch 4's reads fail when batch 5 is submitted: the tables go back
    to what batches 0-3 left (the choice batch 4 applied is undone), the
    error reaches the caller, and reads go on exact afterwards."""
    batches = uniques_of(recorded_trace(seed=3, batches=10))
    compiled, reference = pair(policy, BUDGETS["small"], kind, rows,
                               feature_path)
    try:
        one_by_one(reference, batches[:4])
        failing = FailingWait(compiled.source, fail_at=0)
        interleaved(compiled, batches[:4])
        failing.fail_at = failing.calls + 1
        compiled.submit(batches[4], batches[5:5 + WINDOW])
        with pytest.raises(OSError, match="injected"):
            compiled.submit(batches[5], batches[6:6 + WINDOW])
        assert compiled._compiled.inflight is None
        layers = {k: v for k, v in state(compiled).items()
                  if k not in ("stats", "storage") and
                  not k.startswith("staged")}
        assert layers == {k: v for k, v in state(reference).items()
                          if k not in ("stats", "storage") and
                          not k.startswith("staged")}
        later = batches[6:]
        for out, ids in zip(interleaved(compiled, later), later,
                            strict=True):
            assert out.numpy().tobytes() == rows[ids.numpy()].tobytes()
    finally:
        compiled.close()
        reference.close()
