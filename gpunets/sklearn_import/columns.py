"""``ColumnTransformer`` and ``FeatureUnion``: one branch per part, joined by a stacking machine.

Column selections (names, indices, boolean masks, callables,
``make_column_selector``) are resolved on the training data when the network
is built, with scikit-learn's own ``_get_column_indices``: a selection of
columns the data lacks raises scikit-learn's error before anything trains.
At prediction a DataFrame is selected by column name (as scikit-learn does),
other input by position.  The parts are joined by a small machine that
decides at fit, like scikit-learn, whether the output is sparse
(``sparse_threshold``) and stacks the parts the same way afterwards.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator

from gpunets.base.saved import saved_operation
from gpunets.core.machines import machine
from gpunets.core.nodes import node
from gpunets.sklearn_import._base import Context, build, is_drop, is_passthrough, join

__all__ = ["ColumnStack", "build_column_transformer", "build_feature_union", "scale", "select_columns"]


# --- node operations (module level so networks pickle) ------------------------------------------------------

@saved_operation
def select_columns(X: Any, key: Any, labels: Any) -> Any:
    """Columns ``key`` of ``X``; by ``labels`` (names seen at fit) when ``X`` is a DataFrame."""
    from sklearn.utils._indexing import _safe_indexing

    if labels is not None and hasattr(X, "columns"):
        return _safe_indexing(X, labels, axis=1)
    return _safe_indexing(X, key, axis=1)


@saved_operation
def scale(weight: float, X: Any) -> Any:
    """``X * weight`` (a transformer weight)."""
    return X * weight


@saved_operation
def no_columns(X: Any) -> Any:
    """An empty ``(n_samples, 0)`` array: every part of the ColumnTransformer is dropped."""
    from sklearn.utils.validation import _num_samples

    return np.zeros((_num_samples(X), 0))


class ColumnStack(BaseEstimator):
    """Stacks the parts' outputs side by side as scikit-learn's ColumnTransformer / FeatureUnion do.

    ``fit(*parts)`` decides, from the training outputs, whether the result is
    sparse: for a ColumnTransformer (``sparse_threshold`` set) when some part is
    sparse and the overall density is below ``sparse_threshold``; for a
    FeatureUnion (``sparse_threshold=None``) whenever some part is sparse.

    ``output`` is the original's ``set_output(transform=...)`` setting (``None``:
    scikit-learn's global ``transform_output``).  With ``"pandas"`` or
    ``"polars"``, parts that are DataFrames are joined as a DataFrame whose
    columns carry the original's names (``names``: the parts' names, prefixed
    as ``verbose_feature_names_out`` says), as scikit-learn's set_output does.
    """

    def __init__(self, sparse_threshold: float | None = 0.3, names: tuple[str, ...] = (),
                 verbose_feature_names_out: Any = True, output: str | None = None) -> None:
        self.sparse_threshold = sparse_threshold
        self.names = names
        self.verbose_feature_names_out = verbose_feature_names_out
        self.output = output

    def fit(self, *Xs: Any) -> ColumnStack:
        from scipy import sparse

        if any(sparse.issparse(X) for X in Xs):
            if self.sparse_threshold is None:
                self.sparse_output_ = True
            else:
                nnz = sum(X.nnz if sparse.issparse(X) else X.shape[0] * X.shape[1] for X in Xs)
                total = sum(X.shape[0] * X.shape[1] for X in Xs)
                self.sparse_output_ = bool(nnz / total < self.sparse_threshold)
        else:
            self.sparse_output_ = False
        return self

    def transform(self, *Xs: Any) -> Any:
        from scipy import sparse
        from sklearn.utils.validation import check_array

        out = self._container(Xs)
        if out is not None:
            return out
        if self.sparse_threshold is None:  # FeatureUnion: sparse whenever a part is
            if any(sparse.issparse(X) for X in Xs):
                return self._dense_only(sparse.hstack(Xs).tocsr())
            return np.hstack(Xs)
        if self.sparse_output_:
            try:
                converted = [check_array(X, accept_sparse=True, ensure_all_finite=False) for X in Xs]
            except ValueError as e:
                msg = "For a sparse output, all columns should be a numeric or convertible to a numeric."
                raise ValueError(msg) from e
            return self._dense_only(sparse.hstack(converted).tocsr())
        return np.hstack([X.toarray() if sparse.issparse(X) else X for X in Xs])

    def _config(self) -> str:
        from sklearn import get_config

        return self.output or get_config()["transform_output"]

    def _dense_only(self, out: Any) -> Any:
        config = self._config()
        if config != "default":
            msg = ("The transformer outputs a scipy sparse matrix. Try to set the transformer output to a dense "
                   f"array or disable {config.capitalize()} output with set_output(transform='default').")
            raise ValueError(msg)
        return out

    def _container(self, Xs: tuple[Any, ...]) -> Any:
        """The joined DataFrame when set_output asks for one and every part is one; else ``None``."""
        from copy import copy

        from scipy import sparse
        from sklearn.utils._set_output import ADAPTERS_MANAGER

        config = self._config()
        if config == "default" or any(sparse.issparse(X) for X in Xs):
            return None
        if self.sparse_threshold is not None and getattr(self, "sparse_output_", False):
            return None
        adapter = ADAPTERS_MANAGER.adapters[config]
        if not Xs or not all(adapter.is_supported_container(X) for X in Xs) or len(self.names) != len(Xs):
            return None
        columns = self._prefixer()._add_prefix_for_feature_names_out(
            [(name, np.asarray(X.columns, dtype=object)) for name, X in zip(self.names, Xs)])
        parts = [adapter.rename_columns(copy(X), [f"{i}_{j}" for j in range(X.shape[1])]) for i, X in enumerate(Xs)]
        return adapter.rename_columns(adapter.hstack(parts), list(columns))

    def _prefixer(self) -> Any:
        from sklearn.compose import ColumnTransformer
        from sklearn.pipeline import FeatureUnion

        if self.sparse_threshold is None:
            return FeatureUnion([], verbose_feature_names_out=self.verbose_feature_names_out)
        return ColumnTransformer([], verbose_feature_names_out=self.verbose_feature_names_out)


def _weighted(Xt: Any, weight: Any, name: str) -> Any:
    return Xt if weight is None else node(scale, weight, Xt, name=f"{name}*{weight}")


def _join(parts: list[Any], sparse_threshold: float | None, X: Any, path: str, ctx: Context,
          kind: str, owner: Any, names: list[str]) -> Any:
    if not parts:
        return node(no_columns, X, name=f"{path or kind}[no columns]")
    output = getattr(owner, "_sklearn_output_config", {}).get("transform")
    verbose = getattr(owner, "verbose_feature_names_out", True)
    stack = machine(ColumnStack(sparse_threshold, tuple(names), verbose, output), *parts,
                    name=join(path, "<stack>") if path else f"{kind}<stack>")
    return stack._operation("transform", *parts)


# --- ColumnTransformer ------------------------------------------------------------------------------------

def _resolve(ct: Any, X_train: Any) -> list[tuple[str, Any, Any, Any, list[int]]]:
    """``(name, transformer, key, labels, indices)`` per part, remainder included, as sklearn resolves them."""
    from sklearn.compose._column_transformer import _check_X
    from sklearn.utils._indexing import _determine_key_type, _get_column_indices

    X = _check_X(X_train)
    names = getattr(X, "columns", None)
    names = np.asarray(names, dtype=object) if names is not None else None
    parts = []
    seen: set[int] = set()
    for name, trans, cols in ct.transformers:
        key = cols(X) if callable(cols) else cols
        idx = list(_get_column_indices(X, key))
        seen.update(idx)
        labels = None
        if names is not None:
            labels = names[idx][0] if np.isscalar(key) and len(idx) == 1 else list(names[idx])
        parts.append((name, trans, key, labels, idx))
    n_features = X.shape[1]
    remaining = sorted(set(range(n_features)) - seen)
    if remaining:
        try:
            kinds = {_determine_key_type(c) for (*_, c) in ct.transformers}
            dtype = next(iter(kinds)) if len(kinds) == 1 else "int"
        except ValueError:
            dtype = "int"
        if dtype == "str" and names is not None:
            key: Any = list(names[remaining])
        elif dtype == "bool":
            key = [i in remaining for i in range(n_features)]
        else:
            key = remaining
        labels = list(names[remaining]) if names is not None else None
        parts.append(("remainder", ct.remainder, key, labels, remaining))
    return parts


def build_column_transformer(ct: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    from sklearn.compose._column_transformer import _is_empty_column_selection

    ctx.note(path, "columntransformer", ct)
    ct._validate_transformers()
    X_train = ctx.data if X is ctx.root_X else None
    if X_train is None:
        msg = (f"ColumnTransformer at {path or 'the top'} follows a step that transforms the data, so its columns "
               "can only be resolved once that step is fitted; gpunets converts a ColumnTransformer only where "
               "it receives the composite's input. Hint: put the ColumnTransformer first in the Pipeline.")
        raise ValueError(msg)
    weights = ct.transformer_weights or {}
    parts = []
    active = []
    for name, trans, key, labels, idx in _resolve(ct, X_train):
        if is_drop(trans) or _is_empty_column_selection(key):
            continue
        active.append((name, trans, idx))
        sub = join(path, name)
        Xs = node(select_columns, X, key, labels, name=f"{sub}[columns]")
        if is_passthrough(trans):
            Xt = Xs
        else:
            Xt = build(trans, Xs, y, sub, ctx)["transform"]
        parts.append(_weighted(Xt, weights.get(name), sub))
    ctx.parts[path or "(root)"]["columns"] = active
    return {"transform": _join(parts, ct.sparse_threshold, X, path, ctx, "columntransformer", ct,
                               [name for name, _, _ in active])}


# --- FeatureUnion -------------------------------------------------------------------------------------------

def build_feature_union(fu: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    ctx.note(path, "featureunion", fu)
    fu._validate_transformers()
    weights = fu.transformer_weights or {}
    parts = []
    names = []
    for name, trans in fu.transformer_list:
        if is_drop(trans):
            continue
        names.append(name)
        sub = join(path, name)
        Xt = X if (isinstance(trans, str) and trans == "passthrough") else build(trans, X, y, sub, ctx)["transform"]
        parts.append(_weighted(Xt, weights.get(name), sub))
    if not parts:
        return {"transform": node(no_columns, X, name=f"{path or 'featureunion'}[no columns]")}
    return {"transform": _join(parts, None, X, path, ctx, "featureunion", fu, names)}
