"""A search's step fits and the store of fitted states (:mod:`gpunets.devices.store`).

A search's steps are fitted by its own tasks (:func:`gpunets.tuning.tasks.fit_step`), not by machines, so
they look in the store here, with keys made the way the planner makes a machine's
(:mod:`gpunets.planning.stored`): the step's class and hyperparameters, its training rows' key, ``y``'s content,
its fit parameters, the device kind and route, and the versions of gpunets and of the libraries named.  The
training rows' key is the content fingerprint of the fold's rows for a first step, and, for a later step, the
key of the upstream step's fit (carried by the :class:`~gpunets.tuning.tasks.Stage` it passes on): so a
search run again, in this process or a new one, loads every step it fitted before, and a grid widened with new
values of the last step loads the shared upstream steps and fits only the new candidates' last steps.

A loaded step whose ``fit_transform`` may differ from its ``transform`` (:mod:`gpunets.planning.outputs` says
why) is fitted again on a copy for its training output, unless the store keeps training outputs
(``gn.Store(path, outputs=True)``: :func:`keep_output`, :func:`load_output`; such entries hold data derived
from the training rows, so only by this opt-in).

The tasks read the store in force where they run: the caller's ``gn.config(store=...)`` travels with them on
the serial, threads and streams executors, and on Dask to workers that share the store's folder (the executor
checks it once per cluster, :mod:`gpunets.executors._dask_store`).  There each step fit is looked up and
written on the worker that runs it, and each (candidate, fold) result is written by the task that scores it
(:class:`Keeping`): the client sends keys, never fitted steps, and a search stopped midway (Ctrl-C, a lost
worker, a timeout) keeps what finished.  What the step tasks did with the store comes back to the client's
``search_report_`` with the scores (a :class:`Done` per step fit loaded, per fit run again for a loaded
step's training output, per training output read: ``_stored`` in the task's result).  Where the
workers do not see the folder the store is the client's only: the client looks up each (candidate, fold)
result before the run and writes the new ones when the run ends; the steps fit on the workers as without a
store.

>>> from sklearn.linear_model import Ridge
>>> import numpy as np
>>> step_key(Ridge(), None, {}, np.ones((3, 2)), np.ones(3)) is None   # no store in force: no key
True
"""

from __future__ import annotations

import contextvars
import logging
import os
from typing import Any, NamedTuple

import numpy as np

from gpunets.base._warn import warn_once
from gpunets.base.config import get_config
from gpunets.core.nodes import Node
from gpunets.devices import store as _store
from gpunets.devices.cache import digest
from gpunets.devices.fingerprint import fingerprint
from gpunets.devices.placement import Device, DeviceFallbackWarning
from gpunets.devices.store_keys import library_versions, stable_key
from gpunets.planning.stored import GPU_ROUTES, state_of, write_state

logger = logging.getLogger("gpunets")

#: The fallback policy the user set, while a search quiets its internal nodes' fallbacks
#: (:func:`gpunets.tuning.routing.quiet_fallback`): a GPU fit loaded as its CPU twin is news for a step the user
#: wrote, so it warns by the user's policy, not the quieted one.
USER_FALLBACK: contextvars.ContextVar[str | None] = contextvars.ContextVar("gpunets_user_fallback", default=None)

__all__ = ["load_step", "step_key", "stage_key", "data_key", "load_result", "keep_result", "keep_step", "result_keys",
           "entry", "keepable", "Keeping", "keep_in", "PRIVATE", "Done", "done", "load_output", "keep_output", "outputs_kept",
           "shared_key", "load_shared", "keep_shared"]

#: The keys of a task's result that are not part of scikit-learn's result, hence never remembered nor stored:
#: a warm-started fit, the tokens of the step fits loaded from the store, whether the task wrote the result.
PRIVATE = ("_fitted", "_stored", "_kept", "_batched")


class Done(NamedTuple):
    """One thing a step task did that the search's report counts, carried back with the scores (``_stored`` in a
    task's result; a value that reaches several results is counted once, by ``token``).

    ``what``: ``"loaded"``, a step fit loaded from the store; ``"again"``, a fit run again on a copy of a loaded
    step for its training output (``fit_transform`` may differ from ``transform``: PCA, TargetEncoder; a fit
    that runs, counted as one); ``"output"``, that training output loaded from the store instead
    (``gn.Store(path, outputs=True)``).  ``depth``: the step's place in the candidate's pipeline (0: the first).
    ``seconds``: how long the fit run again took (0 otherwise).
    """

    what: str
    depth: int
    token: bytes
    seconds: float = 0.0
    start: float = 0.0   # time.perf_counter() when the fit run again started, in process ``pid``
    pid: int = 0


def done(what: str, depth: int, seconds: float = 0.0) -> Done:
    """A :class:`Done` with a fresh token (``seconds``: a fit that just ended, after running that long).

    >>> d = done("loaded", 1)
    >>> d.what, d.depth, len(d.token), d == done("loaded", 1)
    ('loaded', 1, 8, False)
    """
    import time

    return Done(what, depth, os.urandom(8), seconds, time.perf_counter() - seconds, os.getpid())


def outputs_kept() -> bool:
    """Whether the store in force keeps training outputs (``gn.Store(path, outputs=True)``)."""
    s = _store.current_store()
    return bool(getattr(s, "outputs", False))


def _output_key(key: bytes) -> bytes:
    return digest(b"gnoutput", key)


def load_output(key: bytes | None) -> Any:
    """The training output kept with the step fit stored under ``key`` (:func:`keep_output`), else None; read
    only from a store that keeps outputs."""
    s = _store.current_store()
    if key is None or s is None or not getattr(s, "outputs", False):
        return None
    got = s.get(_output_key(key))
    return got[0] if isinstance(got, tuple) and len(got) == 1 else None


def keep_output(key: bytes | None, out: Any) -> None:
    """Keep ``out``, the training output of the step fit stored under ``key`` (its ``fit_transform``'s), where
    the store in force opted in (``outputs=True``: such an entry holds data derived from the training rows);
    nothing otherwise."""
    s = _store.current_store()
    if key is not None and s is not None and getattr(s, "outputs", False) and out is not None:
        s.put(_output_key(key), (out,))


def shared_key(rule: str, group: Any, X: Any, y: Any, x_key: bytes | None = None,
               y_key: bytes | None = None) -> bytes | None:
    """The store key of what a batch of last steps shares on ``X, y`` (``x_key``: ``X``'s key, when an upstream
    step gave it): the rule's name and group (every parameter but the batched one), the rows' and ``y``'s
    content and the versions; None unless the store in force keeps training outputs (such sums of the training
    rows are data derived from them: :func:`keep_shared`)."""
    if not outputs_kept() or group is None:
        return None
    xk = x_key if x_key is not None else data_key(X)
    yk = y_key if y_key is not None else data_key(y)
    if xk is None or yk is None:
        return None
    return digest(b"gnshared", rule.encode(), repr(group).encode(), xk, yk, _store.VERSION.encode(),
                  library_versions({"numpy", "scipy", "sklearn"}))


def load_shared(key: bytes | None, kind: Any) -> Any:
    """The shared part kept under ``key`` by :func:`keep_shared` for a batch of this ``kind`` (the libraries'
    versions, the rows' dtype and layout), else None."""
    s = _store.current_store()
    if key is None or s is None or not getattr(s, "outputs", False):
        return None
    got = s.get(key)
    return got[1] if isinstance(got, tuple) and len(got) == 2 and got[0] == kind else None


def keep_shared(key: bytes | None, kind: Any, value: Any) -> None:
    """Keep ``value``, the shared part of a batch of ``kind`` (sums of its training rows: ``Ridge``'s ``XᵀX``,
    ``Xᵀy`` and offsets), under ``key``, where the store in force keeps training outputs; nothing otherwise."""
    s = _store.current_store()
    if key is not None and s is not None and getattr(s, "outputs", False):
        s.put(key, (kind, value))


def data_key(x: Any) -> bytes | None:
    """The content of ``x`` as a key part (None: named by identity only)."""
    if x is None:
        return b"none"
    fp = fingerprint(x)
    if isinstance(fp, tuple) and fp and fp[0] == "object":
        return None
    return repr(fp).encode()


def stage_key(key: bytes | None) -> bytes | None:
    """The key of the values a fitted upstream step passes on: its fit's key, tagged."""
    return None if key is None else digest(b"stage", key)


def step_key(est: Any, route: Any, fit_params: dict[str, Any], X: Any, y: Any,
             x_key: bytes | None = None, y_key: bytes | None = None) -> bytes | None:
    """The store key of fitting ``est`` on ``X, y`` (``x_key``, ``y_key``: ``X``'s key, when an upstream step
    gave it, and ``y``'s :func:`data_key`, when the caller computed it for several steps); None without a store
    in force, or when something cannot be named stably."""
    if _store.current_store() is None:
        return None
    xk = x_key if x_key is not None else data_key(X)
    yk = y_key if y_key is not None else data_key(y)
    libs: set[str] = {"gpunets"}
    spec = stable_key(est, libs)
    fp = stable_key(fit_params, libs)
    if xk is None or yk is None or spec is None or fp is None:
        return None
    dev = getattr(route, "device", None)
    kind = "cuda" if getattr(dev, "is_cuda", False) else "cpu"
    path = getattr(route, "path", "sklearn") if route is not None else "sklearn"
    return digest(b"gnstep", spec, xk, yk, fp, kind.encode(), str(path).encode(), _store.VERSION.encode(),
                  library_versions(libs - {"gpunets"}))


def load_result(key: bytes | None) -> Any:
    """The (candidate, fold) result stored under ``key`` (see :func:`keep_result`), else None (a failure that an
    older version stored is not served)."""
    s = _store.current_store()
    got = s.get(key) if key is not None and s is not None else None
    return got if isinstance(got, dict) and keepable(got) else None


def keep_result(key: bytes | None, out: dict[str, Any]) -> None:
    """Write a (candidate, fold) result (:func:`entry`) under ``key`` (nothing without a key or a store)."""
    s = _store.current_store()
    if key is not None and s is not None and keepable(out):
        s.put(key, out)


def _load(key: bytes | None) -> tuple[Any, dict[str, Any]]:
    """The step stored under ``key`` and its fit's info (``same_output``: see :func:`keep_step`)."""
    s = _store.current_store()
    if key is None or s is None:
        return None, {}
    got = s.get(key)
    if isinstance(got, tuple):   # written by write_state: (estimator, info) or (GPU state pickled, info, CPU twin)
        return (state_of(got), dict(got[1])) if len(got) in (2, 3) else (None, {})
    return got, {}


def load_step(est: Any, route: Any, fit_params: dict[str, Any], X: Any, y: Any,
              x_key: bytes | None = None, y_key: bytes | None = None) -> tuple[Any, bytes | None, bool]:
    """The fitted step to use instead of fitting ``est`` (None: fit it), the key it is, or will be, under, and
    whether its ``transform`` of its training rows gives its fit's output (see :func:`keep_step`).

    A step placed on a GPU that runs on the CPU here (``route.path == "cpu_fallback"``: no GPU, or no GPU
    route) also finds the CPU twin of the same fit done on a GPU, as a network's machine does (docs/store.md,
    "Devices"), following the fallback policy: ``"raise"`` refuses it, ``"warn"`` warns once, ``"silent"``
    logs it; the key it gives is the GPU fit's, so the steps downstream find theirs.
    """
    key = step_key(est, route, fit_params, X, y, x_key, y_key)
    hit, info = _load(key)
    if hit is not None or key is None or getattr(route, "path", None) != "cpu_fallback":
        return hit, key, bool(info.get("same_output", False))
    policy = USER_FALLBACK.get() or get_config()["fallback"]
    s = _store.current_store()
    if policy == "raise" or s is None:
        return None, key, False
    for path in GPU_ROUTES:
        gkey = step_key(est, _GpuRoute(path), fit_params, X, y, x_key, y_key)
        got = s.get(gkey, probe=True) if gkey is not None else None
        if isinstance(got, tuple) and len(got) == 3:
            twin, how = got[2]
            msg = (f"search step {type(est).__name__} is placed on a GPU but runs on the CPU here: its fit was loaded "
                   f"from the store, from a state fitted on cuda ({path}), converted for the CPU: {how}. Its answers "
                   "may differ from the GPU's in the last bits. Use gn.config(fallback='raise') to refuse GPU states.")
            if policy == "warn":
                warn_once(("stored GPU step", type(est).__name__, path), msg, DeviceFallbackWarning)
            else:
                logger.info(msg)
            return twin, gkey, bool(got[1].get("same_output", False))
    return None, key, False


class _GpuRoute:
    """The route a step fitted on a GPU had, as its store key names it."""

    device = Device.parse("cuda")

    def __init__(self, path: str) -> None:
        self.path = path


def keep_step(key: bytes | None, est: Any, route: Any = None, same_output: bool = False) -> None:
    """Write a fitted step under ``key`` (nothing without a key or a store), as a machine's state is written
    (:func:`gpunets.planning.stored.write_state`): one fitted on a GPU with its CPU twin.  ``same_output``: its
    ``transform`` of its training rows gives its ``fit_transform``'s output bit for bit (checked at fit time),
    so a search that loads it passes on the ``transform`` (``gpunets.tuning.tasks._training_rows``)."""
    s = _store.current_store()
    if key is None or s is None:
        return
    dev = getattr(route, "device", None)
    info = {"path": getattr(route, "path", "sklearn"), "device": str(dev) if dev is not None else "cpu",
            "same_output": same_output}
    write_state(s, key, est, info)


def keepable(out: Any) -> bool:
    """Whether a (candidate, fold) result may be remembered or stored: not a failure.  A fit that failed
    (``fit_error``), a score that failed (``error_score`` with a "Scoring failed" warning) or one that stops the
    search (``_raise``) may not fail next time (a flaky resource, memory, a fixed bug): it is never kept, so the
    next search fits it again.

    >>> keepable({"fit_error": None, "test_scores": 0.5}), keepable({"fit_error": "Traceback...", "test_scores": 0})
    (True, False)
    >>> keepable({"fit_error": None, "test_scores": 0.0, "_warnings": ["Scoring failed. The score on ..."]})
    False
    """
    if not isinstance(out, dict) or out.get("_raise") is not None or out.get("fit_error") is not None:
        return False
    return not any(isinstance(w, str) and w.startswith("Scoring failed") for w in out.get("_warnings") or ())


def entry(out: dict[str, Any]) -> dict[str, Any]:
    """The (candidate, fold) result ``out`` as it is remembered and stored: its :data:`PRIVATE` keys dropped.

    >>> entry({"fit_time": 0.1, "_fitted": object(), "_stored": (b"t",)})
    {'fit_time': 0.1}
    """
    return {k: v for k, v in out.items() if k not in PRIVATE}


class Keeping:
    """A score task's function that writes the (candidate, fold) result it computes under ``key`` in the store
    in force where it runs (a Dask worker that shares the store's folder), marking it ``_kept`` so the client
    does not write it again; without a store there, the result is returned as it is."""

    def __init__(self, fn: Any, key: bytes) -> None:
        self.fn, self.key = fn, key
        self.__name__ = getattr(fn, "__name__", "task")
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        s = _store.current_store()
        if s is not None and keepable(out) and s.put(self.key, entry(out)):
            out["_kept"] = True
        return out


def keep_in(score_node: Any, key: bytes | None) -> None:
    """Make ``score_node`` (one (candidate, fold)'s score) write its result under ``key`` where it runs."""
    if key is not None and isinstance(score_node, Node) and callable(score_node.operation):
        score_node.operation = Keeping(score_node.operation, key)


def result_keys(search: Any, specs: list[Any], splits: list[Any], X: Any, y: Any, fit_params: dict[str, Any],
                score_params: dict[str, Any], tags: list[Any] | None = None) -> list[bytes | None] | None:
    """The store key of every (candidate, fold) result of ``search``, candidate-major (None: no store).

    A result (scikit-learn's ``_fit_and_score`` output: scores and times) is keyed by the candidate (class and
    hyperparameters), the fold's rows, and the search's context: the data's content, the fit and score
    parameters, the scoring, ``return_train_score``, ``error_score``, the search's device and the versions;
    ``tags`` (per (candidate, fold); None: a plain fit) by how it was fitted otherwise: a warm-started fit by
    the budgets it grew through (:meth:`~gpunets.tuning.warm.WarmPlan.tags`).
    """
    if _store.current_store() is None:
        return None
    libs: set[str] = {"gpunets"}
    parts = [data_key(X), data_key(y), stable_key(fit_params, libs), stable_key(score_params, libs),
             stable_key(search.scoring, libs), stable_key((bool(search.return_train_score), repr(search.error_score),
                                                          repr(getattr(search, "device", None))), libs)]
    if any(p is None for p in parts):
        return None
    context = digest(b"gnsearch", *[p for p in parts if p is not None], _store.VERSION.encode())
    folds = []
    for train, test in splits:
        tr, te = data_key(np.asarray(train)), data_key(np.asarray(test))
        folds.append(None if tr is None or te is None else digest(tr, te))
    out: list[bytes | None] = []
    for spec in specs:
        own = set(libs)
        cand = stable_key(spec, own)
        versions = library_versions(own - {"gpunets"})
        out += [None if cand is None or f is None else digest(b"gnresult", context, cand, f, versions) for f in folds]
    if tags is not None:
        out = [k if k is None or t is None else digest(b"gnwarm", k, repr(t).encode()) for k, t in zip(out, tags)]
    return out
