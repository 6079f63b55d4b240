"""The feature contract, checked the same way for every tier and cache."""

from __future__ import annotations

import numpy as np
import torch


def check_feature_contract(feature, reference: np.ndarray, ids, **read_args
                           ) -> torch.Tensor:
    """``feature.read(ids)`` equals ``reference[ids]`` bit for bit.

    Returns the rows read (on the feature's device).
    """
    ids = np.asarray(ids, dtype=np.int64)
    rows = feature.read(torch.from_numpy(ids), **read_args)
    assert rows.device == feature.device
    assert rows.dtype == torch.from_numpy(reference[:0]).dtype
    assert tuple(rows.shape) == (len(ids), *reference.shape[1:])
    expected = reference[ids]
    assert rows.cpu().numpy().tobytes() == expected.tobytes()
    return rows
