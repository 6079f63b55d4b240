"""The compiled per-batch engine: the cache's hot path in numba, GIL free.

A batch's read is a handful of passes over its rows: find each id's slot,
copy the rows held into the output, collect the misses in file order,
let the policy decide, move rows into and out of the stores. The
reference implementation (`hmgraph.cache.coordinated`, ``engine="torch"``)
does each pass as tensor operations; here each is one loop compiled with
numba (``nogil=True``: sampling and training go on in other threads
meanwhile), in request order, with no sort of the request, no reordering
copy and nothing per node of the graph. Two passes cost more than the
batch: letting staged rows go scans the staging slots, and the hmgraph
policy's step (`choose_dynamic`) keys and selects over its dynamic region
as well as the misses (a partial sort: 4-6 ms a synth-small batch of
120,000 misses); a structure that keeps the region ordered would make
both O(batch).

Every kernel works on rows as bytes (``uint8`` matrices of ``row_bytes``
columns, `byte_rows`), so one compiled kernel serves every dtype. The
kernels are compiled on first use and cached beside this file
(``cache=True``), so a process pays the compilation once per machine.

`tests/test_engine.py` runs the compiled engine and the reference on the
same recorded traces and requires the same rows, counters and policy
decisions.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

__all__ = ["argsort", "argsort_ids", "back_to_back", "byte_rows",
           "choose_dynamic", "copy_admitted", "copy_row", "count_repeats",
           "evict_ids",
           "gather", "insert_slots", "lookup", "mark_window", "scatter_rows",
           "select_along", "unstage"]

_NOGIL = {"nogil": True, "cache": True}


def back_to_back(batches) -> tuple[np.ndarray, np.ndarray]:
    """The ids of ``batches`` (CPU int64 tensors) back to back, and each
    batch's bounds in them: what the kernels take for a window."""
    parts = [b.numpy() for b in batches]
    bounds = np.zeros(len(parts) + 1, dtype=np.int64)
    bounds[1:] = np.cumsum([len(p) for p in parts])
    ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    return ids.astype(np.int64, copy=False), bounds


def byte_rows(rows: torch.Tensor) -> np.ndarray:
    """A CPU tensor's rows as a ``(rows, row_bytes)`` uint8 NumPy view."""
    count = rows.shape[0]
    flat = rows.reshape(count, -1) if count else rows.reshape(0, max(
        1, int(np.prod(rows.shape[1:], dtype=np.int64))))
    return flat.view(torch.uint8).numpy()


@njit(nogil=True, cache=True, inline="always")
def copy_row(dst, i, src, j):
    """``dst[i] = src[j]``, byte by byte in a loop LLVM vectorises: 4.4x
    faster than the slice assignment (160,000 rows of 400 B: 12 against
    54 ms)."""
    for k in range(dst.shape[1]):
        dst[i, k] = src[j, k]


def argsort(ids: np.ndarray, num_rows: int) -> np.ndarray:
    """Positions that sort ``ids`` (each in ``[0, num_rows)``), stable."""
    return argsort_ids(ids, max(1, int(num_rows - 1).bit_length()))


@njit(**_NOGIL)
def argsort_ids(keys, bits):
    """Stable LSD radix argsort of non-negative ids below ``2**bits``:
    O(ids) per 11-bit digit (127,000 ids of a 200,000-row file: 0.9 ms,
    against 2.2 ms for NumPy's quicksort and 12.8 ms for its stable
    sort)."""
    n = keys.shape[0]
    order = np.arange(n)
    other = np.empty(n, dtype=np.int64)
    digits = np.empty(n, dtype=np.int64)
    shift = 0
    while shift < bits:
        counts = np.zeros(2049, dtype=np.int64)
        for i in range(n):
            digit = (keys[order[i]] >> shift) & 2047
            digits[i] = digit
            counts[digit + 1] += 1
        for digit in range(2048):
            counts[digit + 1] += counts[digit]
        for i in range(n):
            digit = digits[i]
            other[counts[digit]] = order[i]
            counts[digit] += 1
        order, other = other, order
        shift += 11
    return order


@njit(**_NOGIL)
def lookup(ids, slot_of, low, high, base, store, slot):
    """Which store holds each id, and in which of its slots.

    For every ``i`` where ``store[i] < 0``: if ``slot_of[ids[i]]`` falls in
    ``[low[j], high[j])``, set ``store[i] = base + j`` and ``slot[i]`` to
    the slot within store ``j``. Ids already found are left alone, so
    tables are probed one after another (a layer's, then staging's).
    """
    for i in range(ids.shape[0]):
        if store[i] >= 0:
            continue
        number = slot_of[ids[i]]
        if number < 0:
            continue
        for j in range(low.shape[0]):
            if low[j] <= number < high[j]:
                store[i] = base + j
                slot[i] = number - low[j]
                break


@njit(**_NOGIL)
def count_repeats(store, slot, seen, tick):
    """Ids found twice in one request, per store: each store's slot is
    stamped with ``tick`` when first read (``seen``: an int32 per slot,
    per store)."""
    repeats = np.zeros(len(seen), dtype=np.int64)
    for i in range(store.shape[0]):
        j = store[i]
        if j < 0:
            continue
        if seen[j][slot[i]] == tick:
            repeats[j] += 1
        else:
            seen[j][slot[i]] = tick
    return repeats


@njit(**_NOGIL)
def gather(store, slot, buffers, out, first=0, stop=127):
    """``out[i] = buffers[store[i]][slot[i]]`` wherever ``first <=
    store[i] < stop``; rows copied per store returned."""
    counts = np.zeros(len(buffers), dtype=np.int64)
    for i in range(store.shape[0]):
        j = store[i]
        if first <= j < stop:
            copy_row(out, i, buffers[j], slot[i])
            counts[j] += 1
    return counts


@njit(**_NOGIL)
def scatter_rows(buffer, offsets, row_bytes, targets, which, where, first):
    """Rows cut out of a read buffer into their places: row ``first + k``
    starts at byte ``offsets[k]`` of ``buffer`` and goes to row
    ``where[first + k]`` of ``targets[which[first + k]]``.

    Copied between two 1-D views, a loop LLVM vectorises: indexing the
    2-D target and the buffer in the loop itself copied byte by byte
    (163,000 rows of 400 B: 52 against 11.5 ms)."""
    for k in range(offsets.shape[0]):
        i = first + k
        start = offsets[k]
        row = targets[which[i]][where[i]]
        piece = buffer[start:start + row_bytes]
        for b in range(row_bytes):
            row[b] = piece[b]


@njit(**_NOGIL)
def mark_window(marks, marked, future, bounds):
    """Window read planning's marks: clear the last window's, then give
    every id of batch ``d`` ahead (``future[bounds[d-1]:bounds[d]]``)
    the distance to its nearest use (capped at 127)."""
    for k in range(marked.shape[0]):
        marks[marked[k]] = 0
    for d in range(bounds.shape[0] - 1, 0, -1):
        for k in range(bounds[d - 1], bounds[d]):
            marks[future[k]] = min(d, 127)


@njit(**_NOGIL)
def unstage(id_of, slot_of, free, num_free, marks, resident, layered):
    """Free the staged rows the window no longer needs or the cache layer
    holds (``resident``, where ``layered``); returns (rows freed, the new
    free count)."""
    freed = 0
    for s in range(id_of.shape[0]):
        node = id_of[s]
        if node < 0:
            continue
        if marks[node] > 0 and not (layered and resident[node]):
            continue
        free[num_free] = s
        num_free += 1
        slot_of[node] = -1
        id_of[s] = -1
        freed += 1
    return freed, num_free


@njit(**_NOGIL)
def select_along(future, bounds, marks, resident, layered, staged_slot_of,
                 missed, run_first, run_last, row_bytes, data_offset,
                 block_bytes, limit, num_rows):
    """Window rows worth bringing along with this batch's reads.

    A candidate is needed in the window (first counted at its nearest
    batch), neither held by the layer nor staged nor missed now, and
    lies on the block runs planned for the misses (``run_first``,
    ``run_last``; ``missed`` sorted). At most ``limit`` are taken, the
    soonest needed first (ties: the smaller id). Returns them sorted.
    """
    count = 0
    chosen = np.empty(bounds[-1], dtype=np.int64)
    ends = np.zeros(bounds.shape[0], dtype=np.int64)
    ordered = True
    for d in range(1, bounds.shape[0]):
        # A batch's ids come sorted (`SampledBatch.unique_inputs`): the
        # misses and the runs are walked beside them, where a binary
        # search per id took 61 ms a batch on synth-products (2 million
        # window ids); an id smaller than the last searches again.
        at = run = 0
        last = -1
        for k in range(bounds[d - 1], bounds[d]):
            node = future[k]
            if marks[node] != min(d, 127) or (layered and resident[node]) \
                    or staged_slot_of[node] >= 0:
                continue
            start = data_offset + node * row_bytes
            low = start // block_bytes
            if node < last:
                at = np.searchsorted(missed, node)
                run = np.searchsorted(run_first, low, side="right")
                ordered = False
            last = node
            while at < missed.shape[0] and missed[at] < node:
                at += 1
            if at < missed.shape[0] and missed[at] == node:
                continue
            while run < run_first.shape[0] and run_first[run] <= low:
                run += 1
            high = (start + row_bytes - 1) // block_bytes
            if run == 0 or high > run_last[run - 1]:
                continue
            chosen[count] = node
            count += 1
        ends[d] = count
    if ordered:
        # Chosen in key order already (nearest batch first, then id; a
        # row is chosen at its nearest batch only): the first `limit`,
        # each batch's share sorted, merged.
        ends = np.minimum(ends, limit)
        return merge_runs(chosen[:ends[-1]], ends)
    chosen = chosen[:count]
    if count > limit:
        keys = np.empty(count, dtype=np.int64)
        for k in range(count):
            keys[k] = np.int64(marks[chosen[k]]) * num_rows + chosen[k]
        keys = np.sort(keys)[:limit]
        chosen = keys % num_rows
    return np.sort(chosen)


@njit(**_NOGIL)
def merge_runs(values, ends):
    """``values`` sorted, where each run ``values[ends[i - 1]:ends[i]]``
    is sorted already: runs merged pairwise, in about log2(runs) passes
    over the values (a sort took 25 ms a batch on synth-products)."""
    ends = ends.copy()
    runs = ends.shape[0] - 1
    source = values.copy()
    target = np.empty_like(source)
    while runs > 1:
        merged = 0
        for r in range(1, runs + 1, 2):
            low, middle = ends[r - 1], ends[r]
            high = ends[r + 1] if r + 1 <= runs else middle
            i, j, k = low, middle, low
            while i < middle and j < high:
                if source[j] < source[i]:
                    target[k] = source[j]
                    j += 1
                else:
                    target[k] = source[i]
                    i += 1
                k += 1
            target[k:k + middle - i] = source[i:middle]
            k += middle - i
            target[k:k + high - j] = source[j:high]
            merged += 1
            ends[merged] = high
        runs = merged
        source, target = target, source
    return source


@njit(**_NOGIL)
def choose_dynamic(ids, hit, held, future, bounds, window, next_use,
                   cold_rank, never, capacity, num_rows):
    """The hmgraph policy's step on its dynamic region (`HMGraphPolicy`).

    Among the rows held and this batch's misses, keep the ``capacity``
    of smallest key: ``(distance to the next use in the window, or
    window + 1 beyond it) * num_rows + cold_rank``, a total order, so the
    choice is unique. Returns ``(evict ids, admit positions in ids,
    the held ids after the step)``; admissions come most valuable first.
    """
    steps = min(bounds.shape[0] - 1, window)
    for d in range(steps, 0, -1):
        for k in range(bounds[d - 1], bounds[d]):
            next_use[future[k]] = d
    misses = 0
    for i in range(ids.shape[0]):
        if not hit[i]:
            misses += 1
    where = np.empty(misses, dtype=np.int64)
    m = 0
    for i in range(ids.shape[0]):
        if not hit[i]:
            where[m] = i
            m += 1
    total = held.shape[0] + misses
    keys = np.empty(total, dtype=np.int64)
    for k in range(total):
        node = held[k] if k < held.shape[0] else ids[where[k - held.shape[0]]]
        near = next_use[node]
        rank = window + 1 if near == never else near
        keys[k] = np.int64(rank) * num_rows + cold_rank[node]
    for d in range(1, steps + 1):
        for k in range(bounds[d - 1], bounds[d]):
            next_use[future[k]] = never
    if total <= capacity:
        threshold = np.iinfo(np.int64).max
    elif capacity == 0:
        threshold = -1
    else:
        threshold = np.partition(keys, capacity - 1)[capacity - 1]
    evicted = 0
    for k in range(held.shape[0]):
        if keys[k] > threshold:
            evicted += 1
    evict = np.empty(evicted, dtype=np.int64)
    kept = np.empty(total - evicted, dtype=np.int64)
    e = h = 0
    for k in range(held.shape[0]):
        if keys[k] > threshold:
            evict[e] = held[k]
            e += 1
        else:
            kept[h] = held[k]
            h += 1
    admitted = 0
    for k in range(held.shape[0], total):
        if keys[k] <= threshold:
            admitted += 1
    admit_keys = np.empty(admitted, dtype=np.int64)
    admit = np.empty(admitted, dtype=np.int64)
    a = 0
    for k in range(held.shape[0], total):
        if keys[k] <= threshold:
            admit_keys[a] = keys[k]
            admit[a] = where[k - held.shape[0]]
            a += 1
    order = np.argsort(admit_keys)
    admit = admit[order]
    for k in range(admitted):
        kept[h + k] = ids[admit[k]]
    return evict, admit, kept[:h + admitted]


@njit(**_NOGIL)
def evict_ids(ids, slot_of, low, high, id_of, free, num_free, resident):
    """Free the slots of ``ids`` (held by stores ``j`` of the table:
    ``[low[j], high[j])``); per store, the rows freed and new free counts
    are returned (``num_free`` is updated in place)."""
    freed = np.zeros(low.shape[0], dtype=np.int64)
    for k in range(ids.shape[0]):
        node = ids[k]
        number = slot_of[node]
        resident[node] = False
        if number < 0:
            continue
        for j in range(low.shape[0]):
            if low[j] <= number < high[j]:
                local = number - low[j]
                free[j][num_free[j]] = local
                num_free[j] += 1
                id_of[j][local] = -1
                freed[j] += 1
                break
        slot_of[node] = -1
    return freed


@njit(**_NOGIL)
def insert_slots(ids, positions, slot_of, low, id_of, free, num_free,
                 resident, dest_store, dest_slot):
    """Give ``ids[positions[k]]`` slots in the stores, filling each
    store's free slots in order (the first store first), as
    `SlotStore.insert` takes the top of the free stack; row ``k``'s store
    and slot go to ``dest_store[k]``, ``dest_slot[k]``, for
    `copy_admitted` once the row is there. Returns the rows given a slot
    per store."""
    inserted = np.zeros(low.shape[0], dtype=np.int64)
    k = 0
    total = positions.shape[0]
    for j in range(low.shape[0]):
        take = min(num_free[j], total - k)
        top = num_free[j] - take
        for t in range(take):
            node = ids[positions[k + t]]
            local = free[j][top + t]
            slot_of[node] = low[j] + local
            id_of[j][local] = node
            resident[node] = True
            dest_store[k + t] = j
            dest_slot[k + t] = local
        num_free[j] = top
        inserted[j] = take
        k += take
    return inserted


@njit(**_NOGIL)
def copy_admitted(source, positions, buffers, dest_store, dest_slot):
    """``buffers[dest_store[k]][dest_slot[k]] = source[positions[k]]``:
    the admitted rows into the slots `insert_slots` gave them."""
    for k in range(positions.shape[0]):
        copy_row(buffers[dest_store[k]], dest_slot[k], source, positions[k])
