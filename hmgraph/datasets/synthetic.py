"""Seeded synthetic node-classification graphs, written in OGB's format.

The generator is a degree-corrected stochastic block model:

* every node gets a Pareto weight ``theta`` (power-law degrees) and belongs
  to one community (log-normal community sizes);
* each undirected edge picks its first end in proportion to ``theta`` and
  its second end, again in proportion to ``theta``, inside the same
  community (probability ``p_intra``), in a nearby community (``p_near``:
  communities form a ring, so groups of communities are clusters too) or
  anywhere;
* every community carries one class; a node's label is its community's
  class except for a ``label_noise`` share drawn uniformly;
* features are ``signal * centroid[label] + noise``, so a node's own row is a
  weak hint and the average over its neighbourhood a strong one: a GNN
  clearly beats an MLP, and graph clusters are meaningful.

Node ids are shuffled at the end, as in real datasets, so communities are
not contiguous id ranges. The edge list holds every undirected edge once,
which halves what ogb's saver and reader hold in memory;
`hmgraph.datasets` adds the reverse edges when it loads the graph.
Everything is vectorised NumPy, edges drawn in chunks. The graph, labels
and split are written through `ogb.io.DatasetSaver` and loaded through
``DglNodePropPredDataset(..., meta_dict=...)`` like any OGB node dataset;
the features never exist as one matrix: block ``b`` of
`FEATURE_BLOCK_ROWS` rows has its own seeded generator (`feature_rows`),
and `write_features` streams the blocks into hmgraph's feature file.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil
from tqdm.auto import tqdm

from hmgraph.cache.format import (
    FeatureFileError,
    FeatureFileWriter,
    read_manifest,
)
from hmgraph.datasets.base import FEATURE_FILE
from hmgraph.datasets.locking import exclusive_lock

log = logging.getLogger(__name__)

__all__ = ["SPECS", "SynthSpec", "check_feature_file", "feature_rows",
           "generate", "generate_graph", "make_synthetic", "restore_features",
           "write_features"]

_META_FILE = "hmgraph-meta.json"
# Version of the generated layout; folders of another version are rebuilt.
# 2: features only in the feature file, written block by block.
_FORMAT = 2
FEATURE_BLOCK_ROWS = 16_384
_EDGE_CHUNK = 4_000_000
_OVERSAMPLE = 1.5


@dataclass(frozen=True)
class SynthSpec:
    """Parameters of one synthetic dataset.

    Attributes
    ----------
    num_nodes : int
        Number of nodes.
    avg_degree : float
        Mean in-degree once both directions of every undirected edge are
        in the graph.
    num_classes : int
        Number of label classes.
    feat_dim : int
        Feature width (float32).
    community_size : int
        Mean community size.
    train_frac, valid_frac : float
        Shares of nodes in the train and validation splits.
    test_frac : float or None
        Share of nodes in the test split; None: every other node.
    """

    num_nodes: int
    avg_degree: float
    num_classes: int
    feat_dim: int
    community_size: int
    train_frac: float
    valid_frac: float
    test_frac: float | None = None
    p_intra: float = 0.8
    p_near: float = 0.1
    label_noise: float = 0.15
    signal: float = 0.2
    degree_exponent: float = 2.5
    max_theta: float = 300.0
    seed: int = 0


SPECS = {
    "synth-tiny": SynthSpec(
        num_nodes=10_000, avg_degree=12, num_classes=10, feat_dim=100,
        community_size=100, train_frac=0.1, valid_frac=0.05,
    ),
    "synth-small": SynthSpec(
        num_nodes=200_000, avg_degree=20, num_classes=47, feat_dim=100,
        community_size=400, train_frac=0.1, valid_frac=0.05,
    ),
    "synth-products": SynthSpec(
        num_nodes=2_400_000, avg_degree=25, num_classes=47, feat_dim=100,
        community_size=1000, train_frac=0.08, valid_frac=0.02,
    ),
    # The shapes SSD-based systems are built for. IGB-small's shape: 1M
    # nodes, 12M edges, 1024-dim float32 rows (one 4 KiB page per row), 19
    # classes; small train split so that an epoch fits a 2-core machine.
    "synth-igb": SynthSpec(
        num_nodes=1_000_000, avg_degree=12, num_classes=19, feat_dim=1024,
        community_size=1000, train_frac=0.02, valid_frac=0.005,
        test_frac=0.005,
    ),
    # The same family, features larger than a 24 GiB machine (28.7 GB).
    "synth-igb-large": SynthSpec(
        num_nodes=7_000_000, avg_degree=12, num_classes=19, feat_dim=1024,
        community_size=1000, train_frac=0.003, valid_frac=0.001,
        test_frac=0.001,
    ),
    # ogbn-papers100M's row width (128 float32 = 512 B), class count and
    # split shares (1.1% train), at 12M nodes; half its mean degree keeps
    # the graph buildable here. A batch of 1024 with fanouts 15,10,5 reads
    # a few percent of the rows (sparse).
    "synth-papers": SynthSpec(
        num_nodes=12_000_000, avg_degree=14, num_classes=172, feat_dim=128,
        community_size=2000, train_frac=0.011, valid_frac=0.0011,
        test_frac=0.0019,
    ),
}


def generate(spec: SynthSpec) -> dict[str, np.ndarray]:
    """Generate one synthetic graph in memory, features included.

    For small specs and tests; `make_synthetic` writes the same features
    chunk by chunk instead (`feature_rows`), never holding them all.

    Parameters
    ----------
    spec : SynthSpec
        What to generate; the same spec always gives the same arrays.

    Returns
    -------
    dict
        The arrays of `generate_graph` and ``node_feat`` (N, feat_dim)
        float32.
    """
    data = generate_graph(spec)
    data["node_feat"] = feature_rows(spec, data["label"], data["centroid"],
                                     0, spec.num_nodes)
    return data


def generate_graph(spec: SynthSpec) -> dict[str, np.ndarray]:
    """Generate the graph, labels and split of ``spec`` (no features).

    Returns
    -------
    dict
        ``edge_index`` (2, E) int64, every undirected edge once (the
        loader adds the reverse edges), ``label`` (N,) int64,
        ``community`` (N,) int64, ``centroid`` (num_classes, feat_dim)
        float32 (the class centres of the features, see `feature_rows`),
        and ``train`` / ``valid`` / ``test`` id arrays (int64, sorted).
    """
    rng = np.random.default_rng(spec.seed)
    n = spec.num_nodes
    # (1)-(5) Communities, edges, labels and the classes' centres.
    community, bounds = _communities(spec, rng)
    key = _edge_keys(spec, rng, community, bounds)
    label, centroid = _labels(spec, rng, community, len(bounds) - 1)

    # (6) Shuffle ids so communities are not id ranges; split.
    perm = rng.permutation(n)  # internal id -> public id
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.arange(n)
    edge_index = np.empty((2, key.size), dtype=np.int64)
    for start in range(0, key.size, _EDGE_CHUNK):
        part = key[start:start + _EDGE_CHUNK]
        edge_index[0, start:start + part.size] = perm[part // n]
        edge_index[1, start:start + part.size] = perm[part % n]
    del key
    order = rng.permutation(n)
    num_train = int(n * spec.train_frac)
    num_valid = int(n * spec.valid_frac)
    end = n if spec.test_frac is None else min(
        n, num_train + num_valid + int(n * spec.test_frac))
    return {
        "edge_index": edge_index,
        "label": label[inverse].astype(np.int64),
        "community": community[inverse].astype(np.int64),
        "centroid": centroid,
        "train": np.sort(order[:num_train]),
        "valid": np.sort(order[num_train:num_train + num_valid]),
        "test": np.sort(order[num_train + num_valid:end]),
    }


def _communities(spec: SynthSpec,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(1) Communities as contiguous ranges of the internal order.

    Returns
    -------
    tuple of numpy.ndarray
        ``(community, bounds)``: the community of every internal id and
        the ``num_communities + 1`` range bounds.
    """
    n = spec.num_nodes
    sizes = rng.lognormal(0.0, 0.5, size=2 * n // spec.community_size + 2)
    sizes = np.maximum(1, sizes / sizes.mean() * spec.community_size)
    bounds = np.concatenate([[0], np.cumsum(sizes.astype(np.int64))])
    bounds = bounds[bounds < n]
    bounds = np.append(bounds, n)
    community = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    return community, bounds


def _edge_keys(spec: SynthSpec, rng: np.random.Generator,
               community: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """(2)-(4) The undirected edges, keys ``lo * n + hi`` (internal ids).

    Ends are drawn with power-law weights; the second end inside the
    first's community (``p_intra``), a nearby one (``p_near``) or
    anywhere. Sorted, without duplicates or self-loops, at most
    ``num_nodes * avg_degree / 2`` of them.
    """
    n = spec.num_nodes
    num_comms = len(bounds) - 1

    # (2) Power-law node weights and their running sums.
    u = rng.random(n)
    theta = np.minimum((1.0 - u) ** (-1.0 / (spec.degree_exponent - 1.0)),
                       spec.max_theta)
    cum = np.cumsum(theta)
    cum_before = cum - theta
    del u, theta

    # (3) Edges, chunk by chunk, kept as undirected keys lo * n + hi.
    # Draw more pairs than needed: duplicates fall away in (4).
    num_pairs = int(n * spec.avg_degree / 2)
    num_draws = int(num_pairs * _OVERSAMPLE)
    key_parts = []
    for start in range(0, num_draws, _EDGE_CHUNK):
        k = min(_EDGE_CHUNK, num_draws - start)
        src = np.searchsorted(cum, rng.random(k) * cum[-1], side="right")
        src = np.minimum(src, n - 1)
        kind = rng.random(k)
        comm = community[src].copy()
        near = (kind >= spec.p_intra) & (kind < spec.p_intra + spec.p_near)
        shift = rng.integers(1, 4, size=int(near.sum()))
        sign = rng.choice([-1, 1], size=shift.size)
        comm[near] = (comm[near] + sign * shift) % num_comms
        lo = cum_before[bounds[comm]]
        hi = cum[bounds[comm + 1] - 1]
        far = kind >= spec.p_intra + spec.p_near
        lo[far], hi[far] = 0.0, cum[-1]
        dst = np.searchsorted(cum, lo + rng.random(k) * (hi - lo),
                              side="right")
        dst = np.minimum(dst, n - 1)
        keep = src != dst
        src, dst = src[keep], dst[keep]
        key_parts.append(np.minimum(src, dst) * n + np.maximum(src, dst))
    del cum, cum_before

    # (4) Without duplicates, down to the wanted count.
    key = np.unique(np.concatenate(key_parts))
    del key_parts
    if key.size > num_pairs:
        key = np.sort(rng.choice(key, size=num_pairs, replace=False))
    return key


def _labels(spec: SynthSpec, rng: np.random.Generator,
            community: np.ndarray,
            num_comms: int) -> tuple[np.ndarray, np.ndarray]:
    """(5) Labels from communities; the feature centres of the classes.

    Every community draws a class (the first ``num_classes`` communities
    one class each), ``label_noise`` of the nodes a random one.

    Returns
    -------
    tuple of numpy.ndarray
        ``(label, centroid)``: the label of every internal id and the
        (num_classes, feat_dim) float32 class centres.
    """
    comm_class = rng.integers(0, spec.num_classes, size=num_comms)
    comm_class[: spec.num_classes] = rng.permutation(spec.num_classes)[
        : min(spec.num_classes, num_comms)
    ]
    label = comm_class[community]
    noisy = rng.random(spec.num_nodes) < spec.label_noise
    label[noisy] = rng.integers(0, spec.num_classes, size=int(noisy.sum()))
    centroid = rng.standard_normal(
        (spec.num_classes, spec.feat_dim), dtype=np.float32
    )
    return label, centroid


def feature_rows(spec: SynthSpec, label: np.ndarray, centroid: np.ndarray,
                 start: int, stop: int) -> np.ndarray:
    """Feature rows ``start:stop`` (public ids) of ``spec``.

    Row ``v`` is ``signal * centroid[label[v]]`` plus standard normal noise.
    The noise comes in blocks of ``FEATURE_BLOCK_ROWS`` rows, block ``b``
    drawn from its own generator seeded ``(seed, 1, b)``, so any slicing
    gives the same rows and a file can be written chunk by chunk.

    Returns
    -------
    numpy.ndarray
        float32, shape ``(stop - start, feat_dim)``.
    """
    out = np.empty((stop - start, spec.feat_dim), dtype=np.float32)
    block = start // FEATURE_BLOCK_ROWS
    while block * FEATURE_BLOCK_ROWS < stop:
        first = block * FEATURE_BLOCK_ROWS
        last = min(first + FEATURE_BLOCK_ROWS, spec.num_nodes)
        rng = np.random.default_rng((spec.seed, 1, block))
        noise = rng.standard_normal((last - first, spec.feat_dim),
                                    dtype=np.float32)
        lo, hi = max(first, start), min(last, stop)
        out[lo - start:hi - start] = noise[lo - first:hi - first]
        block += 1
    out += np.float32(spec.signal) * centroid[label[start:stop]]
    return out


def write_features(spec: SynthSpec, label: np.ndarray, centroid: np.ndarray,
                   path: str | os.PathLike, progress: bool = False):
    """Write the features of ``spec`` to a feature file, block by block.

    Memory: one block of ``FEATURE_BLOCK_ROWS`` rows at a time. The file
    is renamed into place only when complete (`FeatureFileWriter`).

    Returns
    -------
    hmgraph.cache.format.FeatureManifest
    """
    n = spec.num_nodes
    with FeatureFileWriter(path, (n, spec.feat_dim), np.float32) as out:
        starts = tqdm(range(0, n, FEATURE_BLOCK_ROWS), unit="block",
                      desc="features", disable=not progress, leave=False)
        for start in starts:
            out.write(feature_rows(spec, label, centroid, start,
                                   min(start + FEATURE_BLOCK_ROWS, n)))
    return out.manifest


def ogb_name(name: str) -> str:
    """The OGB-style name of a synthetic dataset, e.g. ``ogbn-synth-tiny``."""
    return "ogbn-" + name


def folder_name(name: str) -> str:
    """The folder of a synthetic dataset under the root."""
    return name.replace("-", "_")


def meta_dict(folder: Path) -> dict:
    """The OGB meta dict of a generated dataset, pointing at ``folder``."""
    meta = json.loads((folder / _META_FILE).read_text())["ogb_meta"]
    meta["dir_path"] = str(folder)
    return meta


def feature_path(folder: Path) -> Path:
    """The feature file of the synthetic dataset in ``folder``."""
    return Path(folder) / "hmgraph" / FEATURE_FILE


def check_feature_file(folder: Path) -> None:
    """Refuse a feature file that is not the one generated in ``folder``.

    Generation records the feature file's checksum (its manifest's CRC-32)
    in ``hmgraph-meta.json``; a file swapped in later, of the same shape or
    not, carries another one. Reads the file's header only (a header that
    lies about its rows fails `hmgraph.cache.format.verify_feature_file`).
    Folders generated before the checksum was recorded are not checked.

    Raises
    ------
    hmgraph.cache.format.FeatureFileError
        One line naming the file, both checksums and the way out.
    """
    folder = Path(folder)
    meta = folder / _META_FILE
    recorded = json.loads(meta.read_text()).get("feature_checksum")
    if recorded is None:
        return
    path = feature_path(folder)
    checksum = read_manifest(path).checksum
    if checksum != recorded:
        raise FeatureFileError(
            f"feature file {path} is not the one generated for this "
            f"dataset: its checksum {checksum} is not the {recorded} "
            f"recorded in {meta}; delete {folder} to generate it again"
        )


def restore_features(spec: SynthSpec, folder: Path,
                     progress: bool = False) -> bool:
    """Generate the feature file of ``folder`` again if it was deleted.

    The rows come from ``spec``'s seed, as when the folder was generated
    (`generate_graph` for the labels and class centres, then
    `write_features`), so they are the same bytes. One process writes,
    under ``hmgraph/.lock``; others wait and find it written.

    Returns
    -------
    bool
        Whether the file was written.
    """
    path = feature_path(folder)
    if os.path.lexists(path):
        return False
    with exclusive_lock(path.parent / ".lock", path):
        if os.path.lexists(path):  # another run wrote it meanwhile
            return False
        log.info("feature file %s is missing; generating its rows again "
                 "from the seed", path)
        data = generate_graph(spec)
        write_features(spec, data["label"], data["centroid"], path,
                       progress=progress)
    return True


def make_synthetic(name: str, root: str | os.PathLike,
                   progress: bool = False) -> Path:
    """Generate ``name`` under ``root`` unless it is already there.

    The graph, labels and split are written through `ogb.io.DatasetSaver`
    and processed once by ``DglNodePropPredDataset``; the features go
    block by block straight into the feature file (``hmgraph/`` inside the
    dataset folder, see `write_features`), so no step holds the feature
    matrix. Everything is built in a temporary folder that is renamed into
    place last, so a killed run leaves nothing that a later run trusts (a
    leftover temporary folder is removed by the next run). A generated
    folder whose feature file was deleted gets it back, the same bytes,
    generated again from the seed (`restore_features`).

    Parameters
    ----------
    name : str
        A key of `SPECS`.
    root : str or os.PathLike
        Folder that holds datasets.
    progress : bool
        Show a progress bar while writing features.

    Returns
    -------
    pathlib.Path
        The dataset's folder (OGB layout: ``raw/``, ``processed/``,
        ``split/``, ``mapping/``; ``hmgraph/node-feat.bin``).
    """
    # Lazy: ogb takes 3 s to import; a generated set is written once.
    from ogb.nodeproppred import DglNodePropPredDataset

    spec = SPECS[name]
    folder = Path(root) / folder_name(name)
    marker = folder / _META_FILE
    _remove_stale_builds(Path(root), folder.name)
    if marker.is_file():
        if json.loads(marker.read_text()).get("format") == _FORMAT:
            restore_features(spec, folder, progress=progress)
            return folder
        log.info("%s was generated by an older hmgraph; rebuilding", folder)
    log.info("generating %s under %s", name, root)
    began = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-{os.getpid()}-",
                                 dir=root))
    try:
        data = generate_graph(spec)
        quiet = _Quiet()
        with quiet:
            built, meta, num_edges = _save_ogb(name, spec, data, work)
        # (7) Features straight into the feature file, block by block.
        manifest = write_features(spec, data["label"], data["centroid"],
                                  feature_path(built), progress=progress)
        record = {
            "format": _FORMAT, "spec": asdict(spec), "ogb_meta": meta,
            "num_edges": int(num_edges),
            "feature_bytes": manifest.file_bytes,
            "feature_checksum": manifest.checksum,
        }
        (built / _META_FILE).write_text(json.dumps(record, indent=1))
        # (8) Let ogb build its processed graph before the folder is
        # visible under its final name.
        del data
        with quiet:
            DglNodePropPredDataset(ogb_name(name), meta_dict=meta_dict(built))
        record["seconds"] = round(time.perf_counter() - began, 1)
        (built / _META_FILE).write_text(json.dumps(record, indent=1))
        if folder.exists():  # a remnant without its marker: not trusted
            shutil.rmtree(folder)
        os.replace(built, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _save_ogb(name: str, spec: SynthSpec, data: dict,
              work: Path) -> tuple[Path, dict, int]:
    """Write ``data``'s graph, labels, split and mapping in OGB's layout.

    Through `ogb.io.DatasetSaver` under ``work/build``; the community of
    every node goes into ``mapping/community.npy``. Pops
    ``data["edge_index"]`` (it is not needed after).

    Returns
    -------
    tuple
        ``(folder, meta, num_edges)``: the dataset's folder, OGB's meta
        dict and the number of undirected edges written.
    """
    # Lazy: ogb takes 3 s to import; a generated set is written once.
    from ogb.io import DatasetSaver

    saver = DatasetSaver(
        ogb_name(name), is_hetero=False, version=1,
        root=str(work / "build"),
    )
    graph = {
        "edge_index": data.pop("edge_index"),
        "num_nodes": spec.num_nodes,
        "node_feat": None,
        "edge_feat": None,
    }
    saver.save_graph_list([graph])
    num_edges = graph["edge_index"].shape[1]
    del graph
    saver.save_target_labels(data["label"].reshape(-1, 1))
    saver.save_split(
        {k: data[k] for k in ("train", "valid", "test")},
        split_name="random",
    )
    mapping = work / "mapping"
    mapping.mkdir()
    (mapping / "README.md").write_text(
        f"# {name}\n\nSynthetic graph generated by hmgraph with "
        f"{json.dumps(asdict(spec))}.\nNode ids are the dataset's "
        f"own; community.npy holds each node's community.\n"
    )
    np.save(mapping / "community.npy", data["community"])
    saver.copy_mapping_dir(str(mapping))
    saver.save_task_info(
        "multiclass classification", "acc",
        num_classes=spec.num_classes,
    )
    return Path(saver.dataset_dir), saver.get_meta_dict(), num_edges


def _remove_stale_builds(root: Path, stem: str) -> None:
    """Delete build folders of runs that died (their pid is gone)."""
    for stale in root.glob(f".{stem}-*-*"):
        pid = stale.name[len(stem) + 2:].split("-")[0]
        if stale.is_dir() and pid.isdigit() and not psutil.pid_exists(
                int(pid)):
            log.info("removing %s, left by a killed run", stale)
            shutil.rmtree(stale, ignore_errors=True)


class _Quiet(contextlib.ExitStack):
    """Silence ogb's prints and progress bars (both streams)."""

    def __enter__(self):
        super().__enter__()
        self.enter_context(contextlib.redirect_stdout(io.StringIO()))
        self.enter_context(contextlib.redirect_stderr(io.StringIO()))
        return self
