"""The pipeline of `hmgraph.DataLoader`: its stages chained, some in
threads.

One epoch walks one way through the stages of `hmgraph.stages`, each
reading only what it was given:

1. `SampleStage` runs the sampler on DGL's seed batches and finds each
   batch's reads (`FindReads`) -> `SampledBatch`;
2. `FetchStage` reads them, telling the feature cache the unique input
   ids of the batches already sampled ahead (its lookahead window) ->
   `ReadyBatch` with rows and labels on the training device;
3. `FinishStage` puts the rows into DGL's batch and counts it ->
   `MiniBatch`, in the training thread.

`Prefetcher` runs a stage in a background thread, at most ``depth``
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
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Iterator

from hmgraph.memory import in_flight, release_freed_memory
from hmgraph.stages import (
    FetchStage,
    FinishStage,
    ReadyBatch,
    SampledBatch,
    SampleStage,
)

__all__ = ["Pipeline", "Prefetcher", "ReadyBatch", "SampledBatch",
           "release_freed_memory"]

_POLL_SECONDS = 0.05


class Pipeline:
    """The stages of one loader, chained for each epoch.

    Parameters
    ----------
    sample : SampleStage
        Sampling (and finding the reads).
    fetch : FetchStage
        Reading the rows.
    finish : FinishStage
        Filling DGL's batch, counting.
    prefetch : int
        Batches sampled and fetched ahead in background threads; 0 runs
        fetching in the training thread (sampling too, unless seeded).
    timeout : float
        Seconds to wait for a batch from a thread (0: no limit).
    """

    def __init__(self, sample: SampleStage, fetch: FetchStage,
                 finish: FinishStage, prefetch: int = 0,
                 timeout: float = 0.0):
        self.sample = sample
        self.fetch = fetch
        self.finish = finish
        self.prefetch = prefetch
        self.timeout = timeout

    def run(self, seed: int | None = None, epoch: int = 0,
            trace: list | None = None) -> Iterator:
        """One epoch's batches (a generator: nothing runs before the
        first ``next``).

        Parameters
        ----------
        seed : int, optional
            With ``epoch``: the order is drawn from ``seed + epoch`` and
            sampling runs in a thread seeded so (see `SampleStage.reset`).
        epoch : int
            The epoch's number.
        trace : list, optional
            Gets each batch's unique input ids.
        """
        # (1) Reset the stages: the order, the buffers alive at once.
        sample_seed = self.sample.reset(seed, epoch)
        self.fetch.reset(self.batches_in_flight)
        self.finish.reset(trace)
        # (2) Chain them, sampling and fetching in threads if asked.
        sampled = self.sample.run(sample_seed)  # draws torch's base seed
        threads = []
        if self.prefetch or sample_seed is not None:
            sampled = Prefetcher("hmgraph-sample", sampled,
                                 max(1, self.prefetch + self.fetch.window),
                                 self.timeout)
            threads.append(sampled)
        ready = self.fetch.run(sampled)
        if self.prefetch:
            # An interleaving fetch holds one batch in flight itself.
            depth = self.prefetch - 1 if self.fetch.interleaves else \
                self.prefetch
            ready = Prefetcher("hmgraph-fetch", ready, depth, self.timeout)
            threads.insert(0, ready)
        # (3) Finish each batch in this thread; on the way out (end,
        # break, exception) close the threads and let go of the buffers
        # kept for the epoch's batches: an epoch left early held up to
        # `batches_in_flight` batches of rows until the next one ended.
        seconds, finish = self.finish.stats.seconds, self.finish
        try:
            while True:
                start = time.perf_counter()
                batch = next(ready, None)
                seconds["wait"] += time.perf_counter() - start
                if batch is None:
                    return
                yield finish(batch)
        finally:
            for thread in threads:
                thread.close()
            if not self.prefetch:
                ready.close()
                sampled.close()
            self.fetch.release()
            release_freed_memory()

    @property
    def batches_in_flight(self) -> int:
        """Batches whose rows are alive at once (`hmgraph.memory.
        in_flight` of this prefetch depth and fetch)."""
        return in_flight(self.prefetch, self.fetch.interleaves)

    def state_dict(self) -> dict:
        """Each stage's state."""
        return {"sample": self.sample.state_dict(),
                "fetch": self.fetch.state_dict(),
                "finish": self.finish.state_dict()}

    def close(self) -> None:
        """Close the stages (the features they read from)."""
        for stage in (self.sample, self.fetch, self.finish):
            stage.close()


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
        Items buffered ahead; 0: each item is handed over before the next
        is made (the thread waits for the consumer to take it).
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
        self._hand_over = depth < 1
        self._taken = threading.Event()
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
        self._taken.clear()
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_SECONDS)
                break
            except queue.Full:
                continue
        else:
            return False
        while self._hand_over and not self._taken.wait(_POLL_SECONDS):
            if self._stop.is_set():
                return False
        return True

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        start = time.perf_counter()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_SECONDS)
                self._taken.set()
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
