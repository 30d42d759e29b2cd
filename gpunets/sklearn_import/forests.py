"""Forests split into chunks of trees: one machine per chunk, joined into the forest scikit-learn would fit.

A ``RandomForestRegressor`` / ``RandomForestClassifier`` / ``ExtraTreesRegressor`` /
``ExtraTreesClassifier`` is one long task when it is one machine.  With several
workers it becomes ``k`` :class:`ForestChunk` machines, each fitting a contiguous
range of the trees, and a :class:`ForestJoin` machine that assembles them.

Each chunk fits its trees exactly as ``BaseForest.fit`` does: the chunk is the
forest with ``n_estimators=stop`` and ``warm_start=True`` holding ``start``
placeholder trees, so scikit-learn's own warm-start path skips the ``start``
seeds already drawn from the forest's ``random_state`` (one ``randint`` per tree,
in order) and builds trees ``start .. stop-1`` with the seeds, bootstrap samples,
class handling and validation of a plain fit.  The join keeps the fitted
attributes of the first chunk (``n_features_in_``, ``feature_names_in_``,
``n_outputs_``, ``classes_`` / ``n_classes_``, ``estimator_``) and the trees of all
chunks in order, so predictions equal the original's fitted the usual way.

Not split (one machine, as before): ``oob_score`` (computed from all trees at
once) or ``warm_start`` set, fewer than two trees, or a single worker.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, clone

from gpunets.base.config import get_config
from gpunets.core.machines import machine
from gpunets.executors.base import default_workers
from gpunets.sklearn_import._base import Context, leaf

__all__ = ["ForestChunk", "ForestJoin", "build_forest", "chunk_bounds", "is_forest", "n_chunks"]


def is_forest(est: Any) -> bool:
    """Whether ``est`` is one of scikit-learn's random or extra-trees forests (regressor or classifier)."""
    from sklearn.ensemble import (
        ExtraTreesClassifier,
        ExtraTreesRegressor,
        RandomForestClassifier,
        RandomForestRegressor,
    )

    from gpunets.sklearn_import._base import converts_as  # lazy: _base's dispatch imports this module

    return converts_as(est, RandomForestRegressor, RandomForestClassifier, ExtraTreesRegressor, ExtraTreesClassifier)


def why_not_split(est: Any) -> str:
    """Why ``est`` stays one machine (``""`` when it can be split)."""
    if est.oob_score:
        return "oob_score needs all trees at once"
    if est.warm_start:
        return "warm_start grows the fitted forest"
    if not isinstance(est.n_estimators, (int, np.integer)) or est.n_estimators < 2:
        return "fewer than two trees"
    return ""


def n_chunks(executor: Any, workers: int | None, split: bool | None) -> int:
    """How many chunks a forest is split into: the workers, unless ``split`` is False or the run is serial."""
    if split is False:
        return 1
    spec = get_config()["executor"] if executor is None or (isinstance(executor, str) and executor == "auto") \
        else executor
    serial = (isinstance(spec, str) and spec == "serial") or type(spec).__name__ == "SerialExecutor"
    if serial and split is None:
        return 1
    w = workers or getattr(spec, "workers", None) or get_config()["workers"] or default_workers()
    return max(2, int(w)) if split else int(w)


def chunk_bounds(n_estimators: int, k: int) -> list[tuple[int, int]]:
    """``k`` contiguous ranges of trees of near-equal sizes (larger ones first), at most one per tree."""
    k = max(1, min(k, n_estimators))
    edges = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(n_estimators), k)])
    return [(int(a), int(b)) for a, b in itertools.pairwise(edges)]


class ForestChunk(BaseEstimator):
    """Trees ``start .. stop-1`` of ``forest``, fitted as ``forest.fit`` would fit them.

    ``transform`` returns the fitted chunk (a forest holding those trees), which the
    :class:`ForestJoin` machine trains on.

    Parameters
    ----------
    forest : forest estimator
        The user's forest (its parameters are this machine's, so ``set_params`` retrains the chunk).
    start, stop : int
        The range of trees, in the forest's order.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.ensemble import RandomForestRegressor
    >>> X, y = np.arange(20.0).reshape(10, 2), np.arange(10.0)
    >>> rf = RandomForestRegressor(4, random_state=0)
    >>> chunk = ForestChunk(rf, 2, 4).fit(X, y).transform(X)
    >>> full = clone(rf).fit(X, y)
    >>> [t.random_state for t in chunk.estimators_] == [t.random_state for t in full.estimators_[2:]]
    True
    """

    def __init__(self, forest: Any = None, start: int = 0, stop: int = 1) -> None:
        self.forest = forest
        self.start = start
        self.stop = stop

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> ForestChunk:
        """Fit trees ``start .. stop-1`` with the seeds and bootstrap samples of a plain ``forest.fit``."""
        f = clone(self.forest).set_params(n_estimators=self.stop, warm_start=True)
        if self.start:
            # scikit-learn's warm start draws (and drops) one seed per tree already present
            f.estimators_ = [None] * self.start
        with warnings.catch_warnings():
            # only the chunk warm-starts; the original does not, so its warnings do not apply
            warnings.filterwarnings("ignore", message="class_weight presets")
            f.fit(X, y, sample_weight=sample_weight)
        f.estimators_ = f.estimators_[self.start:]
        self.forest_ = f
        return self

    def transform(self, X: Any = None) -> Any:
        """The fitted chunk: a forest holding trees ``start .. stop-1`` (``X`` is ignored)."""
        return self.forest_


class ForestJoin(BaseEstimator):
    """The forest assembled from fitted chunks: the trees in order, the fitted attributes of a plain fit.

    Parameters
    ----------
    forest : forest estimator
        The user's forest; the joined forest has its parameters.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.ensemble import ExtraTreesRegressor
    >>> X, y = np.arange(20.0).reshape(10, 2), np.arange(10.0)
    >>> et = ExtraTreesRegressor(5, random_state=0)
    >>> parts = [ForestChunk(et, a, b).fit(X, y).transform(X) for a, b in chunk_bounds(5, 2)]
    >>> bool(np.array_equal(ForestJoin(et).fit(*parts).predict(X), clone(et).fit(X, y).predict(X)))
    True
    """

    def __init__(self, forest: Any = None) -> None:
        self.forest = forest

    def fit(self, *chunks: Any) -> ForestJoin:
        """Join fitted chunks (from :meth:`ForestChunk.transform`), in the forest's tree order."""
        first = chunks[0]
        f = copy.copy(first)   # the fitted attributes of a plain fit: the same for every chunk
        f.set_params(n_estimators=self.forest.n_estimators, warm_start=self.forest.warm_start)
        f.estimators_ = [t for c in chunks for t in c.estimators_]
        self.forest_ = f
        return self

    def predict(self, X: Any) -> Any:
        """The joined forest's ``predict``."""
        return self.forest_.predict(X)

    def predict_proba(self, X: Any) -> Any:
        """The joined forest's ``predict_proba`` (classifiers)."""
        return self.forest_.predict_proba(X)

    def predict_log_proba(self, X: Any) -> Any:
        """The joined forest's ``predict_log_proba`` (classifiers)."""
        return self.forest_.predict_log_proba(X)

    def __getattr__(self, name: str) -> Any:
        # fitted attributes (estimators_, classes_, feature_importances_, ...) read through to the forest
        if name.startswith("__") or name in ("forest_", "forest"):
            raise AttributeError(name)
        forest = self.__dict__.get("forest_")
        if forest is None:
            raise AttributeError(name)
        return getattr(forest, name)


def build_forest(est: Any, X: Any, y: Any, path: str, ctx: Context) -> dict[str, Any]:
    """``k`` chunk machines and their join, or one machine when the forest cannot or need not be split."""
    why = why_not_split(est)
    if ctx.forest_chunks < 2 or why or y is None:
        note = f"not split into chunks: {why}." if why and ctx.forest_chunks >= 2 else ""
        return leaf(est, X, y, path, ctx, note=note)
    name = path or type(est).__name__.lower()
    bounds = chunk_bounds(int(est.n_estimators), ctx.forest_chunks)
    parts = []
    for i, (a, b) in enumerate(bounds):
        chunk_name = f"{name}[chunk {i + 1}/{len(bounds)}]"
        m = machine(ForestChunk(est, a, b), X, y, name=chunk_name, **ctx.fit_params.get(path, {}))
        ctx.note(chunk_name, "forest chunk", est, f"trees {a}..{b - 1} of {est.n_estimators}")
        parts.append(m.transform(X))
    join = machine(ForestJoin(est), *parts, name=name)
    ctx.leaves[name] = est
    sizes = ", ".join(str(b - a) for a, b in bounds)
    ctx.note(name, "forest", est, f"split into {len(bounds)} chunks of trees ({sizes}) fitted side by side, "
                                  "joined in scikit-learn's tree order (same seeds and bootstrap samples).")
    ops = ("predict", "predict_proba", "predict_log_proba")
    return {op: getattr(join, op)(X) for op in ops if hasattr(est, op)}
