"""Voting and stacking ensembles: one branch per member, combined by a gpunets kernel.

* ``VotingRegressor``: ``gn.mean`` of the members' predictions (weighted: ``np.average``'s rule);
* ``VotingClassifier``: members trained on label-encoded targets (a ``LabelEncoder``
  machine), hard voting with ``gn.vote`` (weighted: ``bincount`` with weights, ties
  to the smallest label as scikit-learn), soft voting with ``gn.mean`` of the
  probabilities, then decoded;
* ``StackingRegressor`` / ``StackingClassifier``: the network of gpunets' own
  stacks (:mod:`gpunets.compose.stacking`), one branch per (member, fold), inlined.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.preprocessing import LabelEncoder

from gpunets.base.saved import saved_operation
from gpunets.compose import stacking
from gpunets.core import ops
from gpunets.core.graph import upstream_machines
from gpunets.core.machines import machine
from gpunets.core.nodes import Source, node
from gpunets.devices.data import array_namespace, device_of, to_device
from gpunets.sklearn_import._base import Context, build, is_drop, join, leaf

__all__ = ["build_stacking", "build_voting_classifier", "build_voting_regressor"]


def _members(est: Any, path: str) -> tuple[list[str], list[Any], list[float] | None]:
    """Kept members and their weights; scikit-learn's validation errors before anything is built."""
    est._validate_estimators()  # scikit-learn's checks: names, at least one estimator, kinds
    if est.weights is not None and len(est.weights) != len(est.estimators):
        msg = (f"Number of `estimators` and weights must be equal; got {len(est.weights)} weights, "
               f"{len(est.estimators)} estimators")
        raise ValueError(msg)
    kept = [(n, e) for n, e in est.estimators if not is_drop(e)]
    weights = None
    if est.weights is not None:
        weights = [float(w) for (_, e), w in zip(est.estimators, est.weights) if not is_drop(e)]
    return [n for n, _ in kept], [e for _, e in kept], weights


# --- node operations ----------------------------------------------------------------------------------------

def _xp(*values: Any) -> Any:
    """The array namespace of the values (NumPy for host data, CuPy's where the members predicted on a GPU)."""
    return array_namespace(values[0])


def _concat(xp: Any, parts: list[Any], axis: int) -> Any:
    concat = getattr(xp, "concat", None) or xp.concatenate
    return concat(parts, axis=axis)


@saved_operation
def columns_of(*preds: Any) -> Any:
    """Predictions side by side, one column per member (``_predict``'s ``np.asarray(...).T``), on their device."""
    xp = _xp(*preds)
    return xp.stack([xp.asarray(p) for p in preds], axis=1)


@saved_operation
def weighted_vote(weights: tuple[float, ...], *preds: Any) -> Any:
    """Weighted majority of encoded labels; ties go to the smallest label (scikit-learn's rule).

    Computed on the host (NumPy's ``bincount``), returned on the members' device.
    """
    P = np.asarray([np.asarray(to_device(p, "cpu")) for p in preds]).T
    voted = np.apply_along_axis(lambda x: np.argmax(np.bincount(x, weights=weights)), axis=1, arr=P)
    return to_device(voted, device_of(preds[0]))


@saved_operation
def argmax_rows(P: Any) -> Any:
    """Index of the largest column per row (on the device of ``P``)."""
    xp = _xp(P)
    return xp.argmax(xp.asarray(P), axis=1)


@saved_operation
def hstack_arrays(*parts: Any) -> Any:
    """``np.hstack`` of the parts, on their device."""
    xp = _xp(*parts)
    arrays = [xp.asarray(p) for p in parts]
    return _concat(xp, arrays, axis=1 if arrays[0].ndim > 1 else 0)


# --- voting -------------------------------------------------------------------------------------------------

def build_voting_regressor(est: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    ctx.note(path, "votingregressor", est)
    names, members, weights = _members(est, path)
    preds = [build(m, X, y, join(path, n), ctx)["predict"] for n, m in zip(names, members)]
    where = path or "votingregressor"
    return {"predict": ops.mean(*preds, weights=weights, name=f"{where}[mean]"),
            "transform": node(columns_of, *preds, name=f"{where}[columns]")}


def build_voting_classifier(est: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    ctx.note(path, "votingclassifier", est)
    if est.voting not in ("soft", "hard"):
        msg = f"Voting must be 'soft' or 'hard'; got (voting={est.voting!r})"
        raise ValueError(msg)
    names, members, weights = _members(est, path)
    where = path or "votingclassifier"
    le = machine(LabelEncoder(), y, name=join(path, "<labels>") if path else "votingclassifier<labels>")
    y_enc = le.transform(y)
    built = [build(m, X, y_enc, join(path, n), ctx) for n, m in zip(names, members)]
    out: dict[str, Any] = {}
    if est.voting == "soft":
        missing = [n for n, b in zip(names, built) if "predict_proba" not in b]
        if missing:
            msg = f"Underlying estimator(s) {missing} do not implement predict_proba, required by voting='soft'."
            raise AttributeError(msg)
        probas = [b["predict_proba"] for b in built]
        avg = ops.mean(*probas, weights=weights, name=f"{where}[mean proba]")
        out["predict_proba"] = avg
        out["predict"] = le.inverse_transform(node(argmax_rows, avg, name=f"{where}[argmax]"))
        out["transform"] = (node(hstack_arrays, *probas, name=f"{where}[probas]") if est.flatten_transform
                            else node(_stack_probas, *probas, name=f"{where}[probas]"))
    else:
        preds = [b["predict"] for b in built]
        voted = (ops.vote(*preds, name=f"{where}[vote]") if weights is None
                 else node(weighted_vote, tuple(weights), *preds, name=f"{where}[weighted vote]"))
        out["predict"] = le.inverse_transform(voted)
        out["transform"] = node(columns_of, *preds, name=f"{where}[columns]")
    return out


@saved_operation
def _stack_probas(*probas: Any) -> Any:
    xp = _xp(*probas)
    return xp.stack([xp.asarray(p) for p in probas], axis=0)


# --- stacking -------------------------------------------------------------------------------------------------

def encode_labels(classes: np.ndarray, y: Any) -> Any:
    return np.searchsorted(classes, np.asarray(y))


def build_stacking(est: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    from sklearn.base import is_classifier

    if not (isinstance(y, Source) and y.data is not None):
        return leaf(est, X, y, path, ctx, kind="opaque",
                    note="a stack trained on a transformed target runs as one opaque machine.")
    ctx.note(path, "stacking", est)
    kw = {"final_estimator": est.final_estimator, "cv": est.cv, "passthrough": est.passthrough}
    if is_classifier(est):
        gs = stacking.StackingClassifier(est.estimators, stack_method=est.stack_method, **kw)
        y_data = np.asarray(y.data)
        le = LabelEncoder().fit(y_data)
        key = ("stack-y", path, id(y))
        y_src = ctx.cache.get(key)
        if y_src is None or not np.array_equal(y_src.data, le.transform(y_data)):
            y_src = Source(le.transform(y_data), name=f"{path or 'stack'}[y encoded]")
            ctx.cache[key] = y_src
        gs.classes_ = le.classes_
        gs._label_encoder = le
        y_in = y_src
    else:
        gs = stacking.StackingRegressor(est.estimators, **kw)
        y_in = y
    gs._gn_check_params(None, None)
    before = {m._uid for m in upstream_machines([X])}
    outs = gs.network(X, y_in, sample_weight=ctx.fit_params.get(path, {}).get("sample_weight"))
    for m in upstream_machines(list(outs.values())):
        if m._uid in before:
            continue
        m.name = join(path, m.name) if path else m.name
        base = m.name.split("[", 1)[0]
        short = base[len(path) + 2:] if path else base
        ctx.leaves[m.name] = est.final_estimator if short == "final_estimator" else dict(est.estimators).get(short)
        ctx.note(m.name, "stack member", m.model)
    return dict(outs)
