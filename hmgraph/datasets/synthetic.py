"""Seeded synthetic node-classification graphs, written in OGB's format.

The graph, labels and split come from a degree-corrected stochastic block
model (`hmgraph.datasets.sbm`, whose `SynthSpec` and `generate_graph` are
importable from here too): power-law degrees, communities on a ring,
every community carrying one class. Features are ``signal *
centroid[label] + noise``, so a node's own row is a weak hint and the
average over its neighbourhood a strong one: a GNN clearly beats an MLP,
and graph clusters are meaningful.

The edge list holds every undirected edge once, which halves what ogb's
saver and reader hold in memory; `hmgraph.datasets` adds the reverse
edges when it loads the graph. The graph, labels and split are written
through `ogb.io.DatasetSaver` and loaded through
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
from dataclasses import asdict
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
from hmgraph.datasets.sbm import SynthSpec, generate_graph

log = logging.getLogger(__name__)

__all__ = ["SPECS", "SynthSpec", "check_feature_file", "feature_rows",
           "generate", "generate_graph", "make_synthetic", "restore_features",
           "write_features"]

_META_FILE = "hmgraph-meta.json"
# Version of the generated layout; folders of another version are rebuilt.
# 2: features only in the feature file, written block by block.
_FORMAT = 2
FEATURE_BLOCK_ROWS = 16_384


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
