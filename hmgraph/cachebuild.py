"""Planning `hmgraph.DataLoader`'s cache: profile, plan, build.

Once, when a loader is made: where a policy needs a profile of the
accesses (what its class ``needs``), a profiling pass samples some
batches with the loader's own sampler; each node type's cached feature
then gets a `CachePlan` within its share of the budgets and the cache
that plan lays out, with batch reuse over it where asked. Nothing here
runs per batch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import torch

from hmgraph.cache.costs import (
    KernelCosts,
    lost_hit_share,
    measure_kernel_costs,
    random_rows,
    reuse_verdict,
    reused_rows,
    spared_read_seconds,
    staging_verdict,
    static_verdict,
    window_verdict,
)
from hmgraph.cache.feature import Feature
from hmgraph.cache.placement import (
    PRICED_BATCHES,
    choose_span_rows,
    span_score,
)
from hmgraph.cache.plan import (
    CachePlan,
    build_cache,
    make_plan,
    replay,
    reuse_ring_rows,
)
from hmgraph.cache.policies import POLICIES, layer_aware_score, make_policy
from hmgraph.cache.policy_base import rankings_kept
from hmgraph.cache.reuse import (
    REUSE_LEVELS,
    TABLE_BYTES_PER_ROW,
    BatchReuse,
    reuse_profile,
)
from hmgraph.cache.staging_model import miss_trace, staged_reads
from hmgraph.cache.trace_replay import split_profile
from hmgraph.memory import release_freed_memory

log = logging.getLogger(__name__)

__all__ = ["PROFILED_POLICIES", "STAGING_SHARE", "CacheBuilder",
           "CachedFeatures"]

#: Share of the host budget staged for window read planning by default
#: (features on the storage tier, lookahead on).
STAGING_SHARE = 0.5

#: What a policy may need (its class's ``needs``) that only a profiling
#: pass with the real sampler gives.
PROFILE_NEEDS = frozenset({"hotness", "hop_counts"})

#: Policies planned from a profiling pass with the real sampler.
PROFILED_POLICIES = tuple(name for name, cls in POLICIES.items()
                          if cls.needs & PROFILE_NEEDS)


_REUSE_NAMES = {levels: name for name, levels in REUSE_LEVELS.items()}


def _needs(policy: str) -> frozenset:
    """What ``policy``'s class needs (nothing for an unknown name, which
    `make_plan` refuses, listing the names)."""
    cls = POLICIES.get(policy)
    return cls.needs if cls is not None else frozenset()


@dataclass
class CachedFeatures:
    """The cached feature of each node type, as built.

    Attributes
    ----------
    plan : dict of str to CachePlan
        Per node type, the cache's layout.
    cache : dict of str to FeatureCache
        Per node type, the cache over the source.
    feature : dict of str to Feature
        Per node type, what batches read: batch reuse over the cache, the
        cache, or the source itself where caching is off.
    window : int
        Lookahead batches (batch reuse looks as far ahead as it reaches
        back).
    profile : hmgraph.samplers.presample.Profile or None
        The profile planned from.
    """

    plan: dict
    cache: dict
    feature: dict
    window: int
    profile: object = None


class CacheBuilder:
    """Plans and builds the cached feature of each node type.

    Parameters
    ----------
    graph : dgl.DGLGraph
        The graph (in-degrees for ``degree``; profiling).
    graph_sampler, indices, batch_size, shuffle, seed
        The loader's, for the profiling pass.
    num_batches : int
        Batches of an epoch.
    device : torch.device
        The training device.
    placement : str
        ``"frequency"`` or ``"layer-aware"``: how profiled rows rank.
    profile : hmgraph.samplers.presample.Profile, optional
        Used instead of profiling.
    profile_batches : int
        Batches sampled to profile.

    Raises
    ------
    ValueError
        A profile whose counts do not match a homogeneous graph's nodes.
    """

    def __init__(self, graph, graph_sampler, indices, batch_size: int,
                 shuffle: bool, seed: int | None, num_batches: int,
                 device: torch.device, placement: str = "frequency",
                 profile=None, profile_batches: int = 32):
        self.homogeneous = len(graph.ntypes) == 1
        if profile is not None and self.homogeneous and \
                profile.counts.numel() != graph.num_nodes():
            raise ValueError(
                f"profile counts {profile.counts.numel()} rows, but the "
                f"graph has {graph.num_nodes()} nodes")
        self.graph = graph
        self.graph_sampler = graph_sampler
        self.indices = indices
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_batches = num_batches
        self.device = device
        self.placement = placement
        self.profile = profile
        self.profile_batches = profile_batches
        self._missed = {}  # `_misses` by policy, capacity, split, window

    def build(self, sources: dict, cache, device_budget_bytes: int,
              host_budget_bytes: int, window: int | None = None,
              reuse: str = "none", staging: float | None = None
              ) -> CachedFeatures:
        """Each type's plan, cache and feature, the budgets shared by the
        types' feature bytes. See `hmgraph.DataLoader` for the
        arguments."""
        built = CachedFeatures({}, {}, {}, 0)
        total = sum(s.num_rows * s.row_bytes for s in sources.values())
        for ntype, source in sources.items():
            share = source.num_rows * source.row_bytes / max(total, 1)
            with rankings_kept():  # the profile's orders, for planning
                plan = self._plan(source, cache,
                                  int(device_budget_bytes * share),
                                  int(host_budget_bytes * share), window,
                                  reuse, staging)
            built.plan[ntype] = plan
            built.cache[ntype] = self._cache(ntype, source, plan)
            built.feature[ntype] = self._reads_from(
                source, built.cache[ntype], plan, cache is None)
        windows = [max(p.window, p.reuse_levels)
                   for p in built.plan.values()] or [0]
        built.window = windows[0] if window is None else window
        built.profile = self.profile
        self._missed.clear()
        release_freed_memory()  # what profiling and the fill let go of
        return built

    def _plan(self, source, cache, device_budget_bytes, host_budget_bytes,
              window, reuse, staging) -> CachePlan:
        policy = cache.policy if isinstance(cache, CachePlan) else \
            "none" if cache is None else cache
        levels = REUSE_LEVELS.get(reuse, 0)
        profiled = bool(_needs(policy) & PROFILE_NEEDS) or reuse != "none"
        if profiled and not self.homogeneous:
            raise ValueError(
                f"cache {policy!r} (or reuse) profiles a homogeneous graph; "
                f"on heterographs use 'lru', 'clock', 'degree' or None")
        if profiled:
            self._profile()
        asked = 4 if window is None else window  # None: 4, then judged
        if isinstance(cache, CachePlan):
            if cache.num_rows != source.num_rows:
                raise ValueError(
                    f"plan is for {cache.num_rows} rows, features have "
                    f"{source.num_rows}")
            return cache
        layout = partial(
            make_plan, num_rows=source.num_rows, row_bytes=source.row_bytes,
            device_budget_bytes=device_budget_bytes,
            host_budget_bytes=host_budget_bytes, counts=self._hotness(),
            trace=() if self.profile is None else self.profile.trace,
            trace_covers_epoch=self.profile is not None
            and self.profile.num_batches >= self.num_batches)
        base = _once_each(partial(layout, policy))
        priced = window is None and staging is None
        if staging is None:
            staging = self._staging(source, base, asked)
        plan = partial(base, staging=staging)
        if reuse == "auto":
            chosen = plan(window=asked)
            levels = self._reuse_pays(source, chosen, device_budget_bytes)
            if levels:
                chosen = plan(window=asked, reuse_levels=levels)
        else:
            chosen = plan(window=asked, reuse_levels=levels)
            if levels:
                self._reuse_pays(source, chosen, device_budget_bytes,
                                 forced=reuse)
        if window is None and not staging and not levels and chosen.window:
            chosen = self._window_pays(source, chosen)
        if "hotness" in _needs(policy) and self.placement == "frequency":
            static = self._static_pays(source, layout, chosen) if priced \
                and not chosen.reuse_levels else None
            chosen = static or self._spans_pay(source, chosen)
        return chosen

    def _costs(self, source) -> KernelCosts:
        """This machine's kernel costs for ``source``'s rows."""
        return measure_kernel_costs(source.row_bytes, str(self.device))

    def _reuse_pays(self, source, plan: CachePlan, device_budget_bytes,
                    forced: str | None = None) -> int:
        """Reuse levels that pay on the profile (0: none), of 1 and 2, the
        one saving the most; said in one log line. ``plan`` is the cache
        without reuse, or, ``forced``, with the levels asked for, which
        are judged and kept. Each ring is charged the device room it takes
        from the cache (`reuse_ring_rows`): the requests of the rows the cache
        would no longer hold (`lost_hit_share`), with their transfers and
        reads."""
        costs, trace = self._costs(source), self.profile.trace
        table = source.num_rows * TABLE_BYTES_PER_ROW
        score = self._hotness()
        verdicts = {}
        for n in [plan.reuse_levels] if forced else [1, 2]:
            sizing = reuse_profile(trace, n)
            if device_budget_bytes < table:
                log.info("batch reuse (%s) not planned: its id table takes "
                         "%d bytes of device memory, the budget is %d",
                         _REUSE_NAMES[n], table, device_budget_bytes)
                continue
            taken = reuse_ring_rows(plan, n, sizing, table)
            held = plan.held_rows + (taken if forced else 0)
            lost = lost_hit_share(self.profile.counts, score, held,
                                  held - taken)
            hit = min(1.0, plan.hit_rate + (lost if forced else 0.0))
            miss = 1.0 - hit + lost
            added = spared_read_seconds(
                source, trace, miss, random_rows(lost / miss)) if lost \
                else 0.0
            spared = spared_read_seconds(source, trace, miss,
                                         reused_rows(trace, n))
            verdicts[n] = reuse_verdict(n, sizing, costs, hit, spared,
                                        plan.num_rows, lost=lost,
                                        lost_read_s=added)
        if not verdicts:
            return 0
        best = max(verdicts, key=lambda n: verdicts[n].saves -
                   verdicts[n].costs)
        log.info("%s", verdicts[best].describe(
            f"reuse={forced or _REUSE_NAMES[best]!r}", bool(forced)))
        return best if verdicts[best].pays else 0

    def _window_pays(self, source, plan: CachePlan) -> CachePlan:
        """``plan``, or ``plan`` with no lookahead where the window saves
        less than it costs: the hits its static split gains with the
        window over none, replayed on the profile as the split was
        chosen (`choose_static_rows`); said in one log line."""
        trace = list(self.profile.trace) if self.profile is not None else []
        with_window = plan.hit_rate
        without = with_window
        if len(trace) >= 2:
            hotness, held_out = split_profile(trace, plan.num_rows)
            without = replay(make_policy(
                plan.policy, plan.num_rows, plan.held_rows,
                hotness=hotness, static_rows=plan.static_rows, window=0),
                held_out)
        miss, gained = 1.0 - without, max(0.0, with_window - without)
        rows = _rows_per_batch(trace)
        spared = spared_read_seconds(source, trace, miss, random_rows(
            gained / miss if miss else 0.0))
        verdict = window_verdict(plan.window, rows, gained,
                                 self._costs(source), spared)
        log.info("%s", verdict.describe(f"window={plan.window}"))
        return plan if verdict.pays else replace(plan, window=0)

    def _spans_pay(self, source, plan: CachePlan, spans=None
                   ) -> CachePlan:
        """``plan``, its static rows below the device tier's held as whole
        spans where the disk model prices the reads of the rest lower so
        on the profile (`hmgraph.cache.placement`; ``spans``: its answer
        for ``plan``, where taken); said in one log line."""
        span, seconds = spans or choose_span_rows(
            source, self.profile.trace, self._span_first(plan),
            plan.placed_rows)
        if not seconds:
            return plan
        tried = ", ".join(f"{1e3 * s:.1f} ms in spans of {n}" for n, s in
                          seconds.items() if n)
        log.info("static rows %s: reads of the rest modelled at %.1f ms a "
                 "batch held as the hottest rows, %s (held-out profile)",
                 f"in spans of {span}" if span else "by hotness",
                 1e3 * seconds[0], tried)
        return replace(plan, span_rows=span)

    def _static_pays(self, source, layout, plan: CachePlan
                     ) -> CachePlan | None:
        """``presample``'s plan (``plan``'s policy with every row static
        and no window, less its bookkeeping) where ``plan`` has nothing
        dynamic, or its dynamic region spares less than its window and
        staging cost on the profile (`static_verdict`, said in one log
        line); None: ``plan`` stays. ``layout`` makes a plan from a
        policy, a window and a staging share."""
        trace = list(self.profile.trace)
        if not POLICIES[plan.policy].splits_static:
            return None
        static = layout("presample", window=0, staging=0.0)
        spans = choose_span_rows(source, trace, self._span_first(static),
                                 static.held_rows)
        if plan.window or plan.staging_rows or \
                plan.static_rows < plan.held_rows:
            if not spans[1]:  # not priced: no disk model or profile
                return None
            dynamic = staged_reads(source, self._misses(
                plan, plan.held_rows), plan.window, plan.staging_rows)
            verdict = static_verdict(
                plan.window, _rows_per_batch(trace),
                dynamic, spans[1][spans[0]], spans[0], self._costs(source))
            log.info("%s", verdict.describe(f"window={plan.window}"))
            if verdict.pays:
                return None
        log.info("%s with every row static and no window: presample's "
                 "plan, %d rows held against %d (no staging area, no "
                 "dynamic bookkeeping)", plan.policy, static.held_rows,
                 plan.held_rows)
        return self._spans_pay(source, static, spans)

    def _span_first(self, plan: CachePlan) -> int:
        """Static rows kept by hotness above the spans: the device tier's
        on a GPU, whose hits also spare transfers; none on the CPU."""
        if self.device.type == "cpu":
            return 0
        return min(plan.device_rows, plan.placed_rows)

    def _placement_score(self, plan: CachePlan) -> torch.Tensor | None:
        """The score static placement ranks rows by: the profiled one,
        or its spans' (``plan.span_rows``)."""
        score = self._hotness()
        if score is None or not plan.span_rows:
            return score
        return span_score(score, self._span_first(plan), plan.span_rows)

    def _cache(self, ntype, source, plan: CachePlan):
        """The cache ``plan`` lays out over ``source``."""
        degrees = None
        if "degrees" in _needs(plan.policy):
            degrees = sum((self.graph.in_degrees(etype=e) for e in
                           self.graph.canonical_etypes if e[2] == ntype),
                          torch.zeros(source.num_rows, dtype=torch.int64))
        return build_cache(
            source, plan, self.device, counts=self._placement_score(plan),
            degrees=degrees,
            hop_counts=None if self.profile is None
            else self.profile.hop_counts)

    @staticmethod
    def _reads_from(source, built, plan: CachePlan, off: bool) -> Feature:
        """What batches read: the source where caching is off (rows
        straight from it, as DGL gathers, unless the GPU reads its pinned
        rows in place through the cache's ``device`` engine, as DGL's
        UVA gathers), batch reuse, or the cache."""
        if off and not plan.staging_rows and not plan.reuse_levels and \
                not built.reads_source_in_place:
            return source
        if plan.reuse_levels:
            return BatchReuse(built, plan.reuse_levels, plan.reuse_rows)
        return built

    def _staging(self, source, plan, window: int) -> float:
        """The host budget's share for window read planning:
        `STAGING_SHARE` where the window is on, the source reads blocks
        (``read_along``) and, on the profile, staging spares more reads
        than it costs, the cache holding what it leaves (replayed,
        `hmgraph.cache.staging_model`), said in one log line; on where
        nothing prices it. ``plan`` makes a plan from a window and a
        staging share."""
        if window <= 0 or not hasattr(source, "read_along"):
            return 0.0
        trace = [] if self.profile is None else list(self.profile.trace)
        if len(trace) < 2 or getattr(source, "disk", None) is None:
            return STAGING_SHARE
        on = plan(window=window, staging=STAGING_SHARE)
        if not on.staging_rows:
            return 0.0
        # ``on``'s cache, or, holding the staging area's rows too, the
        # cache without staging (its static part kept: not replanned).
        without = staged_reads(source, self._misses(
            on, on.held_rows + on.staging_rows), window, 0).seconds
        staged = staged_reads(source, self._misses(on, on.held_rows),
                              window, on.staging_rows)
        verdict = staging_verdict(
            window, _rows_per_batch(trace),
            on.staging_rows, without, staged, self._costs(source))
        log.info("%s", verdict.describe(f"staging={STAGING_SHARE}"))
        return STAGING_SHARE if verdict.pays else 0.0

    def _misses(self, plan: CachePlan, capacity: int) -> list:
        """Ids ``plan``'s policy misses per held-out profiled batch
        (`PRICED_BATCHES` of them), with ``capacity`` rows, its static
        part and window kept; each replayed once."""
        key = (plan.policy, plan.num_rows, capacity, plan.static_rows,
               plan.window)
        if key not in self._missed:
            hotness, held_out = split_profile(list(self.profile.trace),
                                              plan.num_rows)
            self._missed[key] = miss_trace(make_policy(
                plan.policy, plan.num_rows, capacity, hotness=hotness,
                hop_counts=self.profile.hop_counts,
                degrees=self.graph.in_degrees() if "degrees" in _needs(
                    plan.policy) else None, static_rows=plan.static_rows,
                window=plan.window), held_out[:PRICED_BATCHES])
        return self._missed[key]

    def _hotness(self) -> torch.Tensor | None:
        """Profiled score per row for static placement."""
        if self.profile is None:
            return None
        if self.placement == "layer-aware":
            return layer_aware_score(self.profile.hop_counts)
        return self.profile.counts

    def _profile(self) -> None:
        if self.profile is not None:  # given, or already taken
            return
        # Lazy: DGL takes 4 s to import, and presampling imports it.
        import dgl

        from hmgraph.samplers.presample import presample

        if not torch.is_tensor(self.indices):
            raise ValueError("profiled cache policies need a tensor of "
                             "indices, not a dict")
        start = time.perf_counter()
        self.profile = presample(
            self.graph, self.graph_sampler, self.indices, self.batch_size,
            self.profile_batches, seed=(self.seed or 0) + 7919,
            shuffle=self.shuffle)
        # Profiling seeded DGL's generator; hand it back to the user's
        # seeds (NumPy's global generator, which DGL's shuffle follows).
        dgl.seed(int(np.random.randint(0, 2**31 - 1)))
        log.info("profiled %d batches in %.1f s", self.profile.num_batches,
                 time.perf_counter() - start)


def _once_each(make):
    """``make`` (`make_plan` with all but ``window``, ``staging`` and
    ``reuse_levels`` given), each plan made once: staging is priced on
    the plan with it (`CacheBuilder._staging`), which is then the plan
    where it pays."""
    plans = {}

    def plan(window: int, staging: float, reuse_levels: int = 0):
        key = (window, staging, reuse_levels)
        if key not in plans:
            plans[key] = make(window=window, staging=staging,
                              reuse_levels=reuse_levels)
        return plans[key]

    return plan


def _rows_per_batch(trace) -> float:
    """Mean ids a profiled batch asks for (0 for no batch)."""
    return float(np.mean([len(ids) for ids in trace])) if trace else 0.0
