"""The mark of gpunets' own functions that its saved networks call (the base layer: imports nothing of gpunets).

:func:`gpunets.load` trusts gpunets' classes by default, but of its functions only those marked here: a
function named in a file is called when the loaded network runs.  A function that looks up or calls what
its arguments name (``apply_op("predict", est, X)`` calls ``est.predict``; ``call_fn(f, x)`` calls ``f``)
declares those arguments, so that the loader, not the file, decides what a loaded network may call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["saved_operation", "ARGUMENT_KINDS"]

#: What a checked argument of a dispatching operation may be, and what ``gn.load`` checks it against:
#: ``"operation"`` a machine operation by name (``predict``, ``transform``, ...: ``gpunets.core.machines.OPERATIONS``),
#: ``"operations"`` a tuple of them, ``"kernel"`` a kernel of :mod:`gpunets.kernels` by name
#: (``gpunets.core.ops.KERNELS``), ``"parameter"`` a hyperparameter name (an identifier, not private),
#: ``"callable"`` a function or callable object the operation calls (trusted, and not itself dispatching).
ARGUMENT_KINDS = ("operation", "operations", "kernel", "parameter", "callable")


def saved_operation(fn: Any = None, *, checked: Mapping[int, str] | None = None) -> Any:
    """Mark one of gpunets' own functions as an operation its networks use, so ``gn.load`` trusts it by default.

    A ``format="skops"`` file (or a pickle loaded with ``trusted=``) names the functions its nodes call; gpunets'
    classes are trusted, but of its functions only those marked here (and
    :data:`gpunets.persistence.persist.TRUSTED_TYPES`): a function is called when the loaded network runs.

    Parameters
    ----------
    fn : function
        The operation.
    checked : dict of int to str, optional
        A *dispatching* operation's arguments (by position) that name what it looks up or calls, each with
        its kind (:data:`ARGUMENT_KINDS`).  In a loaded file such an operation may only be a node's
        operation (never a value handed to another function), and those arguments must be written in the
        file (not computed by another node) and of their kind: ``gn.load`` refuses the file otherwise,
        before anything in it runs.

    Examples
    --------
    >>> @saved_operation(checked={0: "operation"})
    ... def apply(op, est, X):
    ...     return getattr(est, op)(X)
    >>> apply.__gn_checked_arguments__
    {0: 'operation'}
    """
    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        if checked:
            bad = {k: v for k, v in checked.items() if v not in ARGUMENT_KINDS or not isinstance(k, int)}
            if bad:
                msg = f"saved_operation(checked=...): {bad} are not positions and kinds of {ARGUMENT_KINDS}."
                raise ValueError(msg)
            f.__gn_checked_arguments__ = dict(checked)  # type: ignore[attr-defined]
        f.__gn_saved_operation__ = True  # type: ignore[attr-defined]
        return f

    return mark if fn is None else mark(fn)
