"""Metadata routing of a search's fit parameters: to the steps of a pipeline, to its score, and the refit's context.

Part of :mod:`gpunets.tuning.search`: scikit-learn routes a search's fit parameters through the estimator's
metadata requests; a search split into steps needs them per step, and the refit on all rows needs them again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from gpunets.compute.models import fit_context
from gpunets.devices.data import to_device
from gpunets.tuning import tasks
from gpunets.tuning.report import SearchReport


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
