"""``get_feature_names_out`` of a converted composition, from its fitted leaves (scikit-learn's rules)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpunets.compose.stacking import SUMMARY
from gpunets.sklearn_import._base import converts_as, is_drop, is_passthrough, join

__all__ = ["feature_names_out"]


def feature_names_out(est: Any, path: str, names_in: np.ndarray, fitted: Callable[[str], Any],
                      parts: dict[str, dict[str, Any]]) -> np.ndarray:
    """Output feature names of ``est`` (at ``path``) given its input names; ``fitted(name)`` is a fitted leaf."""
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import FeatureUnion, Pipeline

    if converts_as(est, Pipeline):
        names = names_in
        for name, step in est.steps:
            if not is_passthrough(step):
                names = feature_names_out(step, join(path, name), names, fitted, parts)
        return names
    if converts_as(est, ColumnTransformer):
        out = []
        for name, trans, idx in parts[path or "(root)"]["columns"]:
            sub_in = np.asarray(names_in, dtype=object)[idx]
            if is_passthrough(trans):
                out.append((name, sub_in))
            else:
                out.append((name, feature_names_out(trans, join(path, name), sub_in, fitted, parts)))
        if not out:
            return np.array([], dtype=object)
        return est._add_prefix_for_feature_names_out(out)
    if converts_as(est, FeatureUnion):
        out = []
        for name, trans in est.transformer_list:
            if is_drop(trans):
                continue
            if isinstance(trans, str) and trans == "passthrough":
                out.append((name, np.asarray(names_in, dtype=object)))
            else:
                out.append((name, feature_names_out(trans, join(path, name), names_in, fitted, parts)))
        return est._add_prefix_for_feature_names_out(out)
    from sklearn.ensemble import StackingClassifier, StackingRegressor, VotingClassifier, VotingRegressor

    if converts_as(est, VotingRegressor, VotingClassifier, StackingRegressor, StackingClassifier):
        return _ensemble_names(est, path, names_in, fitted)
    leaf = fitted(path or type(est).__name__.lower())
    get = getattr(leaf, "get_feature_names_out", None)
    if get is None:
        msg = f"Estimator {type(est).__name__} at {path or 'the top'!r} does not provide get_feature_names_out."
        raise AttributeError(msg)
    return get(names_in)


def _ensemble_names(est: Any, path: str, names_in: np.ndarray, fitted: Callable[[str], Any]) -> np.ndarray:
    """A voting ensemble's or a stack's names, by scikit-learn's own ``get_feature_names_out``.

    It runs on a copy of the original holding what that method reads of a fitted ensemble: the number of input
    features (through a stand-in first member), the label encoder of a voting classifier (``<labels>``) and a stack's output width per member
    (from the stack's cross-validation summary).
    """
    import copy
    from types import SimpleNamespace

    from sklearn.ensemble import StackingClassifier, StackingRegressor, VotingClassifier


    view = copy.copy(est)
    view.estimators_ = [SimpleNamespace(n_features_in_=len(names_in))]   # n_features_in_ reads its first member
    if converts_as(est, VotingClassifier):
        view.le_ = fitted(join(path, "<labels>") if path else "votingclassifier<labels>")
        view.classes_ = view.le_.classes_
    if converts_as(est, StackingRegressor, StackingClassifier):
        summary = fitted(join(path, SUMMARY) if path else SUMMARY).summary_
        view._n_feature_outs = [int(w) for w in summary[:, 0]]
    return type(est).get_feature_names_out(view, names_in)
