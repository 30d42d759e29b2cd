"""A search's memory of its (candidate, fold) results: resume after an interrupt, grow a grid.

Within one process a search object keeps every ``_fit_and_score`` output it computed, keyed by the
candidate (its estimator's class and hyperparameters, :func:`~gpunets.tuning.tasks.step_key`) and the
fold (its train and test rows), for one *context*: the fingerprints of ``X``, ``y`` and the fit and
score parameters, the scoring, ``return_train_score`` and ``error_score``.  A ``fit`` on the same
context runs only the pairs it does not hold:

* after an interrupt (Ctrl-C in a notebook), ``fit`` again continues: each result is kept as soon as it
  is computed (on the in-process executors; on Dask, as each network finishes);
* refitted with a widened grid, the search fits only the new candidates.

It also keeps the **fitted shared steps** of a pipeline (on the CPU, not on Dask): per fold, each upstream
step's :class:`~gpunets.tuning.tasks.Stage` (its transforms of the fold's rows), keyed like the results by
the steps up to it (class and hyperparameters) and the fold, and the upstream steps of the refit on all
rows.  A widened grid then fits only the new candidates' last steps on the steps kept (``search_report_.
reused`` counts the step fits taken from memory), and its refit only the steps not kept.  They are held up
to :attr:`Memory.budget` bytes (the least recently used dropped first).

New data (or data changed in place), another scoring, another ``error_score`` or another scikit-learn
configuration (``set_config``) start a new memory.  A ``clone`` starts empty, and the memory is not pickled.
Failures are never kept (:func:`~gpunets.tuning.stored.keepable`): a fit or a score that failed (scored
``error_score``) or a result that stops the search (a scorer that returns a non-number) is computed again by the
next ``fit``, as the fault may be gone (a flaky resource, memory).
``search.forget()`` empties it.

>>> m = Memory("ctx")
>>> m.put(("cand", "fold"), {"test_scores": 1.0, "_warnings": ["w"]})
>>> m.get(("cand", "fold"))["test_scores"], len(m)
(1.0, 1)
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import numpy as np

from gpunets.base.config import get_config
from gpunets.compute.estimators import training_output_differs, transform_gives
from gpunets.core.nodes import Node
from gpunets.devices.fingerprint import fingerprint
from gpunets.tuning import stored, tasks

__all__ = ["FoldSteps", "Memory", "Recorded", "is_dask", "of", "record_in", "refit_kept"]


class Memory:
    """The results of one search object on one context (see the module's notes)."""

    #: bytes of fitted shared steps (their transformed rows) a search keeps, per search object
    budget: int = 1 << 30

    def __init__(self, context: Hashable) -> None:
        self.context = context
        self.results: dict[Hashable, dict[str, Any]] = {}
        # an iteration budget warm-started: (candidate without its resource, fold) -> (resource, fitted step,
        # the budgets its fit grew through)
        self.fitted: dict[Hashable, tuple[Any, ...]] = {}
        # (candidate without its resource, fold) -> (resource, budgets grown through) of its last result; the
        # plan of the rung that runs (gpunets.tuning.warm.WarmPlan)
        self.grown: dict[Hashable, tuple[Any, tuple[Any, ...]]] = {}
        self.plan: Any = None
        # fitted shared steps: (steps up to it, fold key or "all") -> (value, bytes), least recently used first
        self.steps: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.steps_bytes = 0
        # candidates of plain parameter values: (base's key, parameters) -> (estimator, its key); id -> same
        self.made: dict[Hashable, tuple[Any, Hashable | None]] = {}
        self.keys_of: dict[int, tuple[Any, Hashable | None]] = {}
        self._lock = threading.Lock()
        self._folds: tuple[list[Any], list[Hashable]] | None = None   # fold_keys' last rows (weakly) and keys

    def specs(self, base: Any, candidates: list[dict[str, Any]], cache: bool = True) -> list[Any]:
        """Each candidate's estimator, ``clone(base).set_params(**params)`` (unknown names raise here), made
        once per memory (with its key) when its parameters are plain values (numbers, strings, None):
        a grown grid or a later rung does not clone and compare the same candidates again.  The
        estimators are the search's own: never fitted (its tasks fit clones).  ``cache=False`` (composites,
        which their folds validate in place): each made afresh."""
        from sklearn.base import clone

        base_key: Any = None if cache else False
        out = []
        for p in candidates:
            plain = all(isinstance(v, (bool, int, float, str, np.number)) or v is None for v in p.values())
            if plain and base_key is None:
                base_key = candidate_key(base) or False
            k = (base_key, tuple(sorted((n, type(v), v) for n, v in p.items()))) if plain and base_key else None
            hit = None if k is None else self.made.get(k)
            if hit is None:
                spec = clone(base).set_params(**clone(p, safe=False))
                if k is not None:
                    if len(self.made) > 10_000:
                        self.made.clear()
                        self.keys_of.clear()
                    hit = self.made[k] = self.keys_of[id(spec)] = (spec, candidate_key(spec))
                out.append(spec)
            else:
                out.append(hit[0])
        return out

    def key_of(self, spec: Any) -> Hashable | None:
        """:func:`candidate_key` of ``spec``, cached for the estimators :meth:`specs` made."""
        hit = self.keys_of.get(id(spec))
        return hit[1] if hit is not None and hit[0] is spec else candidate_key(spec)

    def step(self, key: Hashable) -> Any:
        """The fitted shared step kept for ``key``, or None."""
        with self._lock:
            hit = self.steps.get(key)
            if hit is None:
                return None
            self.steps.move_to_end(key)
            return hit[0]

    def keep_step(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` (a Stage, or a refit's ``(fitted step, transformed rows)``) within :attr:`budget`.

        >>> m = Memory("ctx")
        >>> m.budget = 8 * 10
        >>> m.keep_step("a", (None, np.zeros(6))); m.keep_step("b", (None, np.zeros(6)))
        >>> list(m.steps), m.steps_bytes
        (['b'], 48)
        """
        size = nbytes(value)
        if size > self.budget:
            return
        with self._lock:
            old = self.steps.pop(key, None)
            self.steps_bytes -= 0 if old is None else old[1]
            self.steps[key] = (value, size)
            self.steps_bytes += size
            while self.steps_bytes > self.budget:
                _, (_, freed) = self.steps.popitem(last=False)
                self.steps_bytes -= freed

    def __len__(self) -> int:
        return len(self.results)

    def get(self, key: Hashable | None) -> dict[str, Any] | None:
        """A copy of the result kept for ``key``, or None."""
        if key is None:
            return None
        hit = self.results.get(key)
        return None if hit is None else dict(hit)

    def put(self, key: Hashable | None, out: dict[str, Any]) -> None:
        """Keep a copy of ``out`` (its fitted step apart); not a failure (:func:`~gpunets.tuning.stored.keepable`):
        a fit or score that failed, or a result that stops the search, is computed again next time."""
        if key is None or not stored.keepable(out):
            return
        out = stored.entry(out)
        with self._lock:
            self.results[key] = out

    def lookup(self, specs: list[Any], splits: list[tuple[np.ndarray, np.ndarray]],
               tags: list[Hashable | None] | None = None) -> tuple[list[Hashable | None], list[list[int]]]:
        """The key of every (candidate, fold), candidate-major, and per fold the candidates to run.

        ``tags`` (one per (candidate, fold), candidate-major; None: a plain fit) tells a result that is not a plain
        fit of the candidate on the fold: a warm-started one (:meth:`~gpunets.tuning.warm.WarmPlan.tags`)."""
        folds = self.fold_keys(splits)
        cands = [self.key_of(s) for s in specs]
        pairs = [(c, f) for c in cands for f in folds]
        if tags is not None:
            pairs = [(c if t is None or c is None else (c, t), f) for (c, f), t in zip(pairs, tags)]
        keys: list[Hashable | None] = [None if c is None else (c, f) for c, f in pairs]
        todo = [[c for c in range(len(specs)) if keys[c * len(splits) + f] not in self.results]
                for f in range(len(splits))]
        return keys, todo

    def fold_keys(self, splits: list[tuple[np.ndarray, np.ndarray]]) -> list[Hashable]:
        """Each fold's key: the fingerprints of its rows (kept for the last splits asked, while their index
        arrays live: a rung asks for them several times)."""
        rows = [a for pair in splits for a in pair]
        last = self._folds
        if last is not None and len(last[0]) == len(rows) and all(r() is a for r, a in zip(last[0], rows)):
            return last[1]
        keys: list[Hashable] = [(fingerprint(np.asarray(tr)), fingerprint(np.asarray(te))) for tr, te in splits]
        try:
            self._folds = ([weakref.ref(a) for a in rows], keys)
        except TypeError:   # index lists (no weak references): not kept
            self._folds = None
        return keys


def nbytes(value: Any) -> int:
    """The bytes of the arrays in ``value`` (a tuple of arrays, frames, sparse matrices; other objects: 0).

    An array held twice (a Stage whose rows to score are its training rows) counts once.

    >>> a = np.zeros(4)
    >>> nbytes((a, None, (np.zeros(2, dtype=np.float32),))), nbytes((a, a))
    (40, 32)
    """
    if isinstance(value, tuple):
        return sum(nbytes(v) for v in {id(v): v for v in value}.values())
    if hasattr(value, "memory_usage") and not hasattr(value, "nbytes"):   # a pandas frame
        return int(np.sum(value.memory_usage(index=True, deep=False)))
    if hasattr(value, "indptr"):   # a SciPy sparse matrix
        return sum(int(getattr(value, a).nbytes) for a in ("data", "indices", "indptr"))
    n = getattr(value, "nbytes", 0)
    return int(n) if isinstance(n, (int, np.integer)) else 0


class FoldSteps:
    """The search memory's fitted shared steps of one fold, as :class:`~gpunets.tuning.networks.StepsFold`
    reads and fills them: ``get(steps key)``, and ``keeping(steps key, fn)``, a task function that keeps
    the :class:`~gpunets.tuning.tasks.Stage` it returns (unless a fit or transform failed)."""

    def __init__(self, mem: Memory, fold: Hashable) -> None:
        self.mem, self.fold = mem, fold

    def get(self, key: Hashable) -> Any:
        return self.mem.step((key, self.fold))

    def keeping(self, key: Hashable, fn: Any) -> Any:
        return _Keeping(fn, self.mem, (key, self.fold))


class _Keeping:
    """A ``fit_stage`` task function that also keeps the Stage it computed in the search's memory."""

    def __init__(self, fn: Any, mem: Memory, key: Hashable) -> None:
        self.fn, self.mem, self.key = fn, mem, key
        self.__name__ = getattr(fn, "__name__", "task")
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        if isinstance(out, tasks.Stage) and not any(isinstance(v, tasks.Failed) for v in out[:3]):
            self.mem.keep_step(self.key, out._replace(loaded=()))   # a later run reuses it: no load of its own
        return out


def refit_kept(search: Any, best: Any, X: Any, y: Any, fit_params: dict[str, Any]) -> tuple[int, int, int] | None:
    """Refit ``best`` (a pipeline) on all rows with the upstream steps the search's memory keeps from an
    earlier refit on the same data, as ``Pipeline.fit`` would, looking in the store of fitted states for the
    other steps (:class:`_Refit`): the number of step fits reused from memory, of steps loaded from the
    store and of loaded steps fitted again for their output on the rows (:func:`~gpunets.tuning.tasks._training_rows`);
    None when this shortcut does not apply (``best.fit`` must then be called): a pipeline with ``memory``,
    ``verbose``, ``transform_input``, fit parameters, callbacks, data off the host, or nothing kept."""
    from sklearn.pipeline import Pipeline

    mem = search.__dict__.get("_gn_memory")
    if (mem is None or type(best) is not Pipeline or fit_params or best.memory is not None or best.verbose
            or getattr(best, "transform_input", None) is not None or getattr(search, "_skl_callbacks", None)
            or getattr(best, "_skl_callbacks", None) or not _host_table(X)
            or any(s is None or isinstance(s, str) for _, s in best.steps) or len(best.steps) < 2):
        return None
    keys = prefix_keys(best.steps)
    hits = [mem.step((k, "all")) for k in keys[:-1]]
    depth = max((i + 1 for i, h in enumerate(hits) if h is not None), default=0)
    best._validate_params()
    best._validate_steps()
    steps = list(best.steps)
    Xt: Any = X
    if depth:
        Xt = hits[depth - 1][1]
        for i in range(depth):   # copies: the best estimator is the user's, the memory's steps stay as they are
            steps[i] = (steps[i][0], copy.deepcopy(hits[i][0]))
    refit = _Refit(Xt, y)
    for i in range(depth, len(steps) - 1):
        name, est = steps[i]
        steps[i] = (name, refit.step(est))
        if not refit.loaded:   # its output on all rows is computed: a later refit reuses it
            mem.keep_step((keys[i], "all"), (copy.deepcopy(steps[i][1]), refit.Xt))
    name, last = steps[-1]
    steps[-1] = (name, refit.last(last))
    best.steps = steps
    return depth, refit.stored, refit.again


class _Refit:
    """The refit's steps on all rows, each looked up in the store of fitted states first (docs/store.md), as
    ``Pipeline.fit`` fits them: a loaded step's output on the rows is computed only when a later step fits
    (a refit whose every step is stored transforms nothing)."""

    def __init__(self, X: Any, y: Any) -> None:
        self.Xt, self.y = X, y
        self.x_key: bytes | None = None   # the key of the rows the next step fits on (None: their content)
        self.loaded: list[tuple[Any, bool, Any]] = []   # loaded steps whose output is not computed yet
        self.stored = 0
        self.again = 0   # loaded steps fitted again (on a copy) for their output

    def rows(self) -> Any:
        """The rows the next step fits on: the loaded steps' outputs computed now (from the deepest whose
        output the store keeps, ``gn.Store(path, outputs=True)``)."""
        for i in range(len(self.loaded) - 1, -1, -1):
            est, _, key = self.loaded[i]
            kept = stored.load_output(key) if training_output_differs(est) else None
            if kept is not None:
                self.Xt, self.loaded = kept, self.loaded[i + 1:]
                break
        for est, same, key in self.loaded:
            self.Xt, did = tasks._training_rows(est, {}, self.Xt, self.y, same)
            if did:
                self.again += 1
                stored.keep_output(key, self.Xt)
        self.loaded.clear()
        return self.Xt

    def step(self, est: Any) -> Any:
        """Fit (or load) one upstream step."""
        hit, key, same = stored.load_step(est, None, {}, self.Xt if self.x_key is None else None, self.y,
                                          self.x_key)
        if hit is not None:
            self.loaded.append((hit, same, key))
            self.stored += 1
            self.x_key = stored.stage_key(key)
            return hit
        X = self.rows()
        self.Xt = est.fit_transform(X, self.y) if hasattr(est, "fit_transform") else est.fit(X, self.y).transform(X)
        same = key is not None and training_output_differs(est) and transform_gives(est, X, self.Xt)
        stored.keep_step(key, est, None, same)
        if training_output_differs(est):
            stored.keep_output(key, self.Xt)   # only where the store keeps outputs
        self.x_key = stored.stage_key(key)
        return est

    def last(self, est: Any) -> Any:
        """Fit (or load) the last step: it is looked up only on rows an upstream step keyed."""
        key = None
        if self.x_key is not None:
            hit, key, _ = stored.load_step(est, None, {}, None, self.y, self.x_key)
            if hit is not None:
                self.stored += 1
                return hit
        est.fit(self.rows(), self.y)
        stored.keep_step(key, est)
        return est


def _host_table(X: Any) -> bool:
    """Whether ``X`` is host data the refit's steps are keyed by: a NumPy array or a pandas DataFrame (a
    ColumnTransformer's columns by name), not data on a GPU."""
    return isinstance(X, np.ndarray) or type(X).__module__.split(".")[0] == "pandas"


def prefix_keys(steps: list[tuple[str, Any]]) -> list[Hashable]:
    """Per step, the key of the steps up to it (the search shares step ``i`` of candidates whose keys agree)."""
    out: list[Hashable] = []
    key: Any = ()
    for _, est in steps:
        key = (key, tasks.step_key(est))
        out.append(key)
    return out


def candidate_key(spec: Any) -> Hashable | None:
    """A candidate's key: its estimator's class and hyperparameters; None when they cannot be compared."""
    try:
        key = tasks.step_key(spec)
        hash(key)
    except Exception:  # noqa: BLE001 - an unhashable hyperparameter: that candidate is not remembered
        return None
    return key


def _scoring_key(search: Any) -> Hashable:
    scoring = search.scoring
    try:
        hash(scoring)
        return scoring if not callable(scoring) else ("callable", id(scoring))
    except TypeError:
        return ("value", repr(scoring))


def of(search: Any, X: Any, y: Any, fit_params: dict[str, Any], score_params: dict[str, Any],
       scorers: Any) -> Memory:
    """The search's memory for this data, a new one when the context changed."""
    import sklearn

    context = (fingerprint(X), fingerprint(y) if y is not None else None,
               tuple(sorted((k, fingerprint(v)) for k, v in fit_params.items())),
               tuple(sorted((k, fingerprint(v)) for k, v in score_params.items())),
               _scoring_key(search), bool(search.return_train_score), repr(search.error_score),
               tuple(sorted((k, repr(v)) for k, v in sklearn.get_config().items())))
    mem = search.__dict__.get("_gn_memory")
    if mem is None or mem.context != context:
        mem = Memory(context)
        search.__dict__["_gn_memory"] = mem
    return mem


def is_dask(executor: Any) -> bool:
    """Whether the search runs on Dask (its tasks run in other processes)."""
    if executor is None:
        executor = get_config().get("executor")
    if isinstance(executor, str):
        return executor == "dask"
    return "dask" in type(executor).__module__


class Recorded:
    """A score task's function that also hands its result to ``record(candidate, fold, out)``."""

    def __init__(self, fn: Any, record: Any, pair: tuple[int, int]) -> None:
        self.fn, self.record, self.pair = fn, record, pair
        self.__name__ = getattr(fn, "__name__", "task")
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        if isinstance(out, dict):
            self.record(*self.pair, out)
        return out


def record_in(score_node: Any, record: Any, pair: tuple[int, int]) -> None:
    """Make ``score_node`` (a node of its own: one (candidate, fold)'s score) record its result as it runs."""
    if isinstance(score_node, Node) and callable(score_node.operation):
        score_node.operation = Recorded(score_node.operation, record, pair)


def load_stored(mem: Any, keys: list[Any], skeys: list[bytes | None] | None, todo: list[list[int]],
                 n_splits: int) -> int:
    """Take from the store the results of ``todo`` it holds under ``skeys`` into the memory (under ``keys``);
    how many it took."""
    if skeys is None:
        return 0
    taken = 0
    for f, cands in enumerate(todo):
        for c in list(cands):
            i = c * n_splits + f
            hit = stored.load_result(skeys[i]) if keys[i] is not None else None
            if isinstance(hit, dict):
                mem.put(keys[i], hit)
                cands.remove(c)
                taken += 1
    return taken
