"""Linear pipelines fitted and scored from the moments of the data: the statistics rules of the one-pass path.

Every step of ``StandardScaler → (PCA) → Ridge / LinearRegression``, and its r², MSE, RMSE or explained-variance
score, is a function of a few moments of the rows: their (weighted) count, the column sums and the Gram matrix of
``[X, y]``.  :mod:`gpunets.tuning.onepass_search` computes those once per fold (one pass over the rows); this module
fits each candidate from them, as scikit-learn's fit would, with d×d work only:

* each step maps its input affinely, ``u = A x + b``, so the moments of any step's input follow from the rows' own
  (``A C Aᵀ``), and the whole pipeline predicts ``ŷ = Wᵀx + c``;
* :class:`ScalerRule`: scikit-learn's ``StandardScaler`` (weighted mean and population variance, a constant
  column scaled by 1);
* :class:`PCARule`: ``PCA`` as its ``covariance_eigh`` solver computes it (the eigendecomposition of the
  covariance, eigenvalues clipped at 0, ``svd_flip``'s signs), which is also what ``"full"`` gives in exact
  arithmetic; ``n_components`` an int, a float (the explained-variance threshold) or None; ``whiten``;
* :class:`LinearRule`: ``Ridge`` (``solver`` ``"auto"``, ``"cholesky"`` or ``"svd"``: one solution of the normal
  equations ``(UᵀU + αI) β = Uᵀy``) and ``LinearRegression``, with or without intercept, 1-D or 2-D targets;
* :func:`fold_scores`: the test score from the test rows' moments (``SSE = vᵀCv + (Σ r)²/n`` for the residual
  ``r = vᵀ[x, y] + δ``), for r², MSE, RMSE and explained variance (uniform average over outputs).

Each rule also *estimates the error* its result may have against scikit-learn's (from the condition number of the
system it solves, the eigengaps of a PCA, the cancellation in a test SSE) and raises :class:`Decline` where
``TOL`` (1e-9 relative) cannot be promised; the search then takes the network path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Decline", "Fold", "LinearRule", "Moments", "PCARule", "RULES", "ScalerRule", "fit_chain", "fold_scores",
           "rule_for", "score_rule"]

EPS = float(np.finfo(np.float64).eps)
TOL = 1e-9          # the relative difference from scikit-learn's results the path promises
MARGIN = 10.0       # an estimated error must be below TOL / MARGIN
GROWTH = 32.0       # rounding growth of a sum or a solve, in units of eps (empirical, conservative for n < 10^8)


class Decline(Exception):  # noqa: N818 - a signal, not an error: the network path runs instead
    """The one-pass path cannot promise scikit-learn's results here: the reason, for the report."""


def _promise(err: float, what: str) -> None:
    if not np.isfinite(err) or err * MARGIN > TOL:
        raise Decline(f"{what}: estimated difference from scikit-learn {err:.1e} (> {TOL / MARGIN:.0e})")


@dataclass
class Moments:
    """Weighted moments of ``z = [x - x0, y - y0]`` over some rows: ``n = Σw``, ``s = Σ w z``, ``G = Σ w z zᵀ``;
    ``lo``, ``hi``: the least and greatest value of each X column (unweighted; a constant column has lo == hi)."""

    n: float
    s: np.ndarray
    G: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    rows: int = 0

    def __sub__(self, other: Moments) -> Moments:
        return Moments(self.n - other.n, self.s - other.s, self.G - other.G, self.lo, self.hi,
                       self.rows - other.rows)

    @property
    def mean(self) -> np.ndarray:
        return self.s / self.n

    @property
    def centered(self) -> np.ndarray:
        """``Σ w (z - z̄)(z - z̄)ᵀ`` (computed once)."""
        C = self.__dict__.get("_centered")
        if C is None:
            C = self.G - np.outer(self.s, self.s) / self.n
            C = self.__dict__["_centered"] = (C + C.T) / 2
        return C


@dataclass
class Fold:
    """What one fold's fits read: ``d`` X columns, ``t`` outputs, the shifts ``x0``, ``y0``, and per weight key
    (``None``: unweighted) the training rows' and the test rows' :class:`Moments`."""

    d: int
    t: int
    x0: np.ndarray
    y0: np.ndarray
    train: dict[Any, Moments]
    test: dict[Any, Moments]
    cache: dict[Any, Any] = field(default_factory=dict)


@dataclass
class State:
    """A step's input as an affine map of the shifted rows: ``u = A (x - x0) + b``; ``err``: its estimated
    relative difference from scikit-learn's; ``fitted``: per step, the fitted attributes (for the self-check)."""

    A: np.ndarray
    b: np.ndarray
    err: float = 0.0
    fitted: list[dict[str, Any]] = field(default_factory=list)


def _finite_number(v: Any) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
            and bool(np.isfinite(v)))


# --- the rules -------------------------------------------------------------------------------------------------

class ScalerRule:
    """``StandardScaler(with_mean, with_std)``: weighted mean and population variance; a constant column
    (its least and greatest values equal) is scaled by 1, as scikit-learn's ``_is_constant_feature``."""

    name = "standardscaler"
    weighted = True

    @staticmethod
    def check(est: Any) -> str | None:
        from sklearn.preprocessing import StandardScaler

        if type(est) is not StandardScaler:
            return "not a StandardScaler"
        if not isinstance(est.with_mean, bool) or not isinstance(est.with_std, bool):
            return "with_mean/with_std not booleans"
        if est.copy is not True:
            return "copy=False (scikit-learn then scores the rows its fit scaled in place)"
        return None

    @staticmethod
    def fit(est: Any, state: State, m: Moments, fold: Fold) -> State:
        A, b, d = state.A, state.b, fold.d
        mean = A @ m.mean[:d] + b
        var = np.einsum("ij,jk,ik->i", A, m.centered[:d, :d], A) / m.n
        var = np.maximum(var, 0.0)
        if est.with_std:
            constant = np.zeros(len(var), dtype=bool)
            if A.shape[0] == d and np.count_nonzero(A - np.diag(np.diag(A))) == 0:
                constant = m.lo == m.hi   # the step's input columns are the rows' own columns, rescaled
            bound = m.n * EPS * var + (m.n * mean * EPS) ** 2   # scikit-learn's _is_constant_feature
            near = (var <= 1e6 * bound + 1e-300) & ~constant
            if near.any():
                raise Decline(f"standardscaler: column(s) {np.flatnonzero(near)[:5].tolist()} nearly constant "
                              "(scikit-learn's constant test may go either way)")
            scale = np.where(constant, 1.0, np.sqrt(var))
            scale = np.where(scale < 10 * EPS, 1.0, scale)
        else:
            scale = np.ones(len(var))
        centre = mean if est.with_mean else np.zeros(len(var))
        fitted = {"mean_": mean, "var_": var, "scale_": scale if est.with_std else None,
                  "_n": m.n, "_rows": m.rows, "_k_in": A.shape[0]}
        return State(A / scale[:, None], (b - centre) / scale, state.err + GROWTH * EPS,
                     [*state.fitted, fitted])


class PCARule:
    """``PCA``: the covariance's eigendecomposition (``svd_solver="covariance_eigh"``, and ``"full"``/``"auto"``
    where they compute the same components), scikit-learn's signs (``svd_flip``), ``whiten``."""

    name = "pca"
    weighted = False

    @staticmethod
    def check(est: Any) -> str | None:
        from sklearn.decomposition import PCA

        if type(est) is not PCA:
            return "not a PCA"
        if est.svd_solver not in ("auto", "full", "covariance_eigh"):
            return f"svd_solver={est.svd_solver!r} (randomized/arpack: not the covariance's eigenvectors)"
        k = est.n_components
        if not (k is None or (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1)
                or (isinstance(k, (float, np.floating)) and 0 < k < 1)):
            return f"n_components={k!r} (an int, a float in (0, 1) or None qualify)"
        if not isinstance(est.whiten, bool):
            return "whiten not a boolean"
        if est.copy is not True:
            return "copy=False (scikit-learn then centres the rows in place)"
        return None

    @staticmethod
    def fit(est: Any, state: State, m: Moments, fold: Fold) -> State:
        A, b, d = state.A, state.b, fold.d
        n, k_in = m.n, A.shape[0]
        if n <= k_in:
            raise Decline("pca: not more training rows than columns")
        solver = est.svd_solver
        if solver == "auto":   # scikit-learn's choice (PCA._fit), on the step's input shape
            k = est.n_components
            if k_in <= 1000 and n >= 10 * k_in:
                solver = "covariance_eigh"
            elif max(n, k_in) <= 500 or k is None or not (1 <= k < 0.8 * min(n, k_in)):
                solver = "full"
            else:
                raise Decline("pca: svd_solver='auto' picks 'randomized' here")
        mean = A @ m.mean[:d] + b
        C = A @ m.centered[:d, :d] @ A.T / (n - 1)
        C = (C + C.T) / 2
        vals, vecs = np.linalg.eigh(C)
        vals, vecs = vals[::-1].copy(), vecs[:, ::-1]
        vals[vals < 0] = 0.0
        Vt = vecs.T.copy()
        # svd_flip(u_based_decision=False): the largest |entry| of each component positive
        order = np.sort(np.abs(Vt), axis=1)
        top = np.argmax(np.abs(Vt), axis=1)
        Vt *= np.sign(Vt[np.arange(k_in), top])[:, None]
        total = vals.sum()
        k = est.n_components
        if k is None:
            k = k_in
        elif isinstance(k, (float, np.floating)):
            cum = np.cumsum(vals / total)
            if np.min(np.abs(cum - k)) <= 1e-7:
                raise Decline("pca: the explained-variance threshold is within 1e-7 of a cumulated ratio")
            k = int(np.searchsorted(cum, k, side="right")) + 1
        elif k > min(n, k_in):
            raise Decline("pca: n_components above min(n_samples, n_features) (scikit-learn raises)")
        k = int(k)
        top_val = max(vals[0], 1e-300)
        gaps = np.abs(np.diff(vals))
        kept = gaps[: min(k, k_in - 1)]   # each kept component's gap to the next (the last: to the first dropped)
        if kept.size and kept.min() <= 0:
            raise Decline("pca: equal eigenvalues (the components are not unique)")
        err = state.err + (GROWTH * EPS * top_val / kept.min() if kept.size else GROWTH * EPS)
        if k > 0 and k_in > 1 and np.any(order[:k, -1] - order[:k, -2] <= 1e-7 * order[:k, -1]):
            raise Decline("pca: a component's two largest entries are nearly equal (svd_flip's sign is ambiguous)")
        W = Vt[:k]
        ev = vals[:k]
        if est.whiten:
            if ev.size and ev.min() <= 0:
                raise Decline("pca: whitening a zero-variance component")
            err += GROWTH * EPS * top_val / (ev.min() if ev.size else 1.0)
            W = W / np.sqrt(ev)[:, None]
        _promise(err, "pca components")
        fitted = {"mean_": mean, "components_": Vt[:k], "explained_variance_": ev,
                  "explained_variance_ratio_": vals[:k] / total, "n_components_": k,
                  "_vals": vals, "_rows": m.rows, "_solver": solver, "_k_in": k_in}
        return State(W @ A, W @ (b - mean), err, [*state.fitted, fitted])


class LinearRule:
    """``Ridge`` (scalar ``alpha``, ``solver`` ``"auto"``/``"cholesky"``/``"svd"``) and ``LinearRegression``:
    the normal equations of the step's input, centred (weighted) where it fits an intercept."""

    name = "linear"
    weighted = True

    @staticmethod
    def check(est: Any) -> str | None:
        from sklearn.linear_model import LinearRegression, Ridge

        if type(est) is Ridge:
            if not _finite_number(est.alpha) or est.alpha < 0:
                return "alpha not a finite number >= 0 (per-target alphas: today's path)"
            if est.solver not in ("auto", "cholesky", "svd"):
                return f"solver={est.solver!r} (iterative or lsqr: not the normal equations' solution)"
            if est.positive is not False:
                return "positive=True"
        elif type(est) is LinearRegression:
            if est.positive is not False:
                return "positive=True"
            if not _finite_number(est.tol) or not 0 <= est.tol < 1e-2:
                return "tol not a number in [0, 0.01) (scipy's lstsq cuts singular values below tol·s₀)"
        else:
            return "not a Ridge or LinearRegression"
        if not isinstance(est.fit_intercept, bool):
            return "fit_intercept not a boolean"
        if est.copy_X is not True:
            return "copy_X=False (scikit-learn then scores the rows its fit centred in place)"
        return None

    @staticmethod
    def _normal(est: Any, state: State, m: Moments, fold: Fold) -> tuple[Any, ...]:
        A, b, d = state.A, state.b, fold.d
        if est.fit_intercept:
            C = m.centered
            Uu = A @ C[:d, :d] @ A.T
            Uy = A @ C[:d, d:]
            u_mean = A @ m.mean[:d] + b
        else:   # the raw moments of u and y
            G, s, n = m.G, m.s, m.n
            y0 = fold.y0
            As = A @ s[:d]
            Uu = A @ G[:d, :d] @ A.T + np.outer(As, b) + np.outer(b, As) + n * np.outer(b, b)
            Uy = A @ G[:d, d:] + np.outer(As, y0) + np.outer(b, s[d:]) + n * np.outer(b, y0)
            u_mean = np.zeros(A.shape[0])
        Uu = (Uu + Uu.T) / 2
        # an input column that is exactly 0 (a constant column, scaled) decouples: its coefficient is 0 in any
        # rounding (scikit-learn's too), so the system is solved, and its condition number read, without it
        live = np.any(Uu != 0, axis=1) | np.any(Uy != 0, axis=1)
        lam, Q = np.linalg.eigh(Uu[np.ix_(live, live)]) if live.any() else (np.ones(1), np.eye(0))
        return Uu, Uy, u_mean, live, lam, Q

    @staticmethod
    def fit(est: Any, state: State, m: Moments, fold: Fold) -> State:
        W, c, err, fitted = LinearRule.fit_many([est], state, m, fold)
        return State(W, c, float(err[0]), [*state.fitted, fitted[0]])

    @staticmethod
    def fit_many(ests: list[Any], state: State, m: Moments,
                 fold: Fold) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Candidates that differ only in ``alpha`` on the same input ``state``, at once: ``(W, c, err,
        fitted)``, the pipelines' predictors ``ŷ = Wᵀ(x - x0) + c`` side by side (``W``: d × (candidates·t)),
        their estimated errors and fitted attributes.  One eigendecomposition of the normal equations per
        fold and input: ``β(α) = Q (Λ + α)⁻¹ Qᵀ Uᵀy`` for every alpha."""
        est = ests[0]
        A, b, d = state.A, state.b, fold.d
        k = A.shape[0]
        key = ("normal", id(state.A), bool(est.fit_intercept), id(m))
        hit = fold.cache.get(key)
        if hit is None:
            hit = fold.cache[key] = LinearRule._normal(est, state, m, fold)
        Uu, Uy, u_mean, live, lam, Q = hit
        alphas = np.array([float(getattr(e, "alpha", 0.0)) for e in ests])
        name = type(est).__name__.lower()
        if np.any(lam[0] + alphas <= 0):
            raise Decline(f"{name}: singular system (scikit-learn's lstsq/SVD fallback)")
        cond = (lam[-1] + alphas) / (lam[0] + alphas)
        err = state.err + GROWTH * EPS * cond
        _promise(float(err.max()), f"{name} (condition number {cond.max():.1e})")
        if name == "linearregression" and cond.max() >= 1e-4 / max(float(est.tol), 1e-300) ** 2:
            raise Decline("linearregression: a singular value within 100x of tol·s₀ (scipy's lstsq cuts it)")
        t, n = Uy.shape[1], len(alphas)
        beta = np.zeros((n, k, t))                                  # per candidate, (k, t)
        if live.any():
            beta[:, live, :] = Q @ ((Q.T @ Uy[live])[None] / (lam[None, :, None] + alphas[:, None, None]))
        if est.fit_intercept:
            intercept = (m.mean[d:] + fold.y0)[None, :] - np.einsum("k,akt->at", u_mean, beta)
        else:
            intercept = np.zeros((n, t))
        W = A.T @ beta.transpose(1, 0, 2).reshape(k, n * t)
        c = (np.einsum("k,akt->at", b, beta) + intercept).reshape(n * t)
        fitted = [{"coef_": beta[i].T, "intercept_": intercept[i], "_Uu": Uu, "_rows": m.rows, "_k_in": k}
                  for i in range(n)]
        return W, c, err, fitted


RULES: tuple[Any, ...] = (ScalerRule, PCARule, LinearRule)


def rule_for(est: Any, last: bool) -> tuple[Any, str | None]:
    """``(rule, None)`` for a step a rule fits (the last step: a linear model, earlier ones: transformers), or
    ``(None, why not)``."""
    rules = (LinearRule,) if last else (ScalerRule, PCARule)
    whys = []
    for rule in rules:
        why = rule.check(est)
        if why is None:
            return rule, None
        whys.append(why)
    return None, f"{type(est).__name__}: " + "; ".join(whys)


def fit_chain(steps: list[tuple[Any, Any, Any]], fold: Fold, keys: list[Any]) -> State:
    """The fitted pipeline of ``steps`` (``(rule, estimator, weight key)`` each) on ``fold``'s training moments,
    as an affine predictor ``ŷ = Wᵀ(x - x0) + c`` (``State.A``, ``State.b``); each prefix fitted once per fold
    (``keys``: the prefixes' identities)."""
    state = fold.cache.get("start")   # one per fold: the rules key their caches by their input state
    if state is None:
        state = fold.cache["start"] = State(np.eye(fold.d), fold.x0.copy())
    for i, (rule, est, wkey) in enumerate(steps):
        hit = fold.cache.get(keys[i])
        if hit is None:
            try:
                hit = rule.fit(est, state, fold.train[wkey], fold)
            except Decline as exc:
                hit = exc
            fold.cache[keys[i]] = hit
        if isinstance(hit, Decline):
            raise hit
        state = hit
    return state


# --- scores ----------------------------------------------------------------------------------------------------

def score_rule(scorer: Any, est: Any) -> str | None:
    """The metric name (``"r2"``, ``"mse"``, ``"rmse"``, ``"ev"``) of a scorer the rules compute, with its sign
    folded in the name (``"-mse"``), or None."""
    from sklearn.base import RegressorMixin
    from sklearn.metrics import explained_variance_score, mean_squared_error, r2_score, root_mean_squared_error
    from sklearn.metrics._scorer import _PassthroughScorer, _Scorer

    if type(scorer) is _PassthroughScorer:
        last = est.steps[-1][1] if hasattr(est, "steps") else est
        return "r2" if type(last).score is RegressorMixin.score else None
    if type(scorer) is not _Scorer or scorer._response_method not in ("predict", ("predict",)) or scorer._kwargs:
        return None
    names = {r2_score: "r2", mean_squared_error: "mse", root_mean_squared_error: "rmse",
             explained_variance_score: "ev"}
    name = names.get(scorer._score_func)
    if name is None:
        return None
    return name if scorer._sign > 0 else "-" + name


def fold_scores(state: State, m: Moments, d: int, y0: np.ndarray, metric: str) -> float:
    """The score of the fitted pipeline ``state`` on the rows whose moments are ``m`` (scikit-learn's metric,
    weighted by the moments' weights, averaged uniformly over outputs)."""
    return float(scores_many(state.A, state.b, np.array([state.err]), m, d, y0, metric)[0])


def scores_many(W: np.ndarray, c: np.ndarray, err: np.ndarray, m: Moments, d: int, y0: np.ndarray,
                metric: str) -> np.ndarray:
    """The scores of pipelines side by side (``ŷ = Wᵀ(x - x0) + c``, ``W``: d × (candidates·t), ``err``: each
    candidate's estimated error) on the rows whose moments are ``m``: one per candidate."""
    t = len(y0)
    n = len(err)
    C = m.centered
    V = np.vstack([-W, np.tile(np.eye(t), n)])  # r_j = V[:, j]ᵀ z + δ_j
    delta = np.tile(y0, n) - c
    CV = C @ V
    var_r = np.einsum("ij,ij->j", V, CV)        # Σ w (r - r̄)²
    sum_r = V.T @ m.s + m.n * delta             # Σ w r
    sse = var_r + sum_r ** 2 / m.n
    sst = np.tile(np.diag(C)[d:], n)
    # cancellation in vᵀCv: |v|ᵀ|C||v| against its value
    absC = m.__dict__.get("_abs")
    if absC is None:
        absC = m.__dict__["_abs"] = np.abs(C)
    size = np.einsum("ij,ij->j", np.abs(V), absC @ np.abs(V))
    errs = np.repeat(err, t) + GROWTH * EPS * size / np.maximum(var_r, 1e-300)
    name = metric.lstrip("-")
    if name in ("r2", "ev") and np.any(np.diag(C)[d:] <= 1e3 * EPS * np.abs(np.diag(m.G)[d:])):
        raise Decline("a constant target in a fold (scikit-learn's r2/explained variance special case)")
    _promise(float(errs.max()), f"{name} score")
    if name == "r2":
        per = 1.0 - sse / sst
    elif name == "ev":
        per = 1.0 - var_r / sst
    elif name == "mse":
        per = sse / m.n
    else:
        per = np.sqrt(np.maximum(sse, 0.0) / m.n)
    value = per.reshape(n, t).mean(axis=1)
    return -value if metric.startswith("-") else value
