"""Fitted scikit-learn estimators built from the moments: the one-pass path's refit of the best candidate.

The rules of :mod:`gpunets.tuning.onepass` fit each step from moments; :func:`attributes` turns a rule's results
into the attributes scikit-learn's own ``fit`` leaves on that step (``mean_``, ``var_``, ``scale_``,
``n_samples_seen_``; ``components_``, ``explained_variance_``, ``singular_values_``, ``noise_variance_``...;
``coef_``, ``intercept_``, ``solver_``, ``rank_``, ``singular_``; ``n_features_in_`` and ``feature_names_in_``),
with scikit-learn's types and shapes, and :func:`build` sets them on an unfitted estimator (a step or a
``Pipeline``'s steps), so that the best candidate's refit on all rows is d×d work on the whole data's moments
(the sum of the folds' or of the chunks').  :func:`differs` compares two fitted estimators attribute by
attribute (the self-check of :mod:`gpunets.tuning.onepass_search`: the same attribute names, types, shapes and
dtypes, and the values to :data:`~gpunets.tuning.onepass.TOL`).

>>> import numpy as np
>>> from sklearn.linear_model import Ridge
>>> differs(Ridge().fit(np.eye(3), [1.0, 2.0, 3.0]), Ridge().fit(np.eye(3), [1.0, 2.0, 3.0])) is None
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gpunets.tuning import onepass
from gpunets.tuning.onepass import Decline

__all__ = ["attributes", "build", "differs", "fitted_steps"]


def _scaler(est: Any, raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if est.with_mean or est.with_std:
        out["mean_"] = np.array(raw["mean_"], dtype=np.float64)
        out["var_"] = np.array(raw["var_"], dtype=np.float64) if est.with_std else None
        out["n_samples_seen_"] = np.float64(raw["_n"])
    else:   # scikit-learn counts the rows (an int) and keeps no statistics
        out["mean_"] = out["var_"] = None
        out["n_samples_seen_"] = np.int64(raw["_rows"])
    out["scale_"] = np.array(raw["scale_"], dtype=np.float64) if est.with_std else None
    return out


def _pca(est: Any, raw: dict[str, Any]) -> dict[str, Any]:
    vals, rows, k = raw["_vals"], int(raw["_rows"]), int(raw["n_components_"])
    asked = est.n_components
    if isinstance(asked, (float, np.floating)):
        n_components: Any = np.int64(k)          # searchsorted's result, + 1
    elif asked is None:
        n_components = k
    else:
        n_components = type(asked)(k)
    noise = np.float64(np.mean(vals[k:])) if k < min(raw["_k_in"], rows) else 0.0
    return {"_fit_svd_solver": raw["_solver"], "mean_": np.array(raw["mean_"], dtype=np.float64),
            "components_": np.array(raw["components_"], dtype=np.float64),
            "explained_variance_": np.array(raw["explained_variance_"], dtype=np.float64),
            "explained_variance_ratio_": np.array(raw["explained_variance_ratio_"], dtype=np.float64),
            "singular_values_": np.sqrt(vals[:k] * (rows - 1)), "noise_variance_": noise, "n_samples_": rows,
            "n_components_": n_components}


def _linear(est: Any, raw: dict[str, Any], flat: bool) -> dict[str, Any]:
    from sklearn.linear_model import LinearRegression

    coef = np.array(raw["coef_"], dtype=np.float64)                 # (t, k)
    # a 1-D target, and Ridge's one-column 2-D target (its solvers ravel one target's coefficients): (k,)
    one = flat or (len(coef) == 1 and type(est) is not LinearRegression)
    out: dict[str, Any] = {"coef_": coef[0].copy() if one else coef}
    if est.fit_intercept:
        icp = np.asarray(raw["intercept_"], dtype=np.float64)
        out["intercept_"] = np.float64(icp[0]) if flat else icp.copy()
    else:
        out["intercept_"] = 0.0
    if type(est) is LinearRegression:
        # scipy's lstsq(cond=tol) of the (weighted, centred) rows: their singular values, the rank above tol·s₀
        Uu = raw["_Uu"]
        s = np.sqrt(np.maximum(np.linalg.eigvalsh(Uu)[::-1], 0.0))
        if s.size and s[0] > 0:
            ratio = s / s[0]
            cut = float(est.tol)
            if np.any((ratio > cut / 100) & (ratio < cut * 100) & (ratio > 0)):
                raise Decline("linearregression: a singular value near tol·s₀ (lstsq's rank may go either way)")
            rank = int(np.count_nonzero(ratio > cut))
        else:
            rank = 0
        out["rank_"] = rank
        out["singular_"] = s
    else:
        out["solver_"] = "svd" if est.solver == "svd" else "cholesky"
        out["n_iter_"] = None
    return out


def attributes(est: Any, raw: dict[str, Any], flat: bool) -> dict[str, Any]:
    """scikit-learn's fitted attributes of ``est`` (a ``StandardScaler``, ``PCA``, ``Ridge`` or
    ``LinearRegression``) from its rule's results ``raw`` (:class:`~gpunets.tuning.onepass.State`'s
    ``fitted`` entry); ``flat``: a 1-D target.  Raises :class:`~gpunets.tuning.onepass.Decline` where an
    attribute cannot be promised (``rank_`` at lstsq's cut)."""
    name = type(est).__name__
    if name == "StandardScaler":
        out = _scaler(est, raw)
    elif name == "PCA":
        out = _pca(est, raw)
    else:
        out = _linear(est, raw, flat)
    out["n_features_in_"] = int(raw["_k_in"])
    return out


def fitted_steps(est: Any) -> list[Any]:
    """The steps of ``est`` the rules fit, in order (a Pipeline's, less passthrough; else ``[est]``)."""
    steps = getattr(est, "steps", None)
    if steps is None:
        return [est]
    return [s for _, s in steps if s is not None and not (isinstance(s, str) and s == "passthrough")]


def build(est: Any, state: onepass.State, flat: bool, names: Any = None) -> Any:
    """Set on ``est`` (unfitted: a step, or a Pipeline whose steps are set) the attributes scikit-learn's fit
    would leave, from the rules' results ``state`` (``fit_chain``'s); ``names``: the rows' feature names
    (``feature_names_in_`` of the first step), or None.  Every attribute is computed before any is set."""
    steps = fitted_steps(est)
    if len(steps) != len(state.fitted):
        raise Decline("the fitted steps do not match the plan")
    attrs = [attributes(s, raw, flat) for s, raw in zip(steps, state.fitted)]
    if names is not None:
        attrs[0]["feature_names_in_"] = names
    for s, a in zip(steps, attrs):
        for k, v in a.items():
            setattr(s, k, v)
    return est


def _same(a: Any, b: Any, floor: float) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.kind not in "fc":
            return bool(np.array_equal(a, b))
    elif not isinstance(a, (float, np.floating)):
        return bool(a == b) if not hasattr(a, "get_params") else differs(a, b) is None
    x, y = np.ravel(np.asarray(a, dtype=np.float64)), np.ravel(np.asarray(b, dtype=np.float64))
    scale = max(float(np.max(np.abs(y), initial=0.0)), floor)
    return bool(np.max(np.abs(x - y), initial=0.0) <= onepass.TOL * scale)


def differs(ours: Any, theirs: Any) -> str | None:
    """None if ``ours`` carries the same attributes as ``theirs`` (names, types, shapes, dtypes) with values
    equal to :data:`~gpunets.tuning.onepass.TOL` relative to ``theirs``' largest entry (1 for a mean, which
    is ~0 for centred columns); else the first difference."""
    if type(ours) is not type(theirs):
        return f"{type(ours).__name__} against {type(theirs).__name__}"
    if hasattr(theirs, "steps"):
        if [n for n, _ in ours.steps] != [n for n, _ in theirs.steps]:
            return "the steps' names"
        for (_, a), (_, b) in zip(ours.steps, theirs.steps):
            why = differs(a, b) if hasattr(b, "get_params") else (None if a == b else "a passthrough step")
            if why is not None:
                return why
        skip = {"steps"}
    else:
        skip = set()
    va, vb = vars(ours), vars(theirs)
    if set(va) != set(vb):
        return f"{type(theirs).__name__}'s attributes {sorted(set(va) ^ set(vb))} (present on one side only)"
    for k in sorted(set(vb) - skip):
        floor = 1.0 if k == "mean_" else 1e-300
        if not _same(va[k], vb[k], floor):
            return f"{type(theirs).__name__}.{k} differs from scikit-learn's"
    return None
