"""The cache's CUDA paths on a GPU: rows checked, fetch timed against
DGL-style gathers.

Runs without DGL (`hmgraph.cache` imports none), so it runs under a GPU
machine's own torch. Checks, each PASS or FAIL:

1. ``rows``: every policy's cache with its device tier on the GPU, a
   pinned host tier and staging over a feature file read with O_DIRECT:
   every batch's rows equal the file's, and the counters equal the same
   cache's on the CPU (the compiled engine).
2. ``reuse``: batch reuse (1 and 2 levels) over the hmgraph cache on the
   GPU: rows equal the file's, counters equal the CPU's.
3. ``streams``: the hand-off `hmgraph.stages.fetch.FetchStage` does on
   CUDA: each batch read on a side stream while the default stream still
   consumes the last, synchronized, ``record_stream`` on the consumer.

Then seconds per batch to have a batch's input rows on the GPU, over a
trace of real sampled batches (``--trace``, made with DGL's
``NeighborSampler`` by ``--make-trace``; each batch's ids are put in a
random order), features in host memory:

- ``dgl-cpu``: ``feats[ids].to(cuda)`` (DGL's `DataLoader` without UVA);
- ``dgl-uva``: one kernel reads the rows from pinned host memory (DGL's
  ``use_uva=True``: ``IndexSelectCPUFromGPU``), ids already on the GPU;
- ``gpu-resident``: every row already on the GPU (the ceiling);
- ``hmgraph-*``: hmgraph's cache over the pinned rows, from CPU ids.

Usage::

    python bench/gpu.py --make-trace --root data   # here, with DGL
    python bench/gpu.py --trace trace.npz --out DIR  # on the GPU machine
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from hmgraph.cache import (
    POLICIES,
    StorageFeature,
    TensorFeature,
    build_cache,
    make_plan,
    write_feature_file,
)
from hmgraph.cache.coordinated import FrozenView
from hmgraph.cache.reuse import BatchReuse

UVA_GATHER = r"""
extern "C" __global__ void gather(const float* __restrict__ src,
                                  const long long* __restrict__ idx,
                                  float* __restrict__ out,
                                  long long n, int width) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32)
        + threadIdx.x / 32;
    if (row >= n) return;
    const float* from = src + idx[row] * (long long)width;
    float* to = out + row * (long long)width;
    for (int j = threadIdx.x % 32; j < width; j += 32) to[j] = from[j];
}
"""


def make_trace(root: str, path: Path, batches: int = 24) -> None:
    """Sample ``batches`` batches of synth-products (DGL's sampler,
    1024 seeds, fanouts 15,10,5) and save their input ids."""
    import dgl

    from hmgraph import datasets

    data = datasets.load("synth-products", root)
    loader = dgl.dataloading.DataLoader(
        data.graph, data.split["train"],
        dgl.dataloading.NeighborSampler([15, 10, 5]), batch_size=1024,
        shuffle=True)
    torch.manual_seed(0)
    saved = {}
    for i, (inputs, _, _) in zip(range(batches), loader,
                                 strict=False):
        ordered = np.sort(inputs.numpy())
        saved[f"b{i}"] = np.diff(ordered, prepend=0).astype(np.uint32)
    np.savez_compressed(path, num_rows=np.int64(data.graph.num_nodes()),
                        **saved)


def load_trace(path: Path) -> tuple[int, list[torch.Tensor]]:
    """``(num_rows, sorted unique ids per batch)``."""
    with np.load(path) as data:
        num_rows = int(data["num_rows"])
        keys = sorted((k for k in data.files if k.startswith("b")),
                      key=lambda k: int(k[1:]))
        return num_rows, [torch.from_numpy(
            np.cumsum(data[k].astype(np.int64))) for k in keys]


def counters(cache) -> dict:
    """A cache's counters that do not depend on time."""
    stats = dataclasses.asdict(cache.stats)
    for key in ("seconds", "cpu_seconds", "copy_seconds", "metadata_bytes"):
        stats.pop(key, None)
    if hasattr(cache, "inner"):
        stats["inner"] = counters(cache.inner)
    return stats


def small_batches(trace, num_rows: int, count: int = 10,
                  size: int = 20000) -> list[torch.Tensor]:
    """``count`` batches of the trace folded onto ``num_rows`` rows."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for ids in trace[:count]:
        pick = ids[torch.randperm(len(ids), generator=gen)[:size]]
        folded = torch.unique(pick % num_rows)
        out.append(folded[torch.randperm(len(folded), generator=gen)])
    return out


def build(policy, source, device, batches, levels=0, staging=0.1,
          device_share=0.2, host_share=0.3, engine="compiled"):
    """A cache planned on ``batches`` (profile = the batches read)."""
    n, row_bytes = source.num_rows, source.row_bytes
    counts = torch.zeros(n, dtype=torch.int64)
    hops = torch.zeros((4, n), dtype=torch.int64)
    for i, ids in enumerate(batches):
        counts[ids] += 1
        hops[i % 4, ids] += 1
    trace = [torch.sort(ids).values for ids in batches]
    plan = make_plan(policy, n, row_bytes, int(n * row_bytes * device_share),
                     int(n * row_bytes * host_share), counts=counts,
                     trace=trace, reuse_levels=levels,
                     staging=staging if policy != "none" else 0.0,
                     trace_covers_epoch=True)
    degrees = torch.bincount(torch.cat(batches) % n, minlength=n)
    cache = build_cache(source, plan, device, counts=counts,
                        degrees=degrees, hop_counts=hops, engine=engine)
    if levels:
        return BatchReuse(cache, levels, plan.reuse_rows, engine=engine)
    return cache


def read_all(feature, batches, window: int = 4) -> list[torch.Tensor]:
    """Each batch's rows, the next ``window`` batches as the lookahead."""
    out = []
    for i, ids in enumerate(batches):
        future = [torch.sort(b).values for b in batches[i + 1:i + 1 + window]]
        out.append(feature.read(ids, future).cpu())
    return out


def engine_of(feature) -> str:
    """The engine that reads (batch reuse's cache's, below it)."""
    return getattr(getattr(feature, "inner", feature), "engine", "-")


def check_rows(path: Path, rows: torch.Tensor, batches, device) -> dict:
    """Check 1 and 2: every policy (and reuse) on ``device``, its default
    engine, against the file and the reference's counters on the CPU;
    over the feature file and over the rows in pinned memory."""
    results = {}
    configs = [(p, 0) for p in POLICIES if p != "belady"] + \
        [("hmgraph", 1), ("hmgraph", 2)]
    pinned = rows.pin_memory() if device.type == "cuda" else rows
    for (policy, levels), kind in itertools.product(
            configs, ("file", "memory")):
        name = (policy if not levels else f"{policy}+reuse{levels}") + \
            f" {kind}"
        try:
            got, stats, engines = {}, {}, {}
            for where in (device, "cpu"):
                with StorageFeature(path) if kind == "file" else \
                        TensorFeature(pinned) as source:
                    feature = build(
                        policy, source, where, batches, levels,
                        staging=0.1 if kind == "file" else 0.0,
                        engine="compiled" if where is device else "torch")
                    got[where] = read_all(feature, batches)
                    # Evaluation's reads, which leave the cache as it is.
                    view = FrozenView(getattr(feature, "inner", feature))
                    got[where].append(view.read(batches[0]).cpu())
                    stats[where] = counters(feature) | {
                        "frozen": counters(view)}
                    engines[where] = engine_of(feature)
                    feature.close()
            exact = all(torch.equal(g, rows[ids]) for g, ids in
                        zip(got[device], [*batches, batches[0]],
                            strict=True))
            same = stats[device] == stats["cpu"]
            results[name] = {"rows_exact": exact, "counters_equal": same,
                             "engine": engines[device],
                             "ok": exact and same}
            if not same:
                results[name]["counters"] = {str(k): v for k, v in
                                             stats.items()}
        except Exception:  # report and go on to the next configuration
            results[name] = {"ok": False, "error": traceback.format_exc()}
        print(f"  {name:28s} {results[name].get('engine', '-'):9s}"
              f"{'PASS' if results[name]['ok'] else 'FAIL'}", flush=True)
    return results


def check_streams(path: Path, rows: torch.Tensor, batches, device) -> dict:
    """Check 3: reads on a side stream, consumed on the default one.

    The default stream is kept busy (a large product) before it copies
    each batch, so the copy runs while the next batch is read: memory
    reused too early would show as wrong rows."""
    side = torch.cuda.Stream(device)
    consumer = torch.cuda.default_stream(device)
    busy = torch.randn(8192, 8192, device=device)
    results = {}
    pinned = rows.pin_memory()
    for policy, levels, kind in (("hmgraph", 0, "file"),
                                 ("hmgraph", 0, "memory"),
                                 ("hmgraph", 2, "memory"), ("lru", 0, "file")):
        name = (policy if not levels else f"{policy}+reuse{levels}") + \
            f" {kind}"
        with StorageFeature(path) if kind == "file" else \
                TensorFeature(pinned) as source:
            feature = build(policy, source, device, batches, levels,
                            staging=0.1 if kind == "file" else 0.0)
            engine = engine_of(feature)
            copies = []
            for _ in range(3):
                for i, ids in enumerate(batches):
                    future = [torch.sort(b).values
                              for b in batches[i + 1:i + 5]]
                    with torch.cuda.stream(side):
                        got = feature.read(ids, future)
                    side.synchronize()
                    got.record_stream(consumer)
                    torch.mm(busy, busy)
                    copies.append(got.clone())
                    del got
            torch.cuda.synchronize(device)
            feature.close()
        exact = all(torch.equal(c.cpu(), rows[ids]) for c, ids in
                    zip(copies, batches * 3, strict=True))
        results[name] = {"ok": exact, "engine": engine}
        print(f"  streams {name:22s} {engine:9s}"
              f"{'PASS' if exact else 'FAIL'}", flush=True)
    return results


def uva_gather():
    """DGL's UVA gather as one kernel (CuPy), or None without CuPy."""
    try:
        import cupy
    except ImportError:
        return None
    kernel = cupy.RawKernel(UVA_GATHER, "gather")

    def gather(pinned: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        out = torch.empty((len(ids), pinned.shape[1]), dtype=pinned.dtype,
                          device=ids.device)
        warps = 8
        blocks = (len(ids) + warps - 1) // warps
        with cupy.cuda.ExternalStream(
                torch.cuda.current_stream().cuda_stream):
            kernel((blocks,), (32 * warps,),
                   (cupy.uint64(pinned.data_ptr()),
                    cupy.uint64(ids.data_ptr()),
                    cupy.uint64(out.data_ptr()), cupy.int64(len(ids)),
                    cupy.int32(pinned.shape[1])))
        return out

    return gather


def sync(device) -> None:
    """Wait for the device's work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fetch(name, fetch, batches, device, warm: int) -> dict:
    """Median seconds per batch (and CPU seconds) after ``warm``
    batches."""
    walls, cpus = [], []
    for i, ids in enumerate(batches):
        sync(device)
        start, cpu = time.perf_counter(), time.thread_time()
        out = fetch(i, ids)
        sync(device)
        if i >= warm:
            walls.append(time.perf_counter() - start)
            cpus.append(time.thread_time() - cpu)
        del out
    result = {"s_per_batch": statistics.median(walls),
              "cpu_s_per_batch": statistics.median(cpus)}
    print(f"  {name:28s} {result['s_per_batch'] * 1e3:9.2f} ms "
          f"(CPU {result['cpu_s_per_batch'] * 1e3:8.2f} ms)", flush=True)
    return result


def timings(trace, num_rows: int, width: int, device, warm: int) -> dict:
    """Seconds per batch of each way to bring a batch's rows to the GPU."""
    gen = torch.Generator().manual_seed(2)
    feats = torch.randn(num_rows, width, generator=gen)
    pinned = feats.pin_memory() if device.type == "cuda" else feats
    batches = [ids[torch.randperm(len(ids), generator=gen)] for ids in trace]
    on_gpu = [ids.to(device) for ids in batches]
    want = [pinned[ids] for ids in batches[warm:warm + 2]]
    results = {"rows_per_batch": statistics.mean(len(b) for b in batches),
               "row_bytes": width * 4, "num_rows": num_rows}

    def future(i):
        return [trace[j] for j in range(i + 1, min(i + 5, len(trace)))]

    results["dgl-cpu"] = time_fetch(
        "dgl-cpu feats[ids].to(cuda)",
        lambda i, ids: feats[ids].to(device), batches, device, warm)
    gather = uva_gather() if device.type == "cuda" else None
    if gather is not None:
        got = gather(pinned, on_gpu[warm])
        assert torch.equal(got.cpu(), want[0]), "UVA gather is wrong"
        results["dgl-uva"] = time_fetch(
            "dgl-uva (pinned, kernel)",
            lambda i, ids: gather(pinned, on_gpu[i]), batches, device,
            warm)
    resident = pinned.to(device)
    results["gpu-resident"] = time_fetch(
        "gpu-resident feats[ids]",
        lambda i, ids, r=resident: r[on_gpu[i]],
        batches, device, warm)
    del resident
    profile = batches[:warm]
    configs = [("hmgraph-none", "none", 0, 0.0, "compiled"),
               ("hmgraph-cache-10%", "hmgraph", 0, 0.10, "compiled"),
               ("hmgraph-cache-25%", "hmgraph", 0, 0.25, "compiled"),
               ("hmgraph-cache-25% torch", "hmgraph", 0, 0.25, "torch"),
               ("hmgraph-cache-25%+reuse2", "hmgraph", 2, 0.25, "compiled"),
               ("hmgraph-presample-25%", "presample", 0, 0.25, "compiled"),
               ("hmgraph-lru-25%", "lru", 0, 0.25, "compiled")]
    for name, policy, levels, share, engine in configs:
        began = time.perf_counter()
        feature = build(policy, TensorFeature(pinned), device, profile,
                        levels, staging=0.0, device_share=share,
                        host_share=0.0, engine=engine)
        built = time.perf_counter() - began
        got = feature.read(batches[warm], future(warm))
        assert torch.equal(got.cpu(), want[0]), f"{name}: wrong rows"
        results[name] = time_fetch(
            name, lambda i, ids, f=feature: f.read(ids, future(i)),
            batches, device, warm)
        results[name]["construction_s"] = built
        results[name]["engine"] = engine_of(feature)
        results[name]["counters"] = counters(feature)
        feature.close()
    return results


def table(results: dict) -> str:
    """The timings as a markdown table, ratios against ``dgl-uva``."""
    base = results.get("dgl-uva", results["dgl-cpu"])["s_per_batch"]
    lines = ["| fetch | ms/batch | CPU ms/batch | / dgl-uva | built s |",
             "|---|---:|---:|---:|---:|"]
    for name, value in results.items():
        if isinstance(value, dict) and "s_per_batch" in value:
            lines.append(
                f"| {name} | {value['s_per_batch'] * 1e3:.2f} | "
                f"{value['cpu_s_per_batch'] * 1e3:.2f} | "
                f"{value['s_per_batch'] / base:.2f} | "
                f"{value.get('construction_s', 0):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=Path("trace.npz"))
    parser.add_argument("--make-trace", action="store_true")
    parser.add_argument("--root", default="data")
    parser.add_argument("--out", type=Path, default=Path("gpu-out"))
    parser.add_argument("--width", type=int, default=100)
    parser.add_argument("--warm", type=int, default=8)
    parser.add_argument("--device", default="cuda",
                        help="cuda, or cpu for a dry run of the script")
    parser.add_argument("--commit", default="",
                        help="the commit measured, for the report")
    parser.add_argument("--skip", default="",
                        help="comma-separated parts to skip: "
                             "rows,streams,timings")
    args = parser.parse_args(argv)
    if args.make_trace:
        return make_trace(args.root, args.trace)
    skip = set(filter(None, args.skip.split(",")))
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "-"
    print(f"torch {torch.__version__}, {gpu}", flush=True)
    num_rows, trace = load_trace(args.trace)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"torch": torch.__version__, "gpu": gpu,
              "commit": args.commit, "trace": str(args.trace)}
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        small = 100_000
        rows = torch.randn(small, 128, generator=torch.Generator()
                           .manual_seed(0))
        path = Path(tmp) / "feat.bin"
        write_feature_file(path, rows.numpy())
        batches = small_batches(trace, small)
        if "rows" not in skip:
            print("rows exact, counters equal to the CPU's:", flush=True)
            report["rows"] = check_rows(path, rows, batches, device)
        if "streams" not in skip and device.type == "cuda":
            print("stream hand-off:", flush=True)
            report["streams"] = check_streams(path, rows, batches, device)
    if "timings" not in skip:
        print("fetch, seconds per batch:", flush=True)
        report["timings"] = timings(trace, num_rows, args.width, device,
                                    args.warm)
        print(table(report["timings"]))
    (args.out / "gpu.json").write_text(json.dumps(report, indent=1,
                                                  default=str))
    (args.out / "gpu.md").write_text(markdown(report))


def markdown(report: dict) -> str:
    """The checks and timings, for ``bench/results/gpu.md``."""
    lines = [f"# CUDA paths on {report['gpu']} (torch {report['torch']})",
             "", f"`bench/gpu.py` at {report['commit'] or '?'}.", ""]
    for part in ("rows", "streams"):
        checks = report.get(part, {})
        if checks:
            passed = sum(c["ok"] for c in checks.values())
            lines += [f"{part}: {passed} of {len(checks)} PASS", "",
                      "| configuration | engine | result |", "|---|---|---|"]
            lines += [f"| {name} | {c.get('engine', '-')} | "
                      f"{'PASS' if c['ok'] else 'FAIL'} |"
                      for name, c in checks.items()]
            lines.append("")
    if "timings" in report:
        t = report["timings"]
        lines += ["", f"Fetch of a batch's input rows to the GPU, "
                  f"{t['rows_per_batch']:,.0f} rows of {t['row_bytes']} B "
                  f"a batch, {t['num_rows']:,} rows in host memory; "
                  f"median of the batches after the first "
                  f"{report.get('warm', 8)}:", "", table(t)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
