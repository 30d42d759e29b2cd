"""Metadata routing of a search's fit parameters: to the steps of a pipeline, to its score, and the refit's context.

Part of :mod:`gpunets.tuning.search`: scikit-learn routes a search's fit parameters through the estimator's
metadata requests; a search split into steps needs them per step, and the refit on all rows needs them again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gpunets.base.config import config, get_config
from gpunets.compute.models import fit_context
from gpunets.devices.data import to_device
from gpunets.devices.placement import Device, check_available, device_exists
from gpunets.tuning import stored, tasks
from gpunets.tuning.report import SearchReport


def jobs_executor(executor: Any, n_jobs: Any, gpu: Any = None) -> Any:
    """The executor a search's network runs on: ``executor``, or, where it is ``"auto"`` and ``n_jobs`` is set,
    what scikit-learn's ``n_jobs`` promises (issue 35 item 11).

    ``n_jobs=k`` (k > 1, or -1: all cores) fits candidates and folds side by side: ``"threads"`` (its ``workers``
    come from ``n_jobs``, see :func:`gpunets.tuning.dropin.workers`; each task's BLAS/OpenMP threads are capped
    as the threads executor does); ``n_jobs=1``: ``"serial"``. ``n_jobs=None``, an executor given by name or
    object, a configured default other than ``"auto"``, or a search on a GPU (``gpu``, where one thread issues
    the kernels fastest): unchanged. Returns None for ``"auto"`` (the run chooses, docs/executors.md).

    >>> jobs_executor("auto", 2), jobs_executor("auto", -1), jobs_executor("auto", 1), jobs_executor("auto", None)
    ('threads', 'threads', 'serial', None)
    >>> jobs_executor("serial", 2), jobs_executor("auto", 2, gpu="cuda:0")
    ('serial', None)
    """
    if executor not in ("auto", None):
        return executor
    if n_jobs is None or gpu is not None or get_config()["executor"] not in ("auto", None):
        return None
    return "serial" if int(n_jobs) == 1 else "threads"


@contextlib.contextmanager
def quiet_fallback(search: Any, device: Any) -> Iterator[None]:
    """Within the block (a search's network run on ``device``): where ``device`` is a GPU absent here and the
    fallback policy is ``"warn"``, one :class:`~gpunets.devices.placement.DeviceFallbackWarning` naming the search
    the user wrote (once per search object), and no other: its internal nodes and steps fall back silently
    (issue 35 item 14; before: a logged line per step and fold, and a warning per internal node such as
    ``take(X, ...)``). ``fallback="raise"`` still raises, ``"silent"`` stays silent."""
    dev = None if device in (None, "auto") else Device.parse(device)
    if dev is None or not dev.is_cuda or device_exists(dev) or get_config()["fallback"] != "warn":
        yield
        return
    steps = getattr(search.estimator, "steps", None)
    parts = (f" (its steps {', '.join(type(s).__name__ for _, s in steps if s not in (None, 'passthrough'))})"
             if steps else f" (its {type(search.estimator).__name__} fits)")
    check_available(dev, what=f"{type(search).__name__}(device={device!r}){parts}", owner=search)
    token = stored.USER_FALLBACK.set("warn")   # a step loaded as a GPU fit's CPU twin still warns (tuning.stored)
    try:
        with config(fallback="silent"):
            yield
    finally:
        stored.USER_FALLBACK.reset(token)


@contextlib.contextmanager
def _refit_context(report: SearchReport) -> Iterator[Any]:
    """Where the best candidate is refitted: array-API dispatch on the search's GPU when every step of
    the search ran that way, else on the host (its data copied there); unchanged for a search on the CPU."""
    route = getattr(report, "refit_route", None)
    if route is None:
        yield lambda X, y: (X, y)
        return
    path, dev = route
    if path == "array_api":
        with fit_context(path, dev):
            yield lambda X, y: (X, y)
        return
    yield lambda X, y: (to_device(X, "cpu"), None if y is None else to_device(y, "cpu"))


def _routed_by_step(pipe: Any, steps: list[tuple[str, Any]],
                    params: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """With metadata routing on: each step's fit parameters as the Pipeline's own routing gives them
    (``fit_transform``'s for a step that has it, else ``fit``'s; ``fit``'s for the last step)."""
    from sklearn.utils.metadata_routing import process_routing

    try:
        routed = process_routing(pipe, "fit", **params)
    except Exception:  # noqa: BLE001 - the pipeline's fit refuses them: it says so on every fold, as in sklearn
        return None
    out: dict[str, dict[str, Any]] = {}
    for i, (name, est) in enumerate(steps):
        method = "fit_transform" if i < len(steps) - 1 and hasattr(est, "fit_transform") else "fit"
        out[name] = dict(routed[name][method])
    return out


def _pipeline_score_routing(pipe: Any, last: str, scorer: Any,
                            params: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """What scikit-learn's default scorer of a Pipeline gives its last step's ``score`` under routing:
    ``(scorer, that step's score parameters)``, or a scorer raising Pipeline.score's routing error."""
    from sklearn.utils.metadata_routing import process_routing

    try:
        routed = process_routing(pipe, "score", **params)
    except Exception as e:  # noqa: BLE001 - every score fails with it
        return tasks.Raising(e), {}
    return scorer, dict(routed[last].score)


def _fit_params_by_step(params: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]] | None:
    """``step__param`` fit parameters grouped by step, as Pipeline routes them; None if one names no step."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in params.items():
        step, sep, param = key.partition("__")
        if not sep or step not in names:
            return None
        out.setdefault(step, {})[param] = value
    return out


def _step_names(steps: list[list[tuple[str, Any]]]) -> list[str]:
    """The names of the steps any candidate fits, in pipeline order: a grid may swap a step for
    ``"passthrough"`` in some candidates (``{"pca": ["passthrough", PCA(3)]}``), so the first candidate's
    steps need not be all of them.

    >>> _step_names([[("s", 1), ("r", 2)], [("s", 1), ("p", 3), ("r", 2)]])
    ['s', 'p', 'r']
    """
    order: list[str] = []
    for cand in steps:
        at = 0
        for name, _ in cand:
            if name in order:
                at = order.index(name) + 1
            else:
                order.insert(at, name)
                at += 1
    return order
