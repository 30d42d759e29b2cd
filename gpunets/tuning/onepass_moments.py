"""The one-pass path's moments of the folds, formed in the rows' own array namespace.

:func:`folds` gives each split's training and test :class:`~gpunets.tuning.onepass.Moments` (per weight key):

* test folds that partition the rows used (K-fold style): one pass over the test folds, each training set's
  moments the total less its test fold's;
* any other splits (shuffled or repeated splits, time series, the subsampled rungs of a successive-halving
  search): from the **chunks** of all rows, fixed contiguous ranges whose moments are formed once per fit
  (:class:`Memo`, kept on the search between its rungs and for its refit).  A split's rows take each chunk they
  fill whole (its moments), fill mostly (its moments less those of the chunk's rows they miss) or touch (the
  moments of their rows there): one pass over the fewer of the two, never more rows than the split's own;
* :func:`total`: the moments of all rows (the refit's), the sum of the test folds' or of the chunks'.

Every pass is one GEMM per block of rows (:data:`CHUNK_ROWS`) and one copy of the sums to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpunets.devices.data import to_device
from gpunets.tuning.onepass import Fold, Moments

__all__ = ["CHUNK_ROWS", "CHUNKS", "Memo", "folds", "moments", "partition", "start", "total"]

#: rows per GEMM of a moments pass on a device (bounds the temporary ``[X, y]`` block)
CHUNK_ROWS = 1 << 16
#: rows per GEMM of a moments pass on the host (a block that stays in the cache while it is summed)
HOST_ROWS = 1 << 14
#: how many contiguous chunks the rows are cut into when the splits do not partition them
CHUNKS = 16


@dataclass
class Memo:
    """One fit's moments of its rows ``X``, ``y`` (kept by identity: a new fit makes a new memo): the shift
    ``z0`` (host and device), each column's range, per weight key the chunks' moments and all rows'."""

    X: Any
    y: Any
    x0: np.ndarray
    y0: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    z0: Any = None
    bounds: np.ndarray | None = None              # chunk starts, and the end: (chunks + 1,)
    chunks: dict[Any, list[Moments]] = field(default_factory=dict)
    whole: dict[Any, Moments] = field(default_factory=dict)
    device_weights: dict[Any, Any] = field(default_factory=dict)
    previous: list[tuple[np.ndarray, dict[Any, Moments]]] = field(default_factory=list)   # the last splits' groups
    read: int = 0   # rows the last splits' pass read
    refit: dict[str, Any] = field(default_factory=dict)   # what the refit needs: metric, weight key, ...

    def fits(self, X: Any, y: Any) -> bool:
        return self.X is X and self.y is y


def _sums(X: Any, Y: Any, xp: Any, groups: list[np.ndarray], weights: dict[Any, Any], keys: set[Any], z0: Any,
          tail: tuple[Any, ...] = ()) -> tuple[list[dict[Any, tuple[float, np.ndarray, np.ndarray]]], np.ndarray]:
    """Per group of rows, per weight key, ``(Σw, Σ w z, Σ w z zᵀ)`` of ``z = [X, Y] - z0`` (one GEMM per block
    of rows), and the ``tail`` arrays: one copy to the host."""
    d, p = X.shape[1], X.shape[1] + Y.shape[1]
    host = type(X) is np.ndarray and type(Y) is np.ndarray
    parts = []
    step = HOST_ROWS if host else CHUNK_ROWS
    for rows in groups:
        acc: dict[Any, list[Any]] = {}
        for start in range(0, len(rows), step):
            chunk = rows[start:start + step]
            idx = None
            if chunk[-1] - chunk[0] == len(chunk) - 1 and np.all(np.diff(chunk) == 1):   # a range: a slice
                a, b = int(chunk[0]), int(chunk[-1]) + 1
                if host:   # the rows written once, shifted, into one block
                    Z = np.empty((b - a, p))
                    np.subtract(X[a:b], z0[:d], out=Z[:, :d])
                    np.subtract(Y[a:b], z0[d:], out=Z[:, d:])
                else:
                    Z = xp.concat([X[a:b, ...], Y[a:b, ...]], axis=1) - z0
            elif host:
                idx = chunk
                Z = np.empty((len(chunk), p))
                np.take(X, chunk, axis=0, out=Z[:, :d])
                np.take(Y, chunk, axis=0, out=Z[:, d:])
                Z -= z0
            else:
                idx = xp.asarray(chunk)
                Z = xp.concat([xp.take(X, idx, axis=0), xp.take(Y, idx, axis=0)], axis=1) - z0
            for k in keys:
                if k is None:
                    G, s = Z.T @ Z, xp.sum(Z, axis=0)
                    nw = xp.asarray([float(len(chunk))], dtype=xp.float64)
                else:
                    wk = weights[k][a:b] if idx is None else xp.take(weights[k], idx, axis=0)
                    Zw = Z * xp.reshape(wk, (-1, 1))
                    G, s, nw = Zw.T @ Z, xp.sum(Zw, axis=0), xp.reshape(xp.sum(wk), (1,))
                acc_k = acc.get(k)
                acc[k] = [nw, s, G] if acc_k is None else [acc_k[0] + nw, acc_k[1] + s, acc_k[2] + G]
        for k in keys:
            nw, s, G = acc[k]
            parts.extend([nw, s, xp.reshape(G, (-1,))])
    parts.extend(tail)
    flat = np.asarray(to_device(xp.concat(parts), "cpu"), dtype=np.float64) if parts else np.zeros(0)
    out, at = [], 0
    for _ in groups:
        got = {}
        for k in keys:
            G = flat[at + 1 + p:at + 1 + p + p * p].reshape(p, p)
            got[k] = (float(flat[at]), flat[at + 1:at + 1 + p], (G + G.T) / 2)
            at += 1 + p + p * p
        out.append(got)
    return out, flat[at:]


def _host_ranges(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The column sums, least and greatest values of host rows, block by block (one read of the rows)."""
    s, lo, hi = np.zeros(X.shape[1]), np.full(X.shape[1], np.inf), np.full(X.shape[1], -np.inf)
    for a in range(0, X.shape[0], HOST_ROWS // 4):
        block = X[a:a + HOST_ROWS // 4]
        s += block.sum(axis=0)
        np.minimum(lo, block.min(axis=0), out=lo)
        np.maximum(hi, block.max(axis=0), out=hi)
    return s, lo, hi


def _memo(X: Any, Y: Any, xp: Any, X_user: Any, y_user: Any) -> tuple[Memo, Any]:
    n, d, t = X.shape[0], X.shape[1], Y.shape[1]
    if type(X) is np.ndarray and type(Y) is np.ndarray and n:
        sx, lo, hi = _host_ranges(X)
        x0, y0 = sx / n, Y.sum(axis=0) / n
        memo = Memo(X_user, y_user, x0, y0, lo, hi, np.concatenate([x0, y0]))
        return memo, memo.z0
    x0, y0 = xp.sum(X, axis=0) / n, xp.sum(Y, axis=0) / n   # the column means
    z0 = xp.concat([x0, y0])
    _, tail = _sums(X, Y, xp, [], {}, set(), z0, (xp.min(X, axis=0), xp.max(X, axis=0), x0, y0))
    memo = Memo(X_user, y_user, tail[2 * d:3 * d], tail[3 * d:3 * d + t], tail[:d], tail[d:2 * d], z0)
    return memo, z0


def start(X: Any, Y: Any, xp: Any, X_user: Any, y_user: Any) -> Memo | None:
    """A fit's :class:`Memo` (the column means, least and greatest values: one pass over the rows, one copy),
    or None where one is not finite: NaN or infinity in the rows (or sums beyond float64), found before any
    moment is formed."""
    memo, _ = _memo(X, Y, xp, X_user, y_user)
    if not all(np.all(np.isfinite(a)) for a in (memo.x0, memo.y0, memo.lo, memo.hi)):
        return None
    return memo


def _device_weights(xp: Any, weights: dict[Any, np.ndarray], keys: set[Any], memo: Memo) -> dict[Any, Any]:
    for k in keys:
        if k is not None and k not in memo.device_weights:
            memo.device_weights[k] = xp.asarray(weights[k])
    return memo.device_weights


def moments(X: Any, Y: Any, xp: Any, groups: list[np.ndarray], weights: dict[Any, np.ndarray], keys: set[Any],
            memo: Memo) -> list[dict[Any, Moments]]:
    """Per group of rows, per weight key, the :class:`Moments` of ``[X - x0, Y - y0]`` (the memo's shift: the
    column means, which keep the sums well-conditioned); one pass over the groups' rows."""
    per, _ = _sums(X, Y, xp, groups, _device_weights(xp, weights, keys, memo), keys, memo.z0)
    return [{k: Moments(*g[k], memo.lo, memo.hi, len(rows)) for k in keys} for rows, g in zip(groups, per)]


def partition(splits: list[tuple[np.ndarray, np.ndarray]], n: int) -> bool:
    """Whether the test folds are disjoint and each training set is the other folds' rows."""
    label = np.full(n, -1, dtype=np.int64)
    for f, (_, test) in enumerate(splits):
        if np.any(label[test] != -1):
            return False
        label[test] = f
    used = int(np.count_nonzero(label >= 0))
    for f, (train, test) in enumerate(splits):
        lt = label[train]
        if len(train) + len(test) != used or np.any(lt < 0) or np.any(lt == f) \
                or np.bincount(train, minlength=n).max(initial=0) > 1:
            return False
    return True


def _add(parts: list[tuple[int, Moments]], lo: np.ndarray, hi: np.ndarray, rows: int) -> Moments:
    n = sum(sign * m.n for sign, m in parts)
    s = np.sum([sign * m.s for sign, m in parts], axis=0)
    G = np.sum([sign * m.G for sign, m in parts], axis=0)
    return Moments(float(n), s, G, lo, hi, rows)


def _chunks(X: Any, Y: Any, xp: Any, weights: dict[Any, np.ndarray], keys: set[Any], memo: Memo) -> None:
    """The chunks' moments for the keys the memo lacks (one pass over all rows)."""
    n = X.shape[0]
    if memo.bounds is None:
        size = max(1, -(-n // CHUNKS))
        memo.bounds = np.append(np.arange(0, n, size), n)
    todo = {k for k in keys if k not in memo.chunks}
    if not todo:
        return
    b = memo.bounds
    got = moments(X, Y, xp, [np.arange(b[i], b[i + 1]) for i in range(len(b) - 1)], weights, todo, memo)
    for k in todo:
        memo.chunks[k] = [g[k] for g in got]
        memo.whole.setdefault(k, _add([(1, g[k]) for g in got], memo.lo, memo.hi, n))


def _cover(rows: np.ndarray, n: int, bounds: np.ndarray,
           previous: list[tuple[np.ndarray, dict[Any, Moments]]]) -> tuple[Any, np.ndarray, np.ndarray] | None:
    """``(chunks taken whole or mostly, rows to add, rows to take away)`` for a group of distinct rows, or
    ``(an earlier group's moments, the rows it lacks, no rows)`` where the group holds an earlier split's rows
    and that is cheaper (the nested subsamples of successive-halving rungs); None for a group with a row
    repeated (summed as it is)."""
    mask = np.zeros(n, dtype=bool)
    mask[rows] = True
    if int(np.count_nonzero(mask)) != len(rows):
        return None
    starts, sizes = bounds[:-1], np.diff(bounds)
    counts = np.add.reduceat(mask, starts, dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
    major = 2 * counts > sizes
    per_row = np.repeat(major, sizes)
    add, sub = np.flatnonzero(mask & ~per_row), np.flatnonzero(~mask & per_row)
    for prev, got in sorted(previous, key=lambda p: -len(p[0])):
        if len(rows) - len(prev) >= len(add) + len(sub):
            break
        if len(prev) < len(rows) and bool(np.all(mask[prev])):
            mask[prev] = False
            return got, np.flatnonzero(mask), np.zeros(0, dtype=np.int64)
    return np.flatnonzero(major), add, sub


def _chunked(X: Any, Y: Any, xp: Any, groups: list[np.ndarray], weights: dict[Any, np.ndarray], keys: set[Any],
             memo: Memo) -> list[dict[Any, Moments]]:
    """Each group's moments from the chunks': one pass over the rows added to or taken from the chunks."""
    n = X.shape[0]
    _chunks(X, Y, xp, weights, keys, memo)
    assert memo.bounds is not None
    previous = [p for p in memo.previous if keys <= set(p[1])]
    covers = [_cover(np.asarray(g), n, memo.bounds, previous) for g in groups]
    extra: list[np.ndarray] = []
    for g, c in zip(groups, covers):
        extra.extend([np.asarray(g)] if c is None else [r for r in c[1:] if len(r)])
    memo.read = sum(len(r) for r in extra)
    got = iter(moments(X, Y, xp, extra, weights, keys, memo))
    out = []
    for g, c in zip(groups, covers):
        if c is None:
            out.append(next(got))
            continue
        whole, add, sub = c
        if isinstance(whole, dict):   # an earlier split's group, and the rows it lacks
            pieces = {k: [(1, whole[k])] for k in keys}
        else:
            pieces = {k: [(1, memo.chunks[k][i]) for i in whole] for k in keys}
        for sign, r in ((1, add), (-1, sub)):
            if len(r):
                m = next(got)
                for k in keys:
                    pieces[k].append((sign, m[k]))
        out.append({k: _add(pieces[k], memo.lo, memo.hi, len(g)) if pieces[k] else
                    Moments(0.0, np.zeros(len(memo.x0) + len(memo.y0)), np.zeros((len(memo.x0) + len(memo.y0),) * 2),
                            memo.lo, memo.hi, 0) for k in keys})
    memo.previous = [(np.asarray(g), m) for g, m in zip(groups, out) if keys <= set(m)]
    return out


def folds(X: Any, Y: Any, xp: Any, splits: list[tuple[np.ndarray, np.ndarray]], weights: dict[Any, np.ndarray],
          keys: set[Any], memo: Memo | None = None, X_user: Any = None,
          y_user: Any = None) -> tuple[list[Fold], str, Memo]:
    """Each split's :class:`Fold` (training and test moments per weight key), how they were formed, and the
    fit's :class:`Memo` (``memo`` when it holds these rows' moments, else a new one)."""
    n, d, t = X.shape[0], X.shape[1], Y.shape[1]
    if memo is None:
        memo, _ = _memo(X, Y, xp, X if X_user is None else X_user, Y if y_user is None else y_user)
    if partition(splits, n):
        per = moments(X, Y, xp, [np.asarray(test) for _, test in splits], weights, keys, memo)
        tot = {k: _add([(1, g[k]) for g in per], memo.lo, memo.hi, sum(g[k].rows for g in per)) for k in keys}
        for k in keys:
            if tot[k].rows == n:
                memo.whole.setdefault(k, tot[k])
        out = [Fold(d, t, memo.x0, memo.y0, {k: tot[k] - g[k] for k in keys}, g) for g in per]
        rows = tot[next(iter(keys))].rows
        return out, f"{len(splits)} test folds partition {rows} rows: per-fold sums, one pass", memo
    groups = [np.asarray(a) for pair in splits for a in pair]
    per = _chunked(X, Y, xp, groups, weights, keys, memo)
    out = [Fold(d, t, memo.x0, memo.y0, per[2 * f], per[2 * f + 1]) for f in range(len(splits))]
    assert memo.bounds is not None
    held = sum(len(g) for g in groups)
    return out, (f"{len(splits)} splits that do not partition the rows: from the moments of "
                 f"{len(memo.bounds) - 1} chunks of the rows (formed once) or of earlier splits, with one pass over "
                 f"the {memo.read} rows the splits add to or take from them (they hold {held})"), memo


def total(X: Any, Y: Any, xp: Any, weights: dict[Any, np.ndarray], keys: set[Any], memo: Memo) -> dict[Any, Moments]:
    """The moments of all rows per weight key: kept in the memo, else summed from its chunks (formed here if
    need be: one pass)."""
    if not all(k in memo.whole for k in keys):
        _chunks(X, Y, xp, weights, {k for k in keys if k not in memo.whole}, memo)
    return {k: memo.whole[k] for k in keys}
