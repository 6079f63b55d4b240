"""A node dataset renumbered: clusters as id ranges, or any permutation."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch

from hmgraph.cache.format import (
    atomic_path,
    read_manifest,
    verify_feature_file,
)
from hmgraph.datasets.base import FEATURE_FILE, NodeDataset
from hmgraph.datasets.locking import exclusive_lock
from hmgraph.samplers.renumber import (
    cluster_permutation,
    inverse_permutation,
    renumber_feature_file,
    renumber_graph,
)

log = logging.getLogger(__name__)

__all__ = ["permuted", "renumbered", "to_original"]


def renumbered(dataset: NodeDataset, clusters: torch.Tensor,
               tag: str) -> NodeDataset:
    """``dataset`` with node ``old`` renamed so clusters are contiguous.

    `permuted` with `cluster_permutation` of ``clusters``.

    Parameters
    ----------
    dataset : NodeDataset
        The dataset (possibly renumbered already).
    clusters : torch.Tensor
        Cluster id per node of ``dataset``, in its ids.
    tag : str
        Names the cache folder (e.g. ``"metis-188"``).
    """
    perm, _ = cluster_permutation(clusters)
    return permuted(dataset, perm, tag)


def permuted(dataset: NodeDataset, perm: torch.Tensor, tag: str,
             verify: bool = True) -> NodeDataset:
    """``dataset`` with node ``perm[new]`` renamed ``new``.

    The graph, labels, split and feature file are in the new ids; the
    rewritten feature file is cached beside the one it is read from, under
    ``renumbered-<tag>-<digest>/``, where ``digest`` names what it is
    derived from (the source file's checksum and the permutation's hash),
    so runs that order the rows differently (other seeds) never share a
    folder. Beside it are ``perm.npy`` and a record (``derived.json``) of
    that identity and of the file's own checksum: reused while all match
    (``perm.npy`` included), rebuilt when missing or stale, refused in one
    line when its rows fail the checksum. One process writes a folder,
    under an exclusive lock (its ``.lock``); others wait and reuse it, and
    every file is renamed into place whole, so no run reads a file that
    another is writing. The returned dataset's ``info`` holds ``perm``
    (new -> original id) and ``inverse`` (original -> new), ``folder`` and
    ``reused`` (True when the rewritten file was already there);
    `to_original` maps per-node outputs back, so predictions and
    evaluation stay in the user's ids.

    Renumbering composes: when ``dataset`` is renumbered already (its
    ``info`` has ``perm``), ``perm`` is relative to its ids, its feature
    file is rewritten with ``perm``, and ``info["perm"]`` of the result
    maps to the ids of the dataset it was first renumbered from.

    Parameters
    ----------
    dataset : NodeDataset
        The dataset to renumber.
    perm : torch.Tensor
        int64 (num_nodes,): a permutation of ``dataset``'s ids, ``perm[new]
        = old``.
    tag : str
        Names the cache folder (e.g. ``"hot-first"``).
    verify : bool
        Recompute the reused file's checksum (reads it whole), as
        `hmgraph.datasets.load` does for the file it was derived from.

    Returns
    -------
    NodeDataset
        Renumbered; its ``feature_path`` is the rewritten file.
    """
    perm = torch.as_tensor(perm).cpu().long()
    n = dataset.num_nodes
    if perm.shape != (n,) or not torch.equal(perm.sort().values,
                                             torch.arange(n)):
        raise ValueError(
            f"perm must be a permutation of the {n} node ids, got a tensor "
            f"of shape {tuple(perm.shape)}"
        )
    inverse = inverse_permutation(perm)
    # (1) The permutation to the original ids (composed when renumbered).
    base = dataset.info.get("perm")
    total = perm if base is None else base[perm]
    # (2) The feature file, rewritten from the dataset's own file unless
    # the cached one was derived from this very source and order.
    folder, reused = _rewritten(dataset.feature_path, perm, total, tag)
    target = folder / FEATURE_FILE
    if verify and reused:
        verify_feature_file(target)
    # (3) Graph, labels and split in the new ids.
    graph = renumber_graph(dataset.graph, perm, inverse)
    split = {k: inverse[v] for k, v in dataset.split.items()}
    info = dict(dataset.info, perm=total, inverse=inverse_permutation(total),
                folder=folder, reused=reused)
    return dataclasses.replace(
        dataset, graph=graph, labels=dataset.labels[perm], split=split,
        feature_path=target, info=info,
    )


def _rewritten(source: Path, perm: torch.Tensor, total: torch.Tensor,
               tag: str) -> tuple[Path, bool]:
    """The folder of ``source`` rewritten in the order ``perm``.

    Reused when the cached one was derived from this very source and
    order (``total``, to the original ids) and is whole: its record,
    written last, names all three. The folder is named by that identity;
    one process writes it, the others wait.

    Returns
    -------
    tuple
        ``(folder, reused)``: the folder and whether it was there.
    """
    identity = {"source": str(Path(source).name),
                "source_checksum": read_manifest(source).checksum,
                "perm_sha256": hashlib.sha256(
                    total.numpy().tobytes()).hexdigest()}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode())
    folder = Path(source).parent / \
        f"renumbered-{tag}-{digest.hexdigest()[:DIGEST_CHARS]}"
    reused = _derived(folder, identity)
    if not reused:
        with exclusive_lock(folder / ".lock", folder):
            reused = _derived(folder, identity)  # another run's, meanwhile
            if not reused:
                _derive(source, folder, perm, total, identity)
    return folder, reused


DERIVED_RECORD = "derived.json"
PERM_FILE = "perm.npy"
#: Hex digits of the identity's SHA-256 in a derived folder's name.
DIGEST_CHARS = 16


def _derived(folder: Path, identity: dict) -> bool:
    """Whether ``folder`` holds a whole file derived as ``identity`` says.

    Its record must name ``identity`` and the file's checksum, and
    ``perm.npy`` must hold the permutation the record names (its shape and
    SHA-256). Reads headers and ``perm.npy``, not the rows.
    """
    target = folder / FEATURE_FILE
    try:
        record = json.loads((folder / DERIVED_RECORD).read_text())
        manifest = read_manifest(target)
        perm = np.load(folder / PERM_FILE, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return False  # missing, half-written or foreign: rebuild
    if not isinstance(record, dict) or \
            any(record.get(k) != v for k, v in identity.items()) or \
            record.get("checksum") != manifest.checksum:
        log.info("%s was derived from another source or order; "
                 "rewriting it", folder)
        return False
    if perm.shape != (manifest.num_rows,) or perm.dtype != np.int64 or \
            hashlib.sha256(np.ascontiguousarray(perm).tobytes()).hexdigest(
            ) != identity["perm_sha256"]:
        log.info("%s/%s is not the permutation its record names; "
                 "rewriting the folder", folder, PERM_FILE)
        return False
    return True


def _derive(source: Path, folder: Path, perm: torch.Tensor,
            total: torch.Tensor, identity: dict) -> None:
    """Write ``folder``: rows of ``source`` in ``perm`` order, ``total``.

    The caller holds the folder's lock. The record goes first (a reader
    checks it first) and comes back last; the rows and ``perm.npy`` are
    renamed into place whole, never rewritten in place.
    """
    record_path = folder / DERIVED_RECORD
    record_path.unlink(missing_ok=True)
    target = renumber_feature_file(source, folder / FEATURE_FILE, perm)
    with atomic_path(folder / PERM_FILE) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, total.numpy())
    record = dict(identity, checksum=read_manifest(target).checksum)
    with atomic_path(record_path) as tmp:  # written last: the marker
        tmp.write_text(json.dumps(record, indent=1))


def to_original(dataset: NodeDataset, values: torch.Tensor) -> torch.Tensor:
    """Per-node ``values`` in the dataset's ids, reordered to original ids.

    Identity for a dataset that was not renumbered.
    """
    inverse = dataset.info.get("inverse")
    return values if inverse is None else values[inverse]
