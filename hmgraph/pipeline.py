"""The stages of `hmgraph.DataLoader` and the threads that run them ahead.

Each stage is a generator over typed batches:

1. `sample_stage` takes each batch from DGL's sampling loader (the sampler
   runs there) and finds the features it needs -> `SampledBatch`;
2. `fetch_stage` reads them, telling the feature cache the unique input
   ids of the batches already sampled ahead (its lookahead window) ->
   `ReadyBatch` with rows and labels on the training device.

`Prefetcher` runs one stage in a background thread, at most ``depth``
batches ahead. Errors in the thread surface in the consumer; a thread that
dies without a word is detected within a fraction of a second; `close`
(on ``break``, an exception or Ctrl-C in the training loop) stops and joins
the thread, so nothing is left behind. At interpreter exit every thread
still running is closed the same way (newest first), before Python
finalizes: a daemon thread that is inside a torch call then would be
ended in the middle of C++ code that may not unwind (``terminate called
without an active exception``, exit code 134), so a script may end with
live iterators.
"""

from __future__ import annotations

import atexit
import collections
import functools
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["Prefetcher", "ReadyBatch", "SampledBatch", "fetch_stage",
           "sample_stage"]

_POLL_SECONDS = 0.05


@dataclass
class SampledBatch:
    """A batch after sampling (CPU).

    Attributes
    ----------
    index : int
        Position in the epoch.
    batch : object
        What the sampler returned (tuple of ids and graphs, or a graph).
    reads : list of hmgraph.dglbatch.Lazy
        The cached feature's rows the batch needs.
    others : list of hmgraph.dglbatch.Lazy
        Other lazy features the sampler asked for.
    sample_seconds : float
        Time in the sampler.
    """

    index: int
    batch: object
    reads: list
    others: list
    sample_seconds: float

    @functools.cached_property
    def unique_inputs(self) -> dict:
        """Sorted unique ids of `reads` per node type (the lookahead);
        computed when first asked."""
        ids = {}
        for read in self.reads:
            ids.setdefault(read.type, []).append(read.ids)
        # NumPy's sort: torch's default CPU sort of 160,000 int64 ids
        # took 97 ms, NumPy's 4 ms (this ran for every sampled batch).
        return {key: torch.from_numpy(np.sort(parts[0].numpy()))
                if len(parts) == 1 else torch.unique(torch.cat(parts))
                for key, parts in ids.items()}


@dataclass
class ReadyBatch:
    """A batch with its rows read (on the training device)."""

    sampled: SampledBatch
    values: list
    y: torch.Tensor | None
    fetch_seconds: float


def sample_stage(batches: Iterator, find_reads, graph,
                 seed: int | None = None) -> Iterator[SampledBatch]:
    """Sampled batches of one epoch, in order.

    Parameters
    ----------
    batches : iterator
        DGL's sampling loader: each ``next`` runs the sampler (here or in
        a worker process).
    find_reads : callable
        ``batch -> (reads, others)``: its lazy features.
    graph : dgl.DGLGraph
        The parent graph (its storages return to graphs from workers).
    seed : int, optional
        Seed DGL's generators (of the thread that runs this stage) before
        the first batch.
    """
    import dgl
    from dgl.dataloading.dataloader import restore_parent_storage_columns
    from dgl.utils import recursive_apply

    if seed is not None:
        dgl.seed(seed)

    for index in itertools.count():
        start = time.perf_counter()
        batch = next(batches, _END)
        if batch is _END:
            return
        batch = recursive_apply(batch, restore_parent_storage_columns,
                                graph)
        reads, others = find_reads(batch)
        yield SampledBatch(index, batch, reads, others,
                           time.perf_counter() - start)


def fetch_stage(sampled: Iterator[SampledBatch], fetch, window: int,
                device: torch.device, side_stream: bool = True
                ) -> Iterator[ReadyBatch]:
    """Read each batch's rows, looking ``window`` sampled batches ahead.

    ``fetch(batch, future)`` returns ``(values, labels)``; ``future`` holds
    the later batches' ``unique_inputs``. On CUDA with ``side_stream`` the
    copies run on a stream of their own, synchronized before the batch is
    handed on.
    """
    ahead: collections.deque[SampledBatch] = collections.deque()
    stream = torch.cuda.Stream(device) if device.type == "cuda" \
        and side_stream else None
    for batch in sampled:
        ahead.append(batch)
        if len(ahead) > window:
            yield _fetch(ahead, fetch, stream)
    while ahead:
        yield _fetch(ahead, fetch, stream)


def _fetch(ahead, fetch, stream) -> ReadyBatch:
    batch = ahead.popleft()
    future = [later.unique_inputs for later in ahead]
    start = time.perf_counter()
    with torch.cuda.stream(stream) if stream is not None else _nothing():
        values, y = fetch(batch, future)
    if stream is not None:
        stream.synchronize()
        # Made on the side stream, used on the default one: tell the
        # allocator, or it may reuse the memory while kernels read it.
        consumer = torch.cuda.default_stream(stream.device)
        for tensor in [*values, y]:
            if tensor is not None and tensor.is_cuda:
                tensor.record_stream(consumer)
    return ReadyBatch(batch, values, y, time.perf_counter() - start)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class Prefetcher:
    """Runs an iterator in a daemon thread, ``depth`` items ahead.

    Parameters
    ----------
    name : str
        Thread name, used in errors.
    items : iterator
        What the thread consumes (e.g. a stage generator).
    depth : int
        Items buffered ahead (>= 1).
    timeout : float
        Seconds to wait for an item before raising (0: no limit), as
        ``timeout`` of ``torch.utils.data.DataLoader``.
    """

    def __init__(self, name: str, items: Iterator, depth: int,
                 timeout: float = 0.0):
        self.name = name
        self.timeout = timeout
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._items = items
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name,
                                        daemon=True)
        _LIVE[next(_NUMBERS)] = self
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._items:
                if not self._put(item):
                    return
            self._put(_END)
        except BaseException as error:  # noqa: BLE001 - forwarded
            self._put(_Failure(error))
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        start = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
                waited = time.perf_counter() - start
                if self.timeout and waited > self.timeout:
                    raise RuntimeError(
                        f"loader thread {self.name!r} gave no batch in "
                        f"{self.timeout:g} s (timeout)") from None
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError(
                        f"loader thread {self.name!r} died without a "
                        f"result") from None
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            raise item.error
        return item

    def close(self) -> None:
        """Stop the thread and wait for it; idempotent (also called at
        interpreter exit)."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=_POLL_SECONDS)
        self._done = True


#: Prefetchers whose thread may still run, by creation number.
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_NUMBERS = itertools.count()


@atexit.register
def _close_live() -> None:
    """Close every live `Prefetcher`, newest first (a consumer before the
    stage it reads), while the interpreter is still whole.

    atexit handlers run before Python finalizes; a daemon thread that
    then wakes inside native code (a torch op that released the GIL)
    is ended with ``pthread_exit``, whose unwinding aborts at pybind11's
    noexcept destructors. Registered when this module is imported, i.e.
    after torch's own handlers, so it runs before them.
    """
    for number in sorted(_LIVE.keys(), reverse=True):
        prefetcher = _LIVE.get(number)
        if prefetcher is not None:
            prefetcher.close()
