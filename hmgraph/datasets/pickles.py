"""Dataset files that are pickles, read without running code from them.

Some dataset formats are Python pickles: Planetoid's ``ind.<name>.*``
(numpy arrays, scipy CSR matrices, a dict of lists) and OGB's
``split_dict.pt`` (``torch.save`` of a dict of numpy arrays or tensors).
Unpickling calls whatever the file names, so a crafted file in a dataset
folder would run code on ``hmgraph train``. Every such read goes through
an unpickler that admits only the globals its format uses
(`RestrictedUnpickler`); anything else is refused, with one line naming
the file and the global, before anything is called.

* `load_pickle`: a plain pickle, with the globals it may name;
* `load_torch`: a ``torch.save`` file: ``torch.load(weights_only=True)``,
  and, for numpy arrays (which torch 2.2's weights-only unpickler
  refuses), torch's loader with a `RestrictedUnpickler` that admits
  tensors and numpy arrays only;
* `ogb_split`: what an ogb dataset's ``get_idx_split()`` returns, without
  ogb 1.3.6's unrestricted ``torch.load`` of ``split_dict.pt``.
"""

from __future__ import annotations

import os
import pickle
import types
import warnings
import zipfile
from pathlib import Path

import torch

__all__ = ["NUMPY_ARRAYS", "RestrictedUnpickler", "UnsafePickleError",
           "load_pickle", "load_torch", "ogb_split"]

#: The globals a pickled numpy array (and numpy scalar) names: numpy 1's
#: and numpy 2's module paths, and ``_codecs.encode``, which protocol-2
#: pickles use for the array's bytes.
NUMPY_ARRAYS = frozenset({
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
})
#: A tensor as ``torch.save`` pickles it (its storage comes through torch's
#: own persistent ids, not a global).
_TENSORS = frozenset({
    ("torch._utils", "_rebuild_tensor_v2"),
    ("collections", "OrderedDict"),
})
#: What unpickling a crafted, cut or foreign file raises: about anything
#: (a bad memo index, an admitted callable given bad arguments...).
_UNREADABLE = Exception


class UnsafePickleError(ValueError):
    """A dataset file names code its format never holds; it was not run."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in ``allowed``.

    Parameters
    ----------
    file : binary file
        The pickle.
    allowed : set of (str, str)
        ``(module, name)`` pairs the pickle may name, spelled as in the
        file (Python 2 pickles say ``__builtin__``).
    **kwargs
        As for `pickle.Unpickler` (``encoding``...).
    """

    allowed: frozenset = frozenset()

    def __init__(self, file, allowed=None, **kwargs):
        super().__init__(file, **kwargs)
        if allowed is not None:
            self.allowed = frozenset(allowed)

    def find_class(self, module: str, name: str):
        """See `pickle.Unpickler.find_class`; other globals are refused."""
        if (module, name) not in self.allowed:
            raise pickle.UnpicklingError(
                f"it names {module}.{name}, which this format never holds")
        with warnings.catch_warnings():
            # Old pickles name deprecated paths (scipy.sparse.csr).
            warnings.simplefilter("ignore", DeprecationWarning)
            return super().find_class(module, name)


def load_pickle(path: str | os.PathLike, allowed, what: str,
                encoding: str = "ASCII"):
    """Unpickle ``path``, admitting only the globals in ``allowed``.

    Parameters
    ----------
    path : str or os.PathLike
        The pickle file.
    allowed : set of (str, str)
        ``(module, name)`` pairs the file may name.
    what : str
        What the file should be, for the message (``"Planetoid file"``).
    encoding : str
        As for `pickle.load` (``"latin1"`` for Python 2 numpy pickles).

    Raises
    ------
    UnsafePickleError
        One line naming the file and the global it was refused for.
    """
    path = Path(path)
    with open(path, "rb") as f:
        try:
            return RestrictedUnpickler(f, allowed, encoding=encoding).load()
        except _UNREADABLE as err:
            raise _refused(path, what, err) from None


def load_torch(path: str | os.PathLike, what: str):
    """``torch.load`` a file of tensors or numpy arrays, and nothing else.

    ``torch.load(path, weights_only=True)`` first; a file it refuses is
    loaded again through a `RestrictedUnpickler` admitting tensors and
    numpy arrays only (ogb writes its splits as numpy arrays, which torch
    2.2's weights-only unpickler does not admit). A TorchScript archive is
    refused: ``torch.load`` would hand it to ``torch.jit.load``.

    Parameters
    ----------
    path : str or os.PathLike
        The file written by ``torch.save``.
    what : str
        What the file should be, for the message (``"split file"``).

    Returns
    -------
    object
        What was saved, on the CPU.

    Raises
    ------
    UnsafePickleError
        One line naming the file and the global it was refused for.
    """
    path = Path(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            if any(n.endswith("constants.pkl") for n in archive.namelist()):
                raise _refused(path, what, "it is a TorchScript archive")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except _UNREADABLE:
        pass
    try:
        return torch.load(path, map_location="cpu", weights_only=False,
                          pickle_module=_ARRAYS_AND_TENSORS)
    except _UNREADABLE as err:
        raise _refused(path, what, err) from None


def ogb_split(dataset) -> dict:
    """``dataset.get_idx_split()`` of an ogb dataset, read safely.

    ogb 1.3.6 returns ``torch.load(split/<kind>/split_dict.pt)`` unchecked
    where that file exists (the node and graph datasets alike); this reads
    it with `load_torch` instead. Without it, ogb reads its CSV files,
    which run no code.

    Parameters
    ----------
    dataset : ogb dataset
        A ``DglNodePropPredDataset`` or ``DglGraphPropPredDataset``.

    Returns
    -------
    dict
        ``train``, ``valid``, ``test``: id arrays or tensors, as ogb's.
    """
    path = (Path(dataset.root) / "split" / dataset.meta_info["split"]
            / "split_dict.pt")
    if path.is_file():
        return load_torch(path, "split file")
    return dataset.get_idx_split()


def _refused(path: Path, what: str, reason) -> UnsafePickleError:
    reason = str(reason).strip().splitlines()[0] if str(reason) else \
        type(reason).__name__
    return UnsafePickleError(
        f"{path} cannot be read as a {what} ({reason}); nothing in it was "
        f"run: replace it with the dataset's original file")


class _TensorsAndArrays(RestrictedUnpickler):
    allowed = NUMPY_ARRAYS | _TENSORS


def _load_arrays_and_tensors(file, **kwargs):
    return _TensorsAndArrays(file, **kwargs).load()


#: A pickle module for ``torch.load(pickle_module=...)``: torch's legacy
#: format calls ``load``, both formats subclass ``Unpickler``.
_ARRAYS_AND_TENSORS = types.ModuleType("hmgraph_restricted_pickle")
_ARRAYS_AND_TENSORS.Unpickler = _TensorsAndArrays
_ARRAYS_AND_TENSORS.load = _load_arrays_and_tensors
