"""Trace replay: a policy stepped through a recorded trace of batches.

`replay` and `replay_hits` count the hits of a fresh policy on a trace of
unique-id batches, with the next batches as its lookahead; the analysis
replays every policy this way, and `belady_policy` is the optimal
offline ceiling to replay beside them. For ``hmgraph`` the split of the
cache into a static part and a dynamic region is chosen by replaying the
profile for several static shares (`choose_static_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hmgraph.cache.policies import BeladyPolicy, HMGraphPolicy, make_policy
from hmgraph.cache.policy_base import kept, rankings_kept

__all__ = ["STATIC_SHARES", "belady_policy", "choose_static_rows",
           "replay", "replay_hits", "split_profile"]

#: Static shares of the cache tried when choosing the hmgraph split.
STATIC_SHARES = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)


def split_profile(trace, num_rows) -> tuple:
    """A profile split in two: accesses per row over the first half of
    ``trace`` (int64), and the second half, as batches not seen.

    Parameters
    ----------
    trace : sequence of torch.Tensor
        Profiled unique int64 ids per batch.
    num_rows : int
        Rows of the feature matrix.

    Returns
    -------
    tuple of (torch.Tensor, sequence of torch.Tensor)
        ``(hotness, held_out)``: int64 accesses per row (CPU) over the
        first ``len(trace) // 2`` batches, and the batches after them.
        Within `hmgraph.cache.policy_base.rankings_kept` the counts are
        shared by every split of the same batches: not to be written to.
    """
    half = len(trace) // 2

    def count():
        hotness = torch.zeros(num_rows, dtype=torch.int64)
        for ids in trace[:half]:
            hotness[ids] += 1
        return hotness

    if not half:
        return count(), trace
    # A plan splits one profile several times: counted once (`kept`).
    key = ("split", num_rows, tuple((id(t), t._version)
                                    for t in trace[:half]))
    return kept(trace[0], key, count), trace[half:]


def choose_static_rows(policy, num_rows, capacity, counts, trace,
                       window):
    """Static rows of ``policy`` (a name) with the best replayed hit rate
    on the profile.

    Each share of `STATIC_SHARES` is replayed on the second half of
    ``trace``, hotness counted on its first half (`split_profile`).

    Parameters
    ----------
    policy : str
        A key of `hmgraph.cache.policies.POLICIES` whose class has
        ``splits_static``.
    num_rows, capacity : int
        Rows of the feature matrix and of the cache.
    counts : torch.Tensor or None
        Profiled accesses per row; not used (the hotness of a replay is
        counted on the trace's first half).
    trace : list of torch.Tensor
        Profiled unique int64 ids per batch.
    window : int
        Lookahead batches.

    Returns
    -------
    tuple of (int, list of dict)
        The static rows, and the curve: ``static_share``,
        ``static_rows`` and ``hit_rate`` of each share tried. Every row
        is static, with no curve, for no capacity or a trace of fewer
        than two batches.
    """
    if capacity == 0 or len(trace) < 2:
        return capacity, []
    # A static part is judged on batches it was not chosen from.
    curve = []
    with rankings_kept():  # one sort of the hotness for every share
        hotness, held_out = split_profile(trace, num_rows)
        for share in STATIC_SHARES:
            static_rows = int(round(share * capacity))
            rate = replay(make_policy(
                policy, num_rows, capacity, hotness=hotness,
                static_rows=static_rows, window=window), held_out)
            curve.append({"static_share": share, "static_rows": static_rows,
                          "hit_rate": rate})
    # The highest hit rate; on a tie the larger static part (no refills).
    best = max(curve, key=lambda p: (round(p["hit_rate"], 4),
                                     p["static_rows"]))
    return best["static_rows"], curve

def replay(policy, trace: Sequence[torch.Tensor], window: int | None = None
           ) -> float:
    """Hit rate of ``policy`` on a trace of unique-id batches.

    Parameters
    ----------
    policy : hmgraph.cache.policies.Policy
        A fresh policy; it is warmed, then stepped through the trace with
        the next ``window`` batches as lookahead (default: its own
        ``window`` attribute, or none).
    trace : sequence of torch.Tensor
        Unique int64 ids per batch.

    Returns
    -------
    float
        Hits over requested rows; 0.0 for an empty trace.
    """
    hits, requested = replay_hits(policy, trace, window)
    return hits / requested if requested else 0.0


def belady_policy(trace: Sequence[torch.Tensor], num_rows: int,
                  capacity: int) -> BeladyPolicy:
    """Belady's optimal offline policy, told the whole ``trace``.

    Parameters
    ----------
    trace : sequence of torch.Tensor
        Unique int64 ids per batch, in order: the trace it is then
        replayed on (`replay`, `replay_hits`).
    num_rows : int
        Rows of the feature matrix.
    capacity : int
        Rows it may hold.

    Returns
    -------
    BeladyPolicy
        A fresh policy; its `replay` on ``trace`` is the optimal hit rate
        at ``capacity`` rows.
    """
    policy = BeladyPolicy(num_rows, capacity)
    policy.set_trace(trace)
    return policy


def replay_hits(policy, trace: Sequence[torch.Tensor],
                window: int | None = None, on_miss=None,
                lookahead: Sequence[torch.Tensor] | None = None
                ) -> tuple[int, int]:
    """Hits and requested rows of a replay (see `replay`).

    ``on_miss``, if given, is called with each batch's missed ids (sorted,
    unique), e.g. to cost them in storage blocks. ``lookahead``, if given
    (as long as ``trace``), is what the next ``window`` batches are taken
    from instead of ``trace``: batch reuse asks the cache for the rows it
    did not reuse and passes on the next batches whole.
    """
    if window is None:
        window = getattr(policy, "window", 0)
    ahead = trace if lookahead is None else lookahead
    policy.warm()
    hits = requested = 0
    for index, ids in enumerate(trace):
        future = ahead[index + 1:index + 1 + window] if window else ()
        # The hmgraph policy through the compiled engine's kernel (held
        # to the reference `step` by tests/test_policies.py).
        step = policy.step_compiled if type(policy) is HMGraphPolicy \
            else policy.step
        hit = step(ids, future).hit
        hits += int(hit.sum())
        requested += ids.numel()
        if on_miss is not None:
            on_miss(ids[~hit])
    return hits, requested

