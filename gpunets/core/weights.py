"""Keyword training arguments of machines, and sample weights in bare networks.

A machine passes its training arguments to ``fit`` positionally (``X``, ``y``)
and, given as keywords, by name::

    mach = gn.machine(Ridge(), X, y, sample_weight=w)     # fit(X, y, sample_weight=w)

A keyword argument is a node like any other (raw data is wrapped in a source
named after the keyword): it is an upstream dependency of the machine, it is
cut to the same rows as the other sources by ``fit(rows=...)``, and new data
in it retrain the machine.  The positional form ``gn.machine(Ridge(), X, y, w)``
also reaches ``sample_weight`` when the model's ``fit`` takes it third, as
scikit-learn's estimators do.

The sample weights of a machine (its ``sample_weight`` argument, by keyword
or by position) must have one value per training row.  The check runs when
the fit is planned, before anything trains, whenever both row counts are
known then (the weights and the first training argument are sources, or
operations of machines on them); otherwise right before that machine's fit.

>>> import numpy as np, gpunets as gn
>>> from sklearn.linear_model import Ridge
>>> X, y = np.arange(8.0).reshape(4, 2), np.arange(4.0)
>>> mach = gn.machine(Ridge(), X, y, sample_weight=np.array([1.0, 1.0, 2.0, 0.0]))
>>> mach
<Machine Ridge(X, y, sample_weight=sample_weight)>
>>> _ = mach.fit()
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from gpunets.compute.models import Resolved, cpu_fallback, is_cuml_estimator
from gpunets.core.nodes import AbstractNode, Node, Source, is_node
from gpunets.devices.rows import n_rows

__all__ = ["fit_parameters", "accepts_fit_keyword", "keyword_nodes", "add_fit_keyword", "weights_position", "check_weight_rows",
           "check_weight_values", "weight_rows_mismatch"]

WEIGHTS = "sample_weight"


def fit_parameters(model: Any) -> tuple[list[str], bool]:
    """The named parameters of ``model.fit`` (``self`` excluded) and whether it takes ``**kwargs``.

    >>> from sklearn.linear_model import Ridge
    >>> fit_parameters(Ridge())
    (['X', 'y', 'sample_weight'], False)
    """
    try:
        params = inspect.signature(model.fit).parameters.values()
    except (TypeError, ValueError):   # no signature (a builtin): accept anything
        return [], True
    names = [p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    return names, any(p.kind is p.VAR_KEYWORD for p in params)


def accepts_fit_keyword(model: Any, name: str) -> bool:
    """Whether ``model.fit`` takes the keyword ``name`` (by name, or through ``**kwargs``).

    >>> from sklearn.linear_model import Ridge
    >>> from sklearn.decomposition import PCA
    >>> accepts_fit_keyword(Ridge(), "sample_weight"), accepts_fit_keyword(PCA(), "sample_weight")
    (True, False)
    """
    names, var_kw = fit_parameters(model)
    return var_kw or name in names


def keyword_nodes(model: Any, keywords: Mapping[str, Any]) -> dict[str, AbstractNode]:
    """The nodes of a machine's keyword training arguments, checked against ``model.fit``.

    A keyword given None is left out (``fit`` takes its default), so ``network(X, y, sample_weight=None)``
    may pass its ``sample_weight`` on whether or not weights were given.

    Raises
    ------
    TypeError
        When ``model.fit`` takes no such keyword, or a value is neither a node nor data.
    """
    out: dict[str, AbstractNode] = {}
    cls = type(model).__name__
    for k, v in keywords.items():
        if v is None:
            continue
        if not accepts_fit_keyword(model, k):
            names, _ = fit_parameters(model)
            hint = (" It cannot learn from sample weights: drop the weights for this machine, or use a model "
                    "that takes them." if k == WEIGHTS else "")
            msg = (f"machine({cls}, ..., {k}=...): {cls}.fit takes no parameter {k!r}; its parameters are "
                   f"{names}.{hint}")
            raise TypeError(msg)
        if not is_node(v) and (callable(v) or isinstance(v, (str, bytes))):
            msg = (f"machine({cls}, ..., {k}=...) is {v!r} of type {type(v).__name__}: expected a node or data "
                   "(NumPy, pandas, CuPy or cuDF). Wrap data in gn.source(data) or pass a node.")
            raise TypeError(msg)
        out[k] = v if is_node(v) else Source(v, name=k)
    return out


def add_fit_keyword(m: Any, name: str, value: Any) -> None:
    """Give machine ``m`` one more keyword training argument (a composite routing its metadata).

    Only for a machine of a network being built: it is then fitted with ``name=value``.
    """
    if value is None:
        return
    if name in m.fit_keywords:
        msg = f"machine {m.label} already has the training argument {name}=; it cannot take a second one."
        raise ValueError(msg)
    (node,) = keyword_nodes(m.model, {name: value}).values()
    m.args = m.args + (node,)
    m.fit_keywords = m.fit_keywords + (name,)


def keywords_fallback(resolved: Resolved, model: Any, keywords: tuple[str, ...], what: str) -> Resolved:
    """``resolved``, or the CPU when its cuML twin's ``fit`` lacks one of ``keywords`` (the fallback policy applies).

    cuML twins do not all take what the scikit-learn model takes (cuML's random forests have no
    ``sample_weight``); the machine then trains ``model`` itself on the CPU, as for any other reason a
    GPU cannot run it.
    """
    if resolved.path != "cuml" or not keywords or is_cuml_estimator(model):
        return resolved
    missing = [k for k in keywords if not accepts_fit_keyword(resolved.estimator, k)]
    if not missing:
        return resolved
    reason = f"cuML's {type(resolved.estimator).__name__}.fit takes no {', '.join(missing)}"
    return cpu_fallback(model, resolved.device, reason, what=what)


def weights_position(m: Any) -> int | None:
    """The index in ``m.args`` of machine ``m``'s sample weights (keyword or positional), or None."""
    keywords = getattr(m, "fit_keywords", ())
    n_pos = len(m.args) - len(keywords)
    if WEIGHTS in keywords:
        return n_pos + keywords.index(WEIGHTS)
    names, _ = fit_parameters(m.model)
    i = names.index(WEIGHTS) if WEIGHTS in names else -1
    return i if 0 < i < n_pos else None


def _rows_known(x: Any, value_of: Callable[[Source], Any], depth: int = 0) -> tuple[int, str] | None:
    """Rows of node ``x`` known before training, with the source they come from (None: not known).

    A source's rows are its data's; an operation of a machine (``transform``, ``predict``...) keeps the
    rows of its first argument; a user function may change the rows, so its are not known.
    """
    if isinstance(x, Source):
        try:
            return n_rows(value_of(x)), x.label
        except (TypeError, KeyError):
            return None
    if isinstance(x, Node) and x.machine is not None and x.args and is_node(x.args[0]) and depth < 100:
        return _rows_known(x.args[0], value_of, depth + 1)
    return None


def weight_rows_mismatch(label: str, weights: str, n_weights: int, data: str, n_data: int) -> str:
    """The message for sample weights that do not have one value per training row."""
    return (f"machine {label}: its sample weights {weights!r} have {n_weights} values, but its training data "
            f"{data!r} have {n_data} rows; expected one weight per row. Hint: give the weights the rows of the "
            f"data (set both sources' data together, or select the same rows of both).")


def check_weight_rows(m: Any, value_of: Callable[[Source], Any]) -> tuple[int, str] | None:
    """Check machine ``m``'s sample weights against its training rows, where both are known now.

    ``value_of`` gives a source's data (all rows, so that ``fit(rows=...)`` cannot hide a mismatch).  Returns
    ``(position of the weights, their label)`` when the check has to wait for the values (the fit
    task makes it), None when there are no weights or the check is done.

    Raises
    ------
    ValueError
        When the weights and the training data have different numbers of rows.
    """
    i = weights_position(m)
    if i is None:
        return None
    w, x = m.args[i], m.args[0]
    label = w._short(1)
    nw, nx = _rows_known(w, value_of), _rows_known(x, value_of)
    if nw is None or nx is None:
        return i, label
    if nw[0] != nx[0]:
        raise ValueError(weight_rows_mismatch(m.label, nw[1], nw[0], nx[1], nx[0]))
    return None


def check_weight_values(spec: tuple[int, str, str] | None, values: tuple[Any, ...]) -> None:
    """The check of :func:`check_weight_rows` on the values, right before a fit (``spec``: position, labels)."""
    if spec is None:
        return
    i, weights, label = spec
    try:
        nw, nx = n_rows(values[i]), n_rows(values[0])
    except TypeError:   # a value without rows (a list...): the estimator checks it
        return
    if nw != nx:
        raise ValueError(weight_rows_mismatch(label, weights, nw, "its first argument", nx))

