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
Everything is vectorised NumPy, generated in chunks, and written through
`ogb.io.DatasetSaver`; the dataset is then loaded through
``DglNodePropPredDataset(..., meta_dict=...)`` like any OGB node dataset.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["SPECS", "SynthSpec", "generate", "make_synthetic"]

_META_FILE = "hmgraph-meta.json"
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
        Shares of nodes in the train and validation splits; the rest is
        the test split.
    """

    num_nodes: int
    avg_degree: float
    num_classes: int
    feat_dim: int
    community_size: int
    train_frac: float
    valid_frac: float
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
}


def generate(spec: SynthSpec) -> dict[str, np.ndarray]:
    """Generate one synthetic graph in memory.

    Parameters
    ----------
    spec : SynthSpec
        What to generate; the same spec always gives the same arrays.

    Returns
    -------
    dict
        ``edge_index`` (2, E) int64, every undirected edge once (the
        loader adds the reverse edges),
        ``node_feat`` (N, feat_dim) float32, ``label`` (N,) int64,
        ``community`` (N,) int64, and ``train`` / ``valid`` / ``test`` id
        arrays (int64, sorted).
    """
    rng = np.random.default_rng(spec.seed)
    n = spec.num_nodes

    # (1) Communities as contiguous ranges of the internal order.
    sizes = rng.lognormal(0.0, 0.5, size=2 * n // spec.community_size + 2)
    sizes = np.maximum(1, sizes / sizes.mean() * spec.community_size)
    bounds = np.concatenate([[0], np.cumsum(sizes.astype(np.int64))])
    bounds = bounds[bounds < n]
    bounds = np.append(bounds, n)
    num_comms = len(bounds) - 1
    community = np.repeat(np.arange(num_comms), np.diff(bounds))

    # (2) Power-law node weights and their running sums.
    u = rng.random(n)
    theta = np.minimum((1.0 - u) ** (-1.0 / (spec.degree_exponent - 1.0)),
                       spec.max_theta)
    cum = np.cumsum(theta)
    cum_before = cum - theta

    # (3) Edges, chunk by chunk.
    # Draw more pairs than needed: duplicates fall away in (4).
    num_pairs = int(n * spec.avg_degree / 2)
    num_draws = int(num_pairs * _OVERSAMPLE)
    src_parts, dst_parts = [], []
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
        src_parts.append(src[keep])
        dst_parts.append(dst[keep])
    src = np.concatenate(src_parts)
    dst = np.concatenate(dst_parts)
    del src_parts, dst_parts

    # (4) Undirected, without duplicates, down to the wanted count.
    lo_end, hi_end = np.minimum(src, dst), np.maximum(src, dst)
    key = np.unique(lo_end * n + hi_end)
    del src, dst, lo_end, hi_end
    if key.size > num_pairs:
        key = np.sort(rng.choice(key, size=num_pairs, replace=False))

    # (5) Labels from communities, features from labels.
    comm_class = rng.integers(0, spec.num_classes, size=num_comms)
    comm_class[: spec.num_classes] = rng.permutation(spec.num_classes)[
        : min(spec.num_classes, num_comms)
    ]
    label = comm_class[community]
    noisy = rng.random(n) < spec.label_noise
    label[noisy] = rng.integers(0, spec.num_classes, size=int(noisy.sum()))
    centroid = rng.standard_normal(
        (spec.num_classes, spec.feat_dim), dtype=np.float32
    )
    feat = rng.standard_normal((n, spec.feat_dim), dtype=np.float32)
    feat += np.float32(spec.signal) * centroid[label]

    # (6) Shuffle ids so communities are not id ranges; split.
    perm = rng.permutation(n)  # internal id -> public id
    inverse = np.empty(n, dtype=np.int64)
    inverse[perm] = np.arange(n)
    edge_index = np.stack([perm[key // n], perm[key % n]])
    del key
    order = rng.permutation(n)
    num_train = int(n * spec.train_frac)
    num_valid = int(n * spec.valid_frac)
    return {
        "edge_index": edge_index,
        "node_feat": feat[inverse],
        "label": label[inverse].astype(np.int64),
        "community": community[inverse].astype(np.int64),
        "train": np.sort(order[:num_train]),
        "valid": np.sort(order[num_train:num_train + num_valid]),
        "test": np.sort(order[num_train + num_valid:]),
    }


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


def make_synthetic(name: str, root: str | os.PathLike) -> Path:
    """Generate ``name`` under ``root`` unless it is already there.

    The dataset is written through `ogb.io.DatasetSaver` into a temporary
    folder, processed once by ``DglNodePropPredDataset`` and then renamed
    into place, so a killed run leaves nothing that a later run trusts.

    Parameters
    ----------
    name : str
        A key of `SPECS`.
    root : str or os.PathLike
        Folder that holds datasets.

    Returns
    -------
    pathlib.Path
        The dataset's folder (OGB layout: ``raw/``, ``processed/``,
        ``split/``, ``mapping/``).
    """
    from ogb.io import DatasetSaver
    from ogb.nodeproppred import DglNodePropPredDataset

    spec = SPECS[name]
    folder = Path(root) / folder_name(name)
    if (folder / _META_FILE).is_file():
        return folder
    log.info("generating %s under %s", name, root)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        data = generate(spec)
        quiet = _Quiet()
        with quiet:
            saver = DatasetSaver(
                ogb_name(name), is_hetero=False, version=1,
                root=str(work / "build"),
            )
            graph = {
                "edge_index": data.pop("edge_index"),
                "num_nodes": spec.num_nodes,
                "node_feat": data.pop("node_feat"),
                "edge_feat": None,
            }
            saver.save_graph_list([graph])
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
            meta = saver.get_meta_dict()
        built = Path(saver.dataset_dir)
        (built / _META_FILE).write_text(json.dumps(
            {"spec": asdict(spec), "ogb_meta": meta}, indent=1
        ))
        # (7) Let ogb build its processed graph before the folder is
        # visible under its final name.
        with quiet:
            DglNodePropPredDataset(ogb_name(name), meta_dict=meta_dict(built))
        if folder.exists():  # a remnant without its marker: not trusted
            shutil.rmtree(folder)
        os.replace(built, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


class _Quiet(contextlib.ExitStack):
    """Silence ogb's prints and progress bars (both streams)."""

    def __enter__(self):
        super().__enter__()
        self.enter_context(contextlib.redirect_stdout(io.StringIO()))
        self.enter_context(contextlib.redirect_stderr(io.StringIO()))
        return self
