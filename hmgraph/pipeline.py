"""The stages of `hmgraph.DataLoader` and the threads that run them ahead.

Each stage is a generator over typed batches:

1. `sample_stage` draws seeds and calls the DGL sampler -> `SampledBatch`;
2. `fetch_stage` reads input rows through the feature cache, telling it the
   unique input ids of the batches already sampled ahead (its lookahead
   window) -> `ReadyBatch` with rows and labels on the training device.

`Prefetcher` runs one stage in a background thread, at most ``depth``
batches ahead. Errors in the thread surface in the consumer; a thread that
dies without a word is detected within a fraction of a second; `close`
(on ``break``, an exception or Ctrl-C in the training loop) stops and joins
the thread, so nothing is left behind.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

__all__ = ["Prefetcher", "ReadyBatch", "SampledBatch", "fetch_stage",
           "sample_stage"]

_POLL_SECONDS = 0.05


@dataclass
class SampledBatch:
    """A batch after sampling (CPU tensors)."""

    index: int
    input_nodes: torch.Tensor
    output_nodes: torch.Tensor
    blocks: list
    unique_inputs: torch.Tensor
    sample_seconds: float


@dataclass
class ReadyBatch:
    """A batch with its rows and labels on the training device."""

    sampled: SampledBatch
    x: torch.Tensor
    y: torch.Tensor | None
    fetch_seconds: float


def sample_stage(graph, graph_sampler, order: torch.Tensor, batch_size: int,
                 num_batches: int) -> Iterator[SampledBatch]:
    """Sample the batches of one epoch, in order."""
    for index in range(num_batches):
        start = time.perf_counter()
        seeds = order[index * batch_size:(index + 1) * batch_size]
        input_nodes, output_nodes, blocks = graph_sampler.sample(graph, seeds)
        yield SampledBatch(index, input_nodes, output_nodes, blocks,
                           input_nodes.sort().values,
                           time.perf_counter() - start)


def fetch_stage(sampled: Iterator[SampledBatch], cache, labels, window: int,
                device: torch.device) -> Iterator[ReadyBatch]:
    """Read each batch's rows, looking ``window`` sampled batches ahead."""
    ahead: collections.deque[SampledBatch] = collections.deque()
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    for batch in sampled:
        ahead.append(batch)
        if len(ahead) > window:
            yield _fetch(ahead, cache, labels, device, stream)
    while ahead:
        yield _fetch(ahead, cache, labels, device, stream)


def _fetch(ahead, cache, labels, device, stream) -> ReadyBatch:
    batch = ahead.popleft()
    future = [later.unique_inputs for later in ahead]
    start = time.perf_counter()
    with torch.cuda.stream(stream) if stream is not None else _nothing():
        x = cache.read(batch.input_nodes, future)
        y = None
        if labels is not None:
            y = labels[batch.output_nodes].to(device, non_blocking=True)
    if stream is not None:
        stream.synchronize()
    return ReadyBatch(batch, x, y, time.perf_counter() - start)


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
    """

    def __init__(self, name: str, items: Iterator, depth: int):
        self.name = name
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._items = items
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name,
                                        daemon=True)
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
        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
                break
            except queue.Empty:
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
        """Stop the thread and wait for it; idempotent."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=_POLL_SECONDS)
        self._done = True
