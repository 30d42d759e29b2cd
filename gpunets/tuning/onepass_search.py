"""A search in one pass over the data: linear pipelines fitted and scored from per-fold moments.

A search over ``StandardScaler → (PCA) → Ridge / LinearRegression`` scored by r², MSE, RMSE or explained variance
needs, per fold, only the moments of the rows (:class:`~gpunets.tuning.onepass.Moments`: weighted count, column
sums, the Gram matrix of ``[X, y]``).  :func:`run` computes them in one pass, in the rows' own array namespace
(NumPy, CuPy: one GEMM per chunk of rows on the device, then one copy of the K·(d+t+1)² numbers to the host), and
fits and scores every (candidate, fold) from them with the rules of :mod:`gpunets.tuning.onepass`:

* the folds' moments (:mod:`gpunets.tuning.onepass_moments`): splitters whose test folds partition the rows
  used (K-fold style): one pass over the folds' rows, each training set's moments the total less its test
  fold's; any other splitter (shuffled or repeated splits, time series, a halving rung's subsamples): from the
  moments of fixed chunks of the rows, formed once per fit and kept on the search between its rungs;
* candidates that differ only in the last step's ``alpha`` are fitted and scored at once
  (:meth:`~gpunets.tuning.onepass.LinearRule.fit_many`);
* the first fold of each *kind* of candidate in a process (steps, options, metric, weights, the versions of
  scikit-learn and NumPy) is also fitted and scored by scikit-learn itself, and the path is used only if the two
  agree to :data:`~gpunets.tuning.onepass.TOL` (scores relative, coefficients and components norm-relative);
  the fitted estimator built from that fold's moments (:mod:`gpunets.tuning.onepass_refit`) is compared
  attribute by attribute too, and :func:`refit` builds the best candidate's ``best_estimator_`` from the moments
  of all rows only for kinds that agreed.

:func:`run` returns None-free: ``(outputs, report)`` when it took the path, else an :class:`OnePass` note saying
why not (the search then builds its network and keeps the note in ``search_report_.one_pass``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sklearn
from sklearn.utils.validation import _get_feature_names

from gpunets.base.config import config, get_config
from gpunets.compute.models import resolve_estimator
from gpunets.devices import store
from gpunets.devices.data import device_of, to_device
from gpunets.devices.placement import Device
from gpunets.devices.value_types import array_namespace, is_cupy_array
from gpunets.tuning import onepass, onepass_moments, onepass_refit
from gpunets.tuning.networks import pipeline_steps
from gpunets.tuning.onepass import Decline, Fold
from gpunets.tuning.onepass_moments import CHUNK_ROWS
from gpunets.tuning.report import SearchReport

__all__ = ["CHUNK_ROWS", "MAX_COLUMNS", "OnePass", "enabled", "refit", "run"]

#: the most columns (X's and the outputs) the path takes: its moments are O(K·d²) numbers
MAX_COLUMNS = 2048

# kinds whose first fold agreed with scikit-learn's own fit in this process: None where the fitted steps built
# from the moments (the refit's) agreed too, else why not
_CHECKED: dict[Any, str | None] = {}


#: ``one_pass="auto"`` (the default) takes the one-pass path from this many rows on: below it a search's network
#: costs milliseconds to seconds and gives scikit-learn's results bit for bit; from it the moments save seconds
#: per search (0.02x of scikit-learn's time at 50,000 rows, ``benchmarks/bench_tuning.py --one-pass``).
AUTO_MIN_ROWS = 20_000


@contextlib.contextmanager
def enabled(on: bool | str) -> Iterator[None]:
    """Searches inside the block take the one-pass path where it applies (``True``), never (``False``: every
    search builds its network), or from :data:`AUTO_MIN_ROWS` rows on (``"auto"``, the default):
    ``gn.config(one_pass=on)`` as a block.

    >>> from gpunets.tuning.onepass_search import enabled
    >>> with enabled(False):
    ...     pass
    """
    with config(one_pass=on if on == "auto" else bool(on)):
        yield


@dataclass
class OnePass:
    """Which path a search's steps took and why: ``taken`` (the one-pass path), ``why`` (its reason or the
    reason it declined), ``steps`` (per step label, what the rule did), ``splits`` (how the folds' moments
    were formed), ``checked`` (kinds compared with scikit-learn's own fit in this run)."""

    taken: bool
    why: str
    steps: dict[str, str] = field(default_factory=dict)
    splits: str = ""
    checked: int = 0
    refit: str = ""

    def __str__(self) -> str:
        head = "one-pass path" if self.taken else "network path (one-pass declined)"
        lines = [f"{head}: {self.why}"]
        if self.splits:
            lines.append(f"  moments: {self.splits}")
        if self.refit:
            lines.append(f"  refit: {self.refit}")
        lines.extend(f"  {k}: {v}" for k, v in self.steps.items())
        return "\n".join(lines)


def _no(why: str) -> OnePass:
    return OnePass(False, why)


# --- what qualifies --------------------------------------------------------------------------------------------

def _candidate_steps(spec: Any) -> list[tuple[str, Any]] | None:

    steps = pipeline_steps(spec)
    if steps is None:
        if hasattr(spec, "steps"):   # a Pipeline with a passthrough last step
            return None
        return [(type(spec).__name__, spec)]
    return steps


def _plan(specs: list[Any], params: dict[str, Any], score_params: dict[str, Any], n: int) -> Any:
    """Per candidate ``[(rule, estimator, weight key)]``, the weight vectors by key, the scorer's weight key,
    the step labels, or an :class:`OnePass` note."""
    weights: dict[Any, np.ndarray] = {}

    def key_of(w: Any) -> Any:
        if w is None:
            return None
        a = np.asarray(w) if type(w).__module__.split(".")[0] in ("numpy", "pandas", "builtins") else None
        if a is None or a.ndim != 1 or len(a) != n or a.dtype.kind not in "fiu":
            raise Decline("sample_weight not a 1-D host array of numbers, one per row")
        a = a.astype(np.float64)
        if not np.all(np.isfinite(a)) or not np.all(a > 0):
            raise Decline("sample_weight with zeros, negatives or NaN (scikit-learn's own handling applies)")
        weights[id(w)] = a
        return id(w)

    plans = []
    try:
        first = _candidate_steps(specs[0])
        if first is None:
            return _no("a Pipeline whose last step is passthrough")
        labels = [name for name, _ in first]
        pipeline = hasattr(specs[0], "steps")
        by_step: dict[str, Any] = {}
        for k, v in params.items():
            name, _, p = k.rpartition("__") if pipeline else ("", "", k)
            if p != "sample_weight" or (pipeline and name not in labels) or (not pipeline and name):
                return _no(f"fit parameter {k!r} (only sample_weight enters the moments)")
            by_step[name if pipeline else labels[0]] = key_of(v)
        if set(score_params) - {"sample_weight"}:
            return _no(f"scorer parameters {sorted(score_params)} (only sample_weight enters the moments)")
        score_key = key_of(score_params.get("sample_weight"))
        for spec in specs:
            steps = _candidate_steps(spec)
            if steps is None or [name for name, _ in steps] != labels:
                return _no("candidates with different steps")
            plan = []
            for i, (name, est) in enumerate(steps):
                rule, why = onepass.rule_for(est, last=i == len(steps) - 1)
                if rule is None:
                    return _no(f"step {name!r} has no statistics rule ({why})")
                if not rule.weighted and by_step.get(name) is not None:
                    return _no(f"step {name!r} takes no sample_weight (scikit-learn raises in each fit)")
                plan.append((rule, est, by_step.get(name)))
            plans.append(plan)
    except Decline as exc:
        return _no(str(exc))
    return plans, weights, score_key, labels


def _static(search: Any, warm: Any) -> str | None:
    """Why the search's settings keep it off the path, or None."""
    from sklearn.utils.metadata_routing import _routing_enabled


    if get_config()["one_pass"] is False:
        return "off (gn.config(one_pass=False); True or 'auto', the default, turn it on)"
    if warm is not None:
        return "a warm-started budget"
    if search._watched() is not None:
        return "scikit-learn's callbacks watch each fit"
    if store.current_store() is not None:
        return "a store of fitted states is in force (each fit is kept there)"
    if _routing_enabled():
        return "metadata routing is on"
    return None


def _arrays(X: Any, y: Any) -> Any:
    """``(X, Y as 2-D, 1-D target?, namespace)`` or a reason to decline."""

    if type(y).__name__ == "Series" and type(y).__module__.startswith("pandas"):
        y = y.to_numpy()
    if type(X).__name__ == "DataFrame" and type(X).__module__.startswith("pandas") \
            and all(str(t) == "float64" for t in X.dtypes):
        try:
            _get_feature_names(X)
        except (TypeError, ValueError):
            return "feature names of mixed types (scikit-learn's error, from each fit)"
        X = X.to_numpy()   # the steps' feature names do not change a score
    host = type(X) is np.ndarray
    if not host and not (is_cupy_array(X) or type(X).__module__.startswith("gpunets.devices.fakegpu")):
        return "rows not a NumPy or CuPy array"
    if y is None or getattr(y, "ndim", 0) not in (1, 2) or X.ndim != 2:
        return "not 2-D rows with a 1-D or 2-D target"
    xp = array_namespace(X)
    if str(X.dtype) != "float64":
        return (f"{X.dtype} rows (scikit-learn computes in that precision: 1e-9 cannot be promised)"
                if str(X.dtype) == "float32" else f"{X.dtype} rows")
    if type(y) is not type(X) or str(y.dtype)[0] not in "fiu" or str(y.dtype) == "float16":
        return "a target that is not a numeric array like the rows"
    Y = xp.reshape(y, (-1, 1)) if y.ndim == 1 else y
    return X, xp.astype(Y, xp.float64), y.ndim == 1, xp


# --- the run ---------------------------------------------------------------------------------------------------

_NAMES: dict[type, list[str]] = {}
_POOLS: list[Any] = []   # threadpoolctl's controller, made once (it lists the loaded libraries when made)


def _one_thread() -> Any:
    """BLAS and OpenMP capped at one thread for the block."""
    if not _POOLS:
        from threadpoolctl import ThreadpoolController

        _POOLS.append(ThreadpoolController())
    return _POOLS[0].limit(limits=1)


def _params(est: Any) -> dict[str, Any]:
    """``est.get_params(deep=False)``, its parameter names read once per class (``get_params`` inspects the
    signature at each call)."""
    names = _NAMES.get(type(est))
    if names is None:
        names = _NAMES[type(est)] = type(est)._get_param_names()
    return {k: getattr(est, k) for k in names}


def _prefix_keys(plan: list[tuple[Any, Any, Any]]) -> list[Any]:
    keys: list[Any] = []
    prev: Any = None
    for rule, est, wkey in plan:
        params = _params(est)
        prev = (prev, rule.name, type(est).__name__, wkey, repr(sorted(params.items())))
        keys.append(prev)
    return keys


def _batches(plans: list[Any], prefix: list[list[Any]], todo: list[int]) -> list[list[int]]:
    """The candidates of ``todo`` grouped where they differ only in the last step's ``alpha`` (the same
    upstream steps, weights and other options): each group is fitted at once."""
    groups: dict[Any, list[int]] = {}
    for c in todo:
        _, est, wkey = plans[c][-1]
        rest = repr(sorted((k, v) for k, v in _params(est).items() if k != "alpha"))
        groups.setdefault((prefix[c][-2] if len(plans[c]) > 1 else None, type(est), rest, wkey), []).append(c)
    return list(groups.values())


def _kind(plan: list[tuple[Any, Any, Any]], metric: str, score_key: Any, xp: Any, t: int, flat: bool) -> Any:
    """What a candidate's self-check covers: its steps and options (not alpha nor an int n_components), the
    metric, the weights' presence, the versions, the namespace."""
    parts = []
    for _rule, est, wkey in plan:
        params = {k: v for k, v in _params(est).items() if k not in ("alpha", "n_components")}
        k = getattr(est, "n_components", None)
        parts.append((type(est).__name__, repr(sorted(params.items())), type(k).__name__, wkey is not None))
    return (tuple(parts), metric, score_key is not None, sklearn.__version__, np.__version__, xp.__name__, t, flat)


def _close(a: Any, b: Any, floor: float = 1e-300) -> bool:
    """``a`` equals ``b`` to TOL relative to ``b``'s largest entry (or ``floor``, where ``b`` is ~0 by
    construction: the mean of centred columns)."""
    a, b = np.ravel(np.asarray(a, dtype=np.float64)), np.ravel(np.asarray(b, dtype=np.float64))
    if b.size == 1 and a.size > 1:   # fit_intercept=False: scikit-learn's intercept_ is 0.0 for every output
        b = np.broadcast_to(b, a.shape)
    if a.shape != b.shape:
        return False
    scale = max(float(np.max(np.abs(b), initial=0.0)), floor)
    return bool(np.max(np.abs(a - b), initial=0.0) <= onepass.TOL * scale)


def _self_check(spec: Any, state: Any, score: float, train_score: float | None, X: Any, y: Any,
                split: tuple[np.ndarray, np.ndarray], params: dict[str, Any], score_params: dict[str, Any],
                scorer: Any, flat: bool) -> tuple[str | None, str | None]:
    """scikit-learn's own fit and score of one (candidate, fold) against the rule's: ``(why the scores or the
    fitted statistics differ, why the fitted estimator built from the moments differs)``, None each where equal
    to TOL (the second: every attribute, :func:`~gpunets.tuning.onepass_refit.differs`)."""
    from sklearn.base import clone


    train, test = split
    Xh, yh = np.asarray(to_device(X, "cpu")), np.asarray(to_device(y, "cpu"))
    fp = {k: np.asarray(v)[train] for k, v in params.items()}
    est = clone(spec).fit(Xh[train], yh[train], **fp)
    sp = {k: np.asarray(v)[test] for k, v in score_params.items()}
    theirs = scorer(est, Xh[test], yh[test], **sp)
    if not _close(score, theirs):
        return f"score {score!r} against scikit-learn's {theirs!r}", None
    if train_score is not None:
        spt = {k: np.asarray(v)[train] for k, v in score_params.items()}
        if not _close(train_score, scorer(est, Xh[train], yh[train], **spt)):
            return "train score differs", None
    for fitted, mine in zip(onepass_refit.fitted_steps(est), state.fitted):
        for attr, value in mine.items():
            if attr.startswith("_") or value is None or getattr(fitted, attr, None) is None:
                continue   # StandardScaler(False, False): no mean_; "_...": what the refit's attributes need
            if not _close(value, getattr(fitted, attr), 1.0 if attr == "mean_" else 1e-300):
                return f"{type(fitted).__name__}.{attr} differs from scikit-learn's", None
    try:
        built = onepass_refit.build(clone(spec), state, flat)
    except Decline as exc:
        return None, str(exc)
    return None, onepass_refit.differs(built, est)


def _refit_route(search: Any, X: Any, plan: list[tuple[Any, Any, Any]], labels: list[str]) -> Any:
    """The refit's route as the network path gives it: on the search's GPU (its ``device``, else the rows'), the
    array-API twins where every step has one."""

    dev = device_of(X) if search.device in (None, "auto") else Device.parse(search.device)
    if not dev.is_cuda:
        return None
    routes = {resolve_estimator(est, dev, what=f"search step {name!r}", fallback="silent").path
              for name, (_, est, _) in zip(labels, plan)}
    return ("array_api", dev) if routes == {"array_api"} else ("cpu", None)


def run(search: Any, specs: list[Any], X: Any, y: Any, splits: list[tuple[np.ndarray, np.ndarray]], scorers: Any,
        params: dict[str, Any], score_params: dict[str, Any], todo: list[list[int]],
        warm: Any = None) -> tuple[dict[tuple[int, int], dict[str, Any]], SearchReport] | OnePass:
    """Every (candidate, fold) of ``todo`` fitted and scored from the folds' moments: ``({(candidate, fold):
    its _fit_and_score output}, report)``, or an :class:`OnePass` note saying why the path does not apply."""
    start = time.perf_counter()
    why = _static(search, warm)
    if why is not None:
        return _no(why)
    rows = getattr(X, "shape", (None,))[0]
    if get_config()["one_pass"] == "auto" and (rows is None or rows < AUTO_MIN_ROWS):
        return _no(f"one_pass='auto' (the default) takes it from {AUTO_MIN_ROWS:,} rows on, and the search has "
                   f"{'an unknown number of' if rows is None else f'{rows:,}'} rows: its network, bit for bit "
                   "scikit-learn's, costs little here (gn.config(one_pass=True) takes it at any size)")
    metric = onepass.score_rule(scorers, specs[0])
    if metric is None:
        return _no(f"scorer {scorers!r} has no statistics rule (r2, neg MSE, neg RMSE, explained variance do)")
    got = _arrays(X, y)
    if isinstance(got, str):
        return _no(got)
    Xa, Y, flat, xp = got
    if any(len(train) < 2 or len(test) < 2 for train, test in splits):
        return _no("a training or test set of fewer than 2 rows (scikit-learn's own failures and warnings)")
    n, d, t = Xa.shape[0], Xa.shape[1], Y.shape[1]
    if d == 0 or t == 0:
        return _no("no columns (scikit-learn's own error)")
    if d + t > MAX_COLUMNS or len(splits) * (d + t) > n:
        return _no(f"{d} columns: the moments (O(K·d²) = {len(splits)}·{d + t}²) would cost more than the rows")
    planned = _plan(specs, params, score_params, n)
    if isinstance(planned, OnePass):
        return planned
    plans, weights, score_key, labels = planned
    memo = search.__dict__.get("_gn_one_pass")
    if not isinstance(memo, onepass_moments.Memo) or not memo.fits(X, y):
        memo = None
    if memo is None:
        memo = onepass_moments.start(Xa, Y, xp, X, y)
        if memo is None:
            return _no("NaN or infinity in the rows (scikit-learn's own error, from each fit)")
    keys = {w for plan in plans for _, _, w in plan} | {score_key}
    folds, how, memo = onepass_moments.folds(Xa, Y, xp, splits, weights, keys, memo, X, y)
    moments_s = time.perf_counter() - start
    train_score = bool(search.return_train_score)
    results: dict[tuple[int, int], tuple[float, float | None]] = {}
    fits = {name: 0 for name in labels}
    prefix = [_prefix_keys(plan) for plan in plans]
    kinds = [_kind(plan, metric, score_key, xp, t, flat) for plan in plans]
    to_check: dict[Any, tuple[int, int]] = {}
    states: dict[tuple[int, int], Any] = {}
    try:
        with _one_thread():   # d×d work: one BLAS thread is fastest, and leaves the other cores alone
            for f, fold in enumerate(folds):
                for cs in _batches(plans, prefix, todo[f]):   # candidates differing only in the last alpha
                    c0 = cs[0]
                    up = onepass.fit_chain(plans[c0][:-1], fold, prefix[c0][:-1])
                    _, _, wkey = plans[c0][-1]
                    W, b, err, fitted = onepass.LinearRule.fit_many([plans[c][-1][1] for c in cs], up,
                                                                    fold.train[wkey], fold)
                    test = onepass.scores_many(W, b, err, fold.test[score_key], d, fold.y0, metric)
                    trained = onepass.scores_many(W, b, err, fold.train[score_key], d, fold.y0, metric) \
                        if train_score else None
                    for i, c in enumerate(cs):
                        results[c, f] = (float(test[i]), None if trained is None else float(trained[i]))
                        if kinds[c] not in _CHECKED and kinds[c] not in to_check:
                            to_check[kinds[c]] = (c, f)
                            states[c, f] = onepass.State(W[:, i * t:(i + 1) * t], b[i * t:(i + 1) * t],
                                                         float(err[i]), [*up.fitted, fitted[i]])
                for i, name in enumerate(labels):
                    fits[name] += len({prefix[c][i] for c in todo[f]})
    except Decline as exc:
        return _no(str(exc))
    fit_s = time.perf_counter() - start - moments_s
    for kind, (c, f) in to_check.items():
        try:
            bad, built = _self_check(specs[c], states[c, f], *results[c, f], X, y, splits[f], params, score_params,
                                     scorers, flat)
        except Exception as exc:  # noqa: BLE001 - the network path reports it as scikit-learn does
            bad, built = f"scikit-learn's own fit raised {type(exc).__name__}", None
        if bad is not None:
            return _no(f"self-check against scikit-learn failed ({bad})")
        _CHECKED[kind] = built
    pairs = sum(len(tf) for tf in todo)
    share = (time.perf_counter() - start) / max(pairs, 1)
    outs = {}
    for (c, f), (on_test, on_train) in results.items():
        out: dict[str, Any] = {"n_test_samples": len(splits[f][1]), "fit_time": share, "test_scores": on_test,
                               "score_time": 0.0, "fit_error": None}
        if train_score:
            out["train_scores"] = on_train
        outs[c, f] = out
    report = SearchReport(fits=fits, naive={name: pairs for name in labels})
    report.refit_route = _refit_route(search, X, plans[0], labels)
    report.ran = dict(fits)
    report.where = {name: {"one-pass": v} for name, v in fits.items()}
    report.batched = pairs if len(specs) > 1 else 0
    report.seconds = time.perf_counter() - start
    steps = {}
    for i, name in enumerate(labels):
        rule = plans[0][i][0]
        steps[name] = {"standardscaler": "mean and variance from the training moments",
                       "pca": "eigendecomposition of the training covariance (covariance_eigh)",
                       "linear": "normal equations per candidate, scored from the test moments"}[rule.name]
    memo.refit = {"metric": metric, "score_key": score_key, "weights": weights, "flat": flat, "ns": xp.__name__}
    search.__dict__["_gn_one_pass"] = memo   # the next rung's chunks, the refit's moments (search.py drops it)
    report.one_pass = OnePass(True, f"every step and the {metric.lstrip('-')} scorer have a statistics rule; "
                              f"moments {moments_s * 1e3:.1f} ms, fits and scores {fit_s * 1e3:.1f} ms",
                              steps, how, len(to_check))
    return outs, report


# --- the refit -------------------------------------------------------------------------------------------------

def refit(search: Any, best: Any, X: Any, y: Any, fit_params: dict[str, Any]) -> bool:
    """Fit ``best`` (the search's ``best_estimator_``, unfitted) on all rows ``X``, ``y`` from their moments
    (the sum of the folds' or of the chunks' that the search formed), as scikit-learn's ``fit`` would to
    :data:`~gpunets.tuning.onepass.TOL`: True, else False (``best.fit`` must then be called).  Either way
    ``search_report_.one_pass.refit`` says which and why; the fit's moments are dropped."""
    memo = search.__dict__.pop("_gn_one_pass", None)
    report = getattr(search, "search_report_", None)
    note = getattr(report, "one_pass", None)
    if not isinstance(memo, onepass_moments.Memo) or note is None or not note.taken:
        return False
    start = time.perf_counter()
    why = _refit(memo, getattr(report, "last", report), best, X, y, fit_params)
    if why is None:
        note.refit = (f"from the moments of all rows ({(time.perf_counter() - start) * 1e3:.1f} ms; the fitted "
                      "steps built from moments agreed with scikit-learn's own fit on a fold)")
        return True
    note.refit = f"scikit-learn's own fit ({why})"
    return False


def _refit(memo: onepass_moments.Memo, report: Any, best: Any, X: Any, y: Any,
           fit_params: dict[str, Any]) -> str | None:
    """Why the refit cannot be built from the moments, or None once ``best`` is built."""
    if getattr(report, "refit_route", None) is not None and report.refit_route[0] == "array_api":
        return "the refit runs on the GPU with scikit-learn's array-API twins"
    if not memo.fits(X, y):
        return "other rows than the search's"
    got = _arrays(X, y)
    if isinstance(got, str):
        return got
    Xa, Y, flat, xp = got
    planned = _plan([best], fit_params, {}, Xa.shape[0])
    if isinstance(planned, OnePass):
        return planned.why
    plan = planned[0][0]
    info = memo.refit
    kind = _kind(plan, info["metric"], info["score_key"], xp, Y.shape[1], flat)
    if kind not in _CHECKED:
        return "its kind of candidate was not compared with scikit-learn's fit in this process"
    if _CHECKED[kind] is not None:
        return f"the fitted steps built from moments differed from scikit-learn's on a fold: {_CHECKED[kind]}"
    try:
        names = _get_feature_names(X)
        keys = {w for _, _, w in plan}
        whole = onepass_moments.total(Xa, Y, xp, {**info["weights"], **planned[1]}, keys, memo)
        fold = Fold(Xa.shape[1], Y.shape[1], memo.x0, memo.y0, whole, {})
        with _one_thread():
            state = onepass.fit_chain(plan, fold, _prefix_keys(plan))
            onepass_refit.build(best, state, flat, names)
    except Decline as exc:
        return str(exc)
    except (TypeError, ValueError) as exc:   # scikit-learn's feature-name errors: its own fit raises them
        return f"{type(exc).__name__} from the rows' feature names"
    return None
