"""Combining nodes: averages, weighted sums, votes, stacking columns, reductions.

Each builds a :class:`~gpunets.core.nodes.Node` whose operation calls the matching
kernel of :mod:`gpunets.kernels` (``numba.njit`` on the CPU,
``numba.cuda.jit`` on the lane's CUDA stream when the values are on a GPU).
Branches are promoted to a common dtype first; pandas values come back as
pandas with the first branch's index.

>>> import numpy as np, gpunets as gn
>>> a, b = gn.source(np.array([1.0, 2.0]), name="a"), gn.source(np.array([3.0, 6.0]), name="b")
>>> gn.mean(a, b)().tolist(), gn.mean(a, b, weights=[3, 1])().tolist()
([2.0, 4.0], [1.5, 3.0])
>>> gn.vote(gn.source(np.array([1, 2]), name="p"), gn.source(np.array([2, 2]), name="q"))().tolist()
[1, 2]
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Sequence
from functools import partial
from typing import Any

from gpunets.base.saved import saved_operation
from gpunets.core.nodes import Node, is_node
from gpunets.devices import _gpulibs
from gpunets.devices.data import is_cupy_array

__all__ = ["mean", "weighted_sum", "vote", "hstack", "sum", "min", "max", "var", "combine"]



def _branches(nodes: Sequence[Any], fname: str) -> tuple[Any, ...]:
    if len(nodes) == 1 and isinstance(nodes[0], (list, tuple)):
        nodes = tuple(nodes[0])
    if not nodes:
        msg = f"gn.{fname} needs at least one node, e.g. gn.{fname}(a, b)."
        raise TypeError(msg)
    return tuple(nodes)


def _check_weights(weights: Any, k: int, fname: str) -> tuple[float, ...] | None:
    if weights is None:
        return None
    if is_node(weights):
        msg = f"gn.{fname}: weights must be numbers known when the network is built, not a node."
        raise TypeError(msg)
    from gpunets.kernels._validate import check_weights  # lazy: the kernels package imports numba

    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        msg = f"gn.{fname}: weights must be a sequence of {k} numbers (one per branch), got {weights!r}."
        raise TypeError(msg)
    if len(weights) != k:
        msg = f"gn.{fname} got {k} branches but {len(weights)} weights; give one weight per branch."
        raise ValueError(msg)
    return check_weights(weights, k, f"gn.{fname}", nonzero_sum=fname == "mean")


def _unwrap(values: Sequence[Any]) -> tuple[list[Any], Any, str]:
    """Arrays for the kernels, a function that re-wraps the result, and the target."""
    first = values[0]
    mod = type(first).__module__.split(".")[0]
    target = "cuda" if mod == "cudf" or is_cupy_array(first) else "cpu"
    wrap = None
    if mod == "pandas" or mod == "cudf":
        index = first.index
        columns = getattr(first, "columns", None)
        lib = __import__(mod)

        def wrap(out: Any) -> Any:
            if out.ndim == 1:
                return lib.Series(out, index=index)
            cols = columns if columns is not None and len(columns) == out.shape[1] else None
            return lib.DataFrame(out, index=index, columns=cols)
    arrays = [v.to_cupy() if type(v).__module__.startswith("cudf") else
              (v.to_numpy() if hasattr(v, "to_numpy") else v) for v in values]
    return arrays, wrap, target


def _common_dtype(arrays: list[Any], target: str) -> list[Any]:
    if target == "cuda":
        xp = _gpulibs.cupy()
    else:
        import numpy as xp
    arrays = [xp.asarray(a) for a in arrays]
    dt = xp.result_type(*arrays)
    return [a if a.dtype == dt else a.astype(dt) for a in arrays]


#: The kernels of :mod:`gpunets.kernels` that :func:`combine` applies (by name: a loaded file names no other).
KERNELS = ("mean", "weighted_sum", "vote", "hstack", "sum", "min", "max", "var")


@saved_operation(checked={0: "kernel"})
def combine(kernel: str, *values: Any, **kw: Any) -> Any:
    """Apply kernel ``kernel`` (one of :data:`KERNELS`) of :mod:`gpunets.kernels` to branch values (not nodes)."""
    if kernel not in KERNELS:
        msg = f"combine: {kernel!r} is not a kernel; kernels are {list(KERNELS)}."
        raise ValueError(msg)
    from gpunets import kernels  # lazy: the kernels import numba

    arrays, wrap, target = _unwrap(values)
    if kernel != "vote":
        arrays = _common_dtype(arrays, target)
    stream = None
    if target == "cuda":
        cp = _gpulibs.cupy()
        if _gpulibs.fake_gpu_count() and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "1":
            # the fake GPU without numba's simulator: one emulated launch of the CPU kernels on the device buffers
            fn = partial(getattr(kernels, kernel), target="cpu", **kw)
            out = cp.launch(lambda bufs: fn(list(bufs)), arrays, what=f"kernel {kernel}")
            return wrap(out) if wrap is not None else out
        # a GPU, or the fake GPU under the simulator: the CUDA launch path of gpunets.kernels._cuda
        stream = cp.cuda.get_current_stream()
    out = getattr(kernels, kernel)(arrays, target=target, stream=stream, **kw)
    return wrap(out) if wrap is not None else out


def _node(kernel: str, nodes: Sequence[Any], name: str | None, device: Any, **kw: Any) -> Node:
    fn = partial(combine, kernel, **kw)
    fn.__name__ = kernel  # type: ignore[attr-defined]
    return Node(fn, nodes, name=name, device=device)


def mean(*nodes: Any, weights: Sequence[float] | None = None, name: str | None = None, device: Any = None) -> Node:
    """Elementwise (weighted) mean of the branches' values; NaN propagates."""
    nodes = _branches(nodes, "mean")
    return _node("mean", nodes, name, device, weights=_check_weights(weights, len(nodes), "mean"))


def weighted_sum(*nodes: Any, weights: Sequence[float], name: str | None = None, device: Any = None) -> Node:
    """Elementwise ``sum_k w_k * branch_k`` (no normalisation)."""
    nodes = _branches(nodes, "weighted_sum")
    return _node("weighted_sum", nodes, name, device, weights=_check_weights(weights, len(nodes), "weighted_sum"))


def vote(*nodes: Any, name: str | None = None, device: Any = None) -> Node:
    """Elementwise majority of class labels; ties go to the smallest label."""
    return _node("vote", _branches(nodes, "vote"), name, device)


def hstack(*nodes: Any, name: str | None = None, device: Any = None) -> Node:
    """Stack the branches' values as columns (1-D values become one column each)."""
    return _node("hstack", _branches(nodes, "hstack"), name, device)


def sum(*nodes: Any, name: str | None = None, device: Any = None) -> Node:  # noqa: A001 - gn.sum
    """Elementwise sum of the branches' values."""
    return _node("sum", _branches(nodes, "sum"), name, device)


def min(*nodes: Any, name: str | None = None, device: Any = None) -> Node:  # noqa: A001 - gn.min
    """Elementwise minimum of the branches' values; NaN propagates."""
    return _node("min", _branches(nodes, "min"), name, device)


def max(*nodes: Any, name: str | None = None, device: Any = None) -> Node:  # noqa: A001 - gn.max
    """Elementwise maximum of the branches' values; NaN propagates."""
    return _node("max", _branches(nodes, "max"), name, device)


def var(*nodes: Any, ddof: int = 0, name: str | None = None, device: Any = None) -> Node:
    """Elementwise variance across the branches (``ddof=0``)."""
    from gpunets.kernels._validate import check_ddof  # lazy: the kernels package imports numba

    nodes = _branches(nodes, "var")
    return _node("var", nodes, name, device, ddof=check_ddof(ddof, len(nodes)))


_ = builtins  # the builtins stay reachable as builtins.sum etc. inside this module
