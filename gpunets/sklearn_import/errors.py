"""scikit-learn's exceptions from a converted composition (issue 35 item 12).

Where a composition converted by :func:`gpunets.from_sklearn` fails as scikit-learn's own would, the caller
gets scikit-learn's exception: its class and its message, then one line saying where in the converted network
it happened (the step, by the original's nested name, and the operation). gpunets' own error, which names the
internal nodes, stays chained as ``__cause__``.

* :func:`used_columns` / :func:`check_columns`: the columns a leading ``ColumnTransformer`` fitted on a
  DataFrame reads, and scikit-learn's ``ValueError("columns are missing: {...}")`` when a DataFrame given to
  ``predict``/``transform`` lacks some (checked before anything runs, as ``ColumnTransformer.transform`` does).
* :func:`as_sklearn`: the exception a model raised inside the network, with where it happened.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from gpunets.base.exceptions import EvaluationError, FitError, GpunetsError

__all__ = ["as_sklearn", "check_columns", "used_columns"]

def used_columns(ct: Any, X: Any) -> tuple[str, ...] | None:
    """The names of the DataFrame ``X``'s columns that the ColumnTransformer ``ct`` reads (its non-dropped
    transformers' and, unless ``remainder="drop"``, the remainder's); None when they cannot be told.

    >>> import pandas as pd
    >>> from sklearn.compose import ColumnTransformer
    >>> from sklearn.preprocessing import StandardScaler
    >>> X = pd.DataFrame({"a": [1.0], "b": [2.0], "c": [3.0]})
    >>> sorted(used_columns(ColumnTransformer([("s", StandardScaler(), ["a"]), ("d", "drop", ["b"])]), X))
    ['a']
    >>> sorted(used_columns(ColumnTransformer([("s", StandardScaler(), ["a"]), ("d", "drop", ["b"])],
    ...                                       remainder="passthrough"), X))
    ['a', 'c']
    """
    from sklearn.utils._indexing import _get_column_indices

    names = [str(c) for c in getattr(X, "columns", ())]
    if not names:
        return None
    specified: set[int] = set()
    used: set[int] = set()
    try:
        for _, trans, cols in ct.transformers:
            idx = _get_column_indices(X, cols(X) if callable(cols) else cols)
            specified.update(idx)
            if not (isinstance(trans, str) and trans == "drop"):
                used.update(idx)
    except Exception:  # noqa: BLE001 - a selection scikit-learn would refuse: its own fit says so
        return None
    if not (isinstance(ct.remainder, str) and ct.remainder == "drop"):
        used |= set(range(len(names))) - specified
    return tuple(names[i] for i in sorted(used))   # plain data: kept by gn.save in any format


def check_columns(used: tuple[str, ...] | None, X: Any) -> None:
    """scikit-learn's ``ColumnTransformer.transform`` check: every column read at fit is in the DataFrame ``X``.

    >>> import pandas as pd
    >>> check_columns(("a", "b"), pd.DataFrame({"a": [1.0]}))
    Traceback (most recent call last):
    ...
    ValueError: columns are missing: {'b'}
    """
    if used is None or not hasattr(X, "columns"):
        return
    diff = set(used) - {str(c) for c in X.columns}
    if diff:
        raise ValueError(f"columns are missing: {diff}")


def _step(err: BaseException) -> str | None:
    """The machine (a part of the original, by its nested name) or node a run's error names."""
    text = str(err)
    for pattern in (r"^Machine (\S+) failed to fit", r"\(machine ([^)]+)\) failed", r"^Evaluating node ([^\[( ]+)"):
        m = re.search(pattern, text)
        if m:
            return m.group(1)
    return None


def as_sklearn(err: BaseException, op: str, composition: Any) -> BaseException | None:
    """The exception to raise for ``err`` (a :class:`FitError` or :class:`EvaluationError` of a converted
    ``composition``'s network, during ``op``): the model's own exception (its class, its message), then
    where it happened; None when it cannot be rebuilt (the caller re-raises ``err``).

    >>> from gpunets.base.exceptions import wrap_exception
    >>> original = ValueError("Found unknown categories")
    >>> e = wrap_exception(EvaluationError, "Evaluating node transform(pre__cat, X) (machine pre__cat) failed "
    ...                    "(ValueError: Found unknown categories)", original)
    >>> e.__cause__ = original
    >>> out = as_sklearn(e, "predict", object())
    >>> type(out).__name__, str(out).splitlines()
    ('ValueError', ['Found unknown categories', "Where: step 'pre__cat' of the converted object, in predict."])
    """
    if not isinstance(err, (FitError, EvaluationError)):
        return None
    original = getattr(err, "_gn_original", None) or err.__cause__
    if not isinstance(original, Exception) or isinstance(original, GpunetsError):
        return None
    args = original.args
    if not args or not isinstance(args[0], str) or str(original) != args[0]:   # KeyError quotes: keep ours
        return None
    step = _step(err)
    where = f"step {step!r} of " if step else ""
    msg = f"{args[0]}\nWhere: {where}the converted {type(composition).__name__}, in {op}."
    try:
        new = copy.copy(original)
        new.args = (msg, *args[1:])
        if str(new) != msg:
            return None
    except Exception:  # noqa: BLE001 - an exception that cannot be copied: gpunets' own error is raised
        return None
    return new
