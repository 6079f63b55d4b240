"""Locality-weighted neighbour sampling: numba kernels and their reference.

`ClusterSampler` with ``0 < locality <= 1`` samples each node's in-edges
without replacement, weight 1 for a neighbour in the node's cluster and
``w = 1 - locality`` for one outside it (``w = 0``: inside only). With
two weights the draw splits in two: successive weighted draws decide only
*how many* neighbours come from inside (draw ``j`` takes an inside one
with probability ``a / (a + w b)``, ``a`` and ``b`` the inside and outside
neighbours not yet taken), and that many are then drawn uniformly from
the inside ones (Floyd's algorithm), the rest from the outside ones. The
sets have the distribution of DGL's weighted sampling without replacement
(``sample_neighbors`` with ``prob``), at O(fanout) per node where DGL's
costs O(degree).

Each row of the graph's CSC is laid out once, inside neighbours first
(`partition_rows`: ``(source, edge id)`` pairs, one cache line per pick),
and every random number is a hash of ``(key, node, counter)``
(SplitMix64's finaliser ``mix``: ``mix(mix(key + node) + counter)``; a
uniform is its top 53 bits over ``2**53``, an integer below ``m`` its top
31 bits times ``m`` shifted right 31), so the compiled kernel
(`sample_layer`: ``nogil``, cached on disk, the misses of a few nodes
ahead prefetched) and the torch reference (`sample_layer_torch`,
whole-tensor operations in int64 and float64, no fused multiply-add on
either side) draw the same numbers and sample the same edges, bit for
bit (`tests/test_cluster.py`). A layer's sources are its
destinations first, then every new source in edge order (as
`dgl.to_block`); the kernel finds them with a stamped table of one
``(stamp, local id)`` pair per node of the graph, so a layer costs
O(its edges), with no sort and no pass over the graph.

For node ``v`` of degree ``d = a + b`` (``a`` inside) and fanout ``f``:
the eligible neighbours are all ``d`` (``w > 0``) or the ``a`` inside
(``w = 0``); at most ``f`` of them are taken (all where ``f < 0`` or
``f`` >= their number). Counter ``j`` decides draw ``j``; counters
``IN_STREAM + s`` and ``OUT_STREAM + s`` make step ``s`` of the inside and
outside choices (Floyd: step ``s`` of ``m`` from ``n`` draws ``t`` below
``n - m + s + 1`` and takes ``n - m + s`` instead where ``t`` is taken).
A class taken whole keeps its layout order; the edges of ``v`` are its
inside picks, then its outside picks.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
import torch
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["IN_STREAM", "OUT_STREAM", "partition_rows", "sample_layer",
           "sample_layer_torch"]

_NOGIL = {"nogil": True, "cache": True}

#: Counter offsets of the inside and outside choices (the class draws use
#: ``0 .. fanout - 1``).
IN_STREAM, OUT_STREAM = 1 << 32, 2 << 32

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S11, _S27, _S30 = np.uint64(11), np.uint64(27), np.uint64(30)
_S31, _S33 = np.uint64(31), np.uint64(33)
_UNIT = 1.0 / 9007199254740992.0  # 2 ** -53
#: Prefetch distance (nodes or edges), and at most how many 64-byte lines
#: of a row are prefetched (8-byte pairs; 16-byte ones get half the row).
_AHEAD, _ROW_LINES, _LINE_PAIRS = 16, 8, 8


# -- Kernels ----------------------------------------------------------------

@njit(**_NOGIL)
def partition_rows(indptr, indices, eids, clusters, rows):
    """Lay out every CSC row inside neighbours first: ``rows[p] = (source,
    edge id)`` for position ``p`` of the laid-out rows (each class in its
    CSC order); returns the inside count per node (int64)."""
    count = indptr.shape[0] - 1
    inside = np.empty(count, dtype=np.int64)
    widest = 0
    for v in range(count):
        widest = max(widest, indptr[v + 1] - indptr[v])
    home = np.empty(widest, dtype=np.bool_)  # one row's classes
    for v in range(count):
        first, q = indptr[v], indptr[v]
        for p in range(first, indptr[v + 1]):
            home[p - first] = clusters[indices[p]] == clusters[v]
            if home[p - first]:
                rows[q, 0], rows[q, 1] = indices[p], eids[p]
                q += 1
        inside[v] = q - first
        for p in range(first, indptr[v + 1]):
            if not home[p - first]:
                rows[q, 0], rows[q, 1] = indices[p], eids[p]
                q += 1
    return inside


@njit(inline="always")
def _mix(x):
    """SplitMix64's output function of ``x`` (uint64)."""
    x = x + _GOLDEN
    x = (x ^ (x >> _S30)) * _MIX1
    x = (x ^ (x >> _S27)) * _MIX2
    return x ^ (x >> _S31)


@njit(inline="always")
def _below(r, bound):
    """``r``'s top 31 bits scaled to ``[0, bound)`` (``bound < 2**31``)."""
    return np.int64(((r >> _S33) * np.uint64(bound)) >> _S31)


@njit(inline="always")
def _choose(rows, start, size, picks, state, stream, src, eid, at, chosen):
    """``picks`` of the ``size`` pairs from ``rows[start]`` on, uniformly
    without replacement (all, in order, where ``picks >= size``), written
    to ``src`` / ``eid`` from ``at`` on; returns the next free position.
    Floyd's steps check the positions taken in one 64-bit word where the
    row has at most 64, else in ``chosen`` (the same choices)."""
    if picks >= size:
        for s in range(size):
            src[at + s], eid[at + s] = rows[start + s, 0], rows[start + s, 1]
        return at + size
    if size <= 64:  # the positions taken as the bits of one word
        taken = np.uint64(0)
        for s in range(picks):
            top = size - picks + s
            t = _below(_mix(state + np.uint64(stream + s)), top + 1)
            if (taken >> np.uint64(t)) & np.uint64(1):
                t = top
            taken |= np.uint64(1) << np.uint64(t)
            src[at + s], eid[at + s] = rows[start + t, 0], rows[start + t, 1]
        return at + picks
    for s in range(picks):
        top = size - picks + s
        t = _below(_mix(state + np.uint64(stream + s)), top + 1)
        for previous in range(s):
            if chosen[previous] == t:
                t = top
                break
        chosen[s] = t
        src[at + s], eid[at + s] = rows[start + t, 0], rows[start + t, 1]
    return at + picks


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the CPU for the cache line of ``array[index]`` (the first item
    of that row where ``array`` is 2-D): LLVM's ``prefetch`` for a read,
    kept in every cache level. The kernels name what they will read a few
    nodes or edges ahead, so the misses of a batch overlap."""
    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        where = [args[1]] + [context.get_constant(types.intp, 0)] * (
            array_type.ndim - 1)
        pointer = cgutils.get_item_pointer(context, builder, array_type, view,
                                           where, wraparound=False)
        byte = ir.IntType(8).as_pointer()
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [byte] + [
                ir.IntType(32)] * 3), "llvm.prefetch.p0i8")
        builder.call(function, [builder.bitcast(pointer, byte)] + [
            ir.Constant(ir.IntType(32), flag) for flag in (0, 3, 1)])
        return context.get_dummy_value()

    return types.void(array, index), codegen


@njit(inline="always")
def _class_counts(seeds, indptr, inside, fanout, weight, key):
    """(1) How many neighbours each seed takes from each class.

    Returns
    -------
    start, size_in, size_out, k_in, offsets : int64 arrays
        Per seed: its laid-out row's start, inside and outside sizes and
        the inside picks; ``offsets`` (n + 1) the block's CSC ``indptr``.
    """
    n = seeds.shape[0]
    start = np.empty(n, dtype=np.int64)
    size_in = np.empty(n, dtype=np.int64)
    size_out = np.empty(n, dtype=np.int64)
    k_in = np.empty(n, dtype=np.int64)
    offsets = np.empty(n + 1, dtype=np.int64)
    offsets[0] = 0
    w = np.float64(weight)
    for i in range(n):
        if i + _AHEAD < n:
            _prefetch(indptr, seeds[i + _AHEAD])
            _prefetch(inside, seeds[i + _AHEAD])
        v = seeds[i]
        start[i], a = indptr[v], inside[v]
        b = indptr[v + 1] - start[i] - a
        size_in[i], size_out[i] = a, b
        eligible = a + b if w > 0.0 else a
        if fanout < 0 or eligible <= fanout:
            k_in[i], count = a, eligible
        elif w == 0.0:
            k_in[i], count = fanout, fanout
        else:
            state = _mix(key + np.uint64(v))
            left_in, left_out = a, b
            for j in range(fanout):
                if left_in == 0 or left_out == 0:
                    break
                u = np.float64(_mix(state + np.uint64(j)) >> _S11) * _UNIT
                if u < left_in / (left_in + w * left_out):
                    left_in -= 1
                else:
                    left_out -= 1
            # A class run dry leaves the rest to the other.
            k_in[i], count = fanout - (b - left_out) if left_in else a, \
                fanout
        offsets[i + 1] = offsets[i] + count
    return start, size_in, size_out, k_in, offsets


@njit(inline="always")
def _block_sources(seeds, src, table, tick):
    """(3) The block's source nodes (``seeds`` first) and local ids.

    Returns
    -------
    nodes, local : int64 arrays
        Every source once, in first-seen order, and the local id of
        every edge's source (``src[e]``).
    """
    n, edges = seeds.shape[0], src.shape[0]
    nodes = np.empty(n + edges, dtype=np.int64)
    for i in range(n):
        v = seeds[i]
        nodes[i] = v
        if table[v, 0] != tick:
            table[v, 0], table[v, 1] = tick, i
    count = n
    local = np.empty(edges, dtype=np.int64)
    for e in range(edges):
        if e + _AHEAD < edges:
            _prefetch(table, src[e + _AHEAD])
        u = src[e]
        if table[u, 0] != tick:
            table[u, 0], table[u, 1] = tick, count
            nodes[count] = u
            count += 1
        local[e] = table[u, 1]
    return nodes[:count], local


@njit(**_NOGIL)
def sample_layer(seeds, indptr, inside, rows, fanout, weight, key, table,
                 tick):
    """One layer: the sampled in-edges of ``seeds`` and their block.

    Parameters
    ----------
    seeds : int64 array
        Destination nodes, in block order.
    indptr, inside, rows : arrays
        The graph's CSC ``indptr``, the inside count per node and the
        laid-out rows (`partition_rows`).
    fanout : int
        Neighbours per node; negative takes every eligible one.
    weight : float
        ``1 - locality``: an outside neighbour's weight (0: none).
    key : uint64
        The layer's random key.
    table, tick : int64 array (nodes, 2) and int
        The stamped table (``table[v] = (stamp, local id)``) and this
        layer's stamp, unused before.

    Returns
    -------
    nodes, indptr, local, eids : int64 arrays
        The block's source nodes (``seeds`` first), its CSC ``indptr``
        over the destinations, the source's local id and the graph's edge
        id of every edge.
    """
    n = seeds.shape[0]
    start, size_in, size_out, k_in, offsets = _class_counts(
        seeds, indptr, inside, fanout, weight, key)  # (1)
    edges = offsets[n]
    src = np.empty(edges, dtype=np.int64)
    eids = np.empty(edges, dtype=np.int64)
    chosen = np.empty(max(fanout, 1), dtype=np.int64)
    for i in range(n):  # (2) which ones
        if i + _AHEAD < n:
            line = start[i + _AHEAD]
            end = min(line + size_in[i + _AHEAD] + size_out[i + _AHEAD],
                      line + _ROW_LINES * _LINE_PAIRS)
            while line < end:
                _prefetch(rows, line)
                line += _LINE_PAIRS
        state = _mix(key + np.uint64(seeds[i]))
        at = _choose(rows, start[i], size_in[i], k_in[i], state, IN_STREAM,
                     src, eids, offsets[i], chosen)
        _choose(rows, start[i] + size_in[i], size_out[i],
                offsets[i + 1] - at, state, OUT_STREAM, src, eids, at,
                chosen)
    nodes, local = _block_sources(seeds, src, table, tick)  # (3)
    return nodes, offsets, local, eids


# -- Reference --------------------------------------------------------------

def _signed(value: int) -> int:
    """A uint64 constant as the int64 of the same bits."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _srl(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


def _mix_torch(x: torch.Tensor) -> torch.Tensor:
    """`_mix` on int64 tensors (two's complement arithmetic wraps as
    uint64's does)."""
    x = x + _signed(int(_GOLDEN))
    x = (x ^ _srl(x, 30)) * _signed(int(_MIX1))
    x = (x ^ _srl(x, 27)) * _signed(int(_MIX2))
    return x ^ _srl(x, 31)


def _choose_torch(size, picks, state, stream, width):
    """Floyd's choices of `_choose` for every node at once: a ``(nodes,
    width)`` matrix whose row ``i`` starts with node ``i``'s ``picks[i]``
    positions (in ``[0, size[i])``) where it takes fewer than all."""
    chosen = torch.zeros(size.numel(), max(width, 1), dtype=torch.int64)
    for s in range(width):
        top = size - picks + s
        t = (_srl(_mix_torch(state + (stream + s)), 33) * (top + 1)) >> 31
        t = torch.where((chosen[:, :s] == t[:, None]).any(1), top, t)
        chosen[:, s] = torch.where(s < picks, t, 0)
    return chosen


def sample_layer_torch(seeds, indptr, inside, rows, fanout, weight, key):
    """`sample_layer` in whole-tensor torch operations (the reference).

    Parameters and returns as `sample_layer`'s (tensors, ``key`` an int),
    without the stamped table.
    """
    start = indptr[seeds]
    a = inside[seeds]
    b = indptr[seeds + 1] - start - a
    eligible = a + b if weight > 0 else a
    whole = (eligible <= fanout) | (fanout < 0)
    state = _mix_torch(_signed(key) + seeds)
    # (1) How many from each class.
    if weight == 0:
        k_in = torch.where(whole, a, fanout)
    else:
        left_in, left_out = a.clone(), b.clone()
        for j in range(max(fanout, 0)):
            u = _srl(_mix_torch(state + j), 11).double() * _UNIT
            share = left_in.double() / (left_in.double()
                                        + weight * left_out.double())
            inner = u < share
            left_in -= (~whole & inner).long()
            left_out -= (~whole & ~inner).long()
        k_in = torch.where(whole, a, a - left_in)
    k_out = torch.where(whole, eligible, fanout) - k_in
    # (2) Which ones: each class's picks in positions of the laid-out row.
    width = max(fanout, 0)
    counts = k_in + k_out
    offsets = torch.zeros(seeds.numel() + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=offsets[1:])
    src = torch.empty(int(offsets[-1]), dtype=torch.int64)
    eids = torch.empty_like(src)
    for base, size, picks, stream, skip in (
            (start, a, k_in, IN_STREAM, 0),
            (start + a, b, k_out, OUT_STREAM, k_in)):
        chosen = _choose_torch(size, torch.minimum(picks, size), state,
                               stream, width)
        node = torch.repeat_interleave(torch.arange(seeds.numel()), picks)
        step = torch.arange(node.numel()) - torch.repeat_interleave(
            torch.cumsum(picks, 0) - picks, picks)
        floyd = chosen[node, step.clamp(max=chosen.shape[1] - 1)]
        position = torch.where((picks >= size)[node], step, floyd)
        at = offsets[node] + skip[node] + step if torch.is_tensor(skip) \
            else offsets[node] + step
        pairs = rows[base[node] + position].long()
        src[at], eids[at] = pairs[:, 0], pairs[:, 1]
    # (3) The block's sources: the seeds, then new ones in edge order.
    every = torch.cat([seeds, src])
    unique, inverse = torch.unique(every, return_inverse=True)
    first = torch.full((unique.numel(),), every.numel()).scatter_reduce_(
        0, inverse, torch.arange(every.numel()), "amin")
    new = torch.nonzero(first >= seeds.numel()).flatten()
    new = new[torch.argsort(first[new])]
    local_of = first.clone()
    local_of[new] = seeds.numel() + torch.arange(new.numel())
    nodes = torch.cat([seeds, unique[new]])
    return nodes, offsets, local_of[inverse[seeds.numel():]], eids
