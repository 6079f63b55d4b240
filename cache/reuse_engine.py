"""Batch reuse's per-batch work in numba kernels, GIL free.

`hmgraph.cache.reuse.BatchReuse` reads a batch in a few passes over its
rows; on a CPU device each is one loop compiled here
(``nogil=True``: sampling and training go on in other threads
meanwhile), with work proportional to the batch and nothing per node of
the graph:

1. `stamp_ids`: the lookahead's ids stamped in the table;
2. `scan_batch`: each id's batch counter, ring row and stamp (one
   12-byte entry of the table) read once, asked of the memory a few ids
   ahead (`prefetch`): which level holds it, which rows the batch keeps
   (the next batch's first); the rest collected in request order;
3. `sort_rest`: the rest sorted by id for the cache below (a stable LSD
   radix sort, O(rows) per 11-bit digit);
4. `gather_batch`: the batch built from the ring and the rows the cache
   below returned, each row copied once; or `gather_reused`: only the
   ring's rows, where the cache below wrote the rest into the batch
   itself (`hmgraph.cache.coordinated.FeatureCache.read_into`, whose
   compiled engine writes hits at given rows with `gather_at`);
5. `write_ring`: the kept rows into the ring, their ids into the table.

Rows are ``uint8`` matrices of ``row_bytes`` columns
(`hmgraph.cache.engine.byte_rows`), so one compiled kernel serves every
dtype. The kernels are compiled on first use and cached beside this file
(``cache=True``). `tests/test_reuse.py` runs them and the tensor code of
`BatchReuse` (the reference) on the same traces and requires the same
rows and counters after every batch.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from hmgraph.cache.engine import copy_row

__all__ = ["RESIDENT", "gather_at", "gather_batch", "gather_reused",
           "radix_passes", "scan_batch", "sort_rest", "stamp_ids",
           "write_ring"]

_NOGIL = {"nogil": True, "cache": True}
#: The batch counter of rows the cache below holds on the device for good
#: (`hmgraph.cache.reuse`'s ``_RESIDENT``).
RESIDENT = 2**31 - 1
_DIGIT_BITS = 11
_DIGITS = 1 << _DIGIT_BITS
#: Ids ahead whose table entry `scan_batch` and `write_ring` ask the
#: memory for (`prefetch`).
_AHEAD = 16


@intrinsic
def prefetch(typingctx, array, row):
    """Ask the memory for row ``row`` of ``array`` (its first cache line)
    ahead of use: ``llvm.prefetch``, a hint that cannot fault.

    A batch's ids hit the per-node table at random, each a cache miss, and
    `scan_batch`'s branches wait on those loads: a mispredicted branch
    then waits for the memory one id at a time. Asked ``_AHEAD`` ids
    before, the entry is in cache when the branch comes.
    """
    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        view = context.make_array(array_type)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        index = [args[1]] + [zero] * (array_type.ndim - 1)
        pointer = cgutils.get_item_pointer(context, builder, array_type,
                                           view, index)
        bytes_pointer = ir.IntType(8).as_pointer()
        int32 = ir.IntType(32)
        function = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(
                ir.VoidType(), [bytes_pointer, int32, int32, int32]),
            "llvm.prefetch.p0i8")
        # read, keep in all cache levels, data
        builder.call(function, [builder.bitcast(pointer, bytes_pointer),
                                int32(0), int32(3), int32(1)])
        return context.get_dummy_value()

    return types.void(array, types.intp), codegen


def radix_passes(num_rows: int) -> int:
    """Digits of `sort_rest` for ids below ``num_rows`` (at least one)."""
    bits = max(1, int(num_rows - 1).bit_length())
    return -(-bits // _DIGIT_BITS)


@njit(**_NOGIL)
def scan_batch(ids, table, batch, levels, start1, first1, start2, first2,
               ring_rows, value, distances, room, source, rest, keep,
               later):
    """One pass over the batch: which ids a level holds, and which rows
    the batch keeps.

    ``table`` holds three int32 per node: the batch counter it was last
    kept by, its ring row, its lookahead stamp. Id ``i`` is held by level
    ``age`` (1: the last batch) when its counter is ``batch - age`` and
    its ring row is not before the level's first valid row (``first``,
    counted from ``start``, wrapping at ``ring_rows``): ``source[i]`` is
    set to that ring row, else to -1 and ``i`` appended to ``rest``.

    The rows kept go to ``keep``: those stamped ``value`` (the next
    batch's) first, then those stamped ``value - 1`` when ``distances``
    is 2 (``later`` is their scratch), each in request order, at most
    ``room``; with ``distances == 0`` the first ``room``. Rows the cache
    below holds for good (counter `RESIDENT`) are never kept.

    Returns ``(rows of level 1, of level 2, of the rest, rows kept, of
    which the next batch's)``.
    """
    level1 = 0
    level2 = 0
    missing = 0
    kept = 0
    after = 0
    count = ids.shape[0]
    for i in range(count):
        if i + _AHEAD < count:
            prefetch(table, ids[i + _AHEAD])
        node = ids[i]
        counter = table[node, 0]
        age = batch - np.int64(counter)
        held = False
        if age == 1 or (age == 2 and levels == 2):
            position = np.int64(table[node, 1])
            start = start1 if age == 1 else start2
            first = first1 if age == 1 else first2
            if first == 0 or (position - start) % ring_rows >= first:
                held = True
                source[i] = position
                if age == 1:
                    level1 += 1
                else:
                    level2 += 1
        if not held:
            source[i] = -1
            rest[missing] = i
            missing += 1
        if counter == RESIDENT or kept >= room:
            continue
        if distances == 0:
            keep[kept] = i
            kept += 1
            continue
        stamp = table[node, 2]
        if stamp == value:
            keep[kept] = i
            kept += 1
        elif distances > 1 and stamp == value - 1:
            later[after] = i
            after += 1
    next_only = kept if distances else 0
    for k in range(min(after, room - kept)):
        keep[kept] = later[k]
        kept += 1
    return level1, level2, missing, kept, next_only


@njit(**_NOGIL)
def sort_rest(ids, rest, count, passes, wanted, source, where, keys, spare):
    """The ids of ``rest[:count]`` sorted (stable LSD radix sort, 11 bits
    a digit, ``passes`` digits) into ``wanted[:count]``; the id at
    position ``i`` of the batch that is ``k``-th in that order gets
    ``source[i] = -2 - k`` (`gather_batch` takes its row from row ``k``
    of the cache below's). ``where``, ``keys`` and ``spare`` are scratch
    of ``count`` entries or more."""
    # Ping-pong between (wanted, where) and (keys, spare), starting where
    # the last pass ends in (wanted, where).
    if passes % 2 == 0:
        key_a, pos_a, key_b, pos_b = wanted, where, keys, spare
    else:
        key_a, pos_a, key_b, pos_b = keys, spare, wanted, where
    for k in range(count):
        i = rest[k]
        key_a[k] = ids[i]
        pos_a[k] = i
    counts = np.empty(_DIGITS + 1, dtype=np.int64)
    shift = 0
    for _ in range(passes):
        counts[:] = 0
        for k in range(count):
            counts[((key_a[k] >> shift) & (_DIGITS - 1)) + 1] += 1
        for digit in range(_DIGITS):
            counts[digit + 1] += counts[digit]
        for k in range(count):
            digit = (key_a[k] >> shift) & (_DIGITS - 1)
            at = counts[digit]
            key_b[at] = key_a[k]
            pos_b[at] = pos_a[k]
            counts[digit] = at + 1
        key_a, pos_a, key_b, pos_b = key_b, pos_b, key_a, pos_a
        shift += _DIGIT_BITS
    for k in range(count):
        source[where[k]] = -2 - k


@njit(**_NOGIL)
def gather_batch(source, ring, rows, out):
    """The batch, written in order: ``out[i] = ring[source[i]]`` where
    ``source[i] >= 0``, else ``rows[-2 - source[i]]`` (the cache below's
    rows; in order, the writes stream: 52 ms for 541K rows of 400 bytes,
    against 65 ms scattering those rows after the ring's)."""
    for i in range(source.shape[0]):
        position = source[i]
        if position >= 0:
            copy_row(out, i, ring, position)
        else:
            copy_row(out, i, rows, -2 - position)


@njit(**_NOGIL)
def gather_reused(source, ring, out):
    """``out[i] = ring[source[i]]`` where ``source[i] >= 0``; the other
    rows of ``out`` (the cache below wrote them in place) are left as
    they are."""
    for i in range(source.shape[0]):
        position = source[i]
        if position >= 0:
            copy_row(out, i, ring, position)


@njit(**_NOGIL)
def gather_at(store, slot, buffers, out, at, first, stop):
    """`hmgraph.cache.engine.gather` into rows ``at`` of ``out``:
    ``out[at[i]] = buffers[store[i]][slot[i]]`` wherever ``first <=
    store[i] < stop``; rows copied per store returned."""
    counts = np.zeros(len(buffers), dtype=np.int64)
    for i in range(store.shape[0]):
        j = store[i]
        if first <= j < stop:
            copy_row(out, at[i], buffers[j], slot[i])
            counts[j] += 1
    return counts


@njit(**_NOGIL)
def stamp_ids(table, coming, value):
    """The lookahead's stamp (``table[:, 2]``) of ``coming`` ids set to
    ``value``."""
    for k in range(coming.shape[0]):
        table[coming[k], 2] = value


@njit(**_NOGIL)
def write_ring(ids, out, keep, count, ring, head, table, batch):
    """Rows ``out[keep[k]]`` into ring rows ``head + k`` (wrapping), and
    their ids' batch counter (``batch``) and ring row into the table."""
    ring_rows = ring.shape[0]
    for k in range(count):
        if k + _AHEAD < count:
            prefetch(table, ids[keep[k + _AHEAD]])
        i = keep[k]
        position = (head + k) % ring_rows
        copy_row(ring, position, out, i)
        node = ids[i]
        table[node, 0] = batch
        table[node, 1] = position
