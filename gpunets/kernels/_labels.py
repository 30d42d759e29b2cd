"""Label encoding for ``vote``: labels that are not integers are voted as their codes."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_int_labels(dtype: Any) -> bool:
    return np.dtype(dtype).kind in "iu"


def encode(arrays: tuple, xp: Any = np) -> tuple[tuple, Any]:
    """Codes (one int64 array per input, flattened) and the sorted unique labels across all inputs."""
    flat = xp.concatenate([xp.reshape(a, (-1,)) for a in arrays])
    try:
        uniq, inv = xp.unique(flat, return_inverse=True)
    except TypeError as exc:
        msg = f"vote(): labels could not be sorted to encode them ({exc}); use labels of one comparable type"
        raise TypeError(msg) from None
    codes = xp.reshape(inv.astype(xp.int64), (len(arrays), -1))
    return tuple(codes[k] for k in range(len(arrays))), uniq
