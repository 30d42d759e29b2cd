"""How a search scores one fitted (candidate, fold): scikit-learn's ``_fit_and_score`` accounting of fit and
score failures, and its ``_score`` with the "Scoring failed" warnings kept for the caller's thread."""

from __future__ import annotations

import time
import traceback
from typing import Any

from gpunets.base.saved import saved_operation
from gpunets.compute.estimators import own_inputs
from gpunets.tuning.failed import Failed, Portable

__all__ = ["Raising", "score_noting", "score_one"]


@saved_operation(checked={0: "callable"})
def score_one(scorer: Any, error_score: Any, train: bool, n_test: int, n_scores: tuple[str, ...] | None,
              score_params: tuple[dict[str, Any], dict[str, Any]] | None, est: Any, X_test: Any, y_test: Any,
              X_train: Any, y_train: Any, *seconds: float) -> dict[str, Any]:
    """One entry of scikit-learn's ``_fit_and_score`` output for one (candidate, fold).

    ``score_params`` is ``(test, train)``: the scorer's parameters (``sample_weight``) for those rows.

    Accounting as scikit-learn's: a fit that failed (any step's fit, or its transform of the training
    rows) is a *fit failure* (``fit_error``, ``error_score``); a fitted candidate whose scoring fails
    (its prediction, or a step's transform of the test rows, raised) is a *score failure*: the score
    is ``error_score`` with a "Scoring failed" warning (kept in ``_warnings``, re-issued by the
    search in the caller's thread), or the exception with ``error_score="raise"``; anything else
    raised while scoring (a scorer returning a non-number) stops the search, as in scikit-learn.
    """
    sp_test, sp_train = score_params or ({}, {})
    fit_time = float(sum(seconds))
    failed = next((v for v in (est, X_test, X_train) if isinstance(v, Failed) and v.fit), None)
    out: dict[str, Any] = {"n_test_samples": n_test, "fit_time": fit_time}
    if failed is not None:
        err = error_score if n_scores is None else {name: error_score for name in n_scores}
        out.update(fit_error=failed.tb, test_scores=err, score_time=0.0, _error=Portable(failed.error))
        if train:
            out["train_scores"] = err
        return out
    notes: list[str] = []
    X_test, X_train = own_inputs(est, (X_test, X_train))   # rows other candidates score too
    start = time.perf_counter()
    try:
        out["test_scores"] = score_noting(est, X_test, y_test, scorer, sp_test, error_score, notes)
        if train:
            out["train_scores"] = score_noting(est, X_train, y_train, scorer, sp_train, error_score, notes)
    except Exception as e:  # noqa: BLE001 - raised by the search (scikit-learn lets it propagate)
        err = error_score if n_scores is None else {name: error_score for name in n_scores}
        out.update(fit_error=None, test_scores=err, score_time=0.0, _raise=Portable(e))
        if train:
            out["train_scores"] = err
        return out
    out["score_time"] = time.perf_counter() - start
    out["fit_error"] = None
    if notes:
        out["_warnings"] = notes
    return out


def _scoring_failed(error_score: Any, details: str) -> str:
    return ("Scoring failed. The score on this train-test partition for these parameters will be set to "
            f"{error_score}. Details: \n{details}")


class Raising:
    """A scorer that raises ``error`` (a copy each call): scoring refused up front, e.g. by metadata routing."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import copy

        raise copy.copy(self.error)


def score_noting(est: Any, X: Any, y: Any, scorer: Any, params: dict[str, Any], error_score: Any,
                 notes: list[str]) -> Any:
    """scikit-learn's ``_score``, its "Scoring failed" warnings appended to ``notes`` instead of issued
    (a task may run in another thread or process).  ``X`` may be a :class:`Failed` transform of the
    rows to score: then scoring fails with its error, as the pipeline's ``predict`` would have."""
    import numbers
    from contextlib import suppress

    from sklearn.metrics._scorer import _MultimetricScorer

    multi = isinstance(scorer, _MultimetricScorer)
    scores: Any
    if isinstance(X, Failed) and multi and not scorer._raise_exc:
        # the estimator's predict raised in each metric (scikit-learn's _MultimetricScorer catches per scorer)
        scores = {name: X.tb for name in scorer._scorers}
    else:
        try:
            if isinstance(X, Failed):
                raise X.error
            scores = scorer(est, X, **params) if y is None else scorer(est, X, y, **params)
        except Exception:
            if multi or error_score == "raise":   # what escapes a _MultimetricScorer propagates
                raise
            notes.append(_scoring_failed(error_score, X.tb if isinstance(X, Failed) else traceback.format_exc()))
            return error_score
    if multi:
        for name, value in list(scores.items()):
            if isinstance(value, str):
                scores[name] = error_score
                notes.append(_scoring_failed(error_score, value))
    msg = "scoring must return a number, got %s (%s) instead. (scorer=%s)"
    if isinstance(scores, dict):
        for name, value in scores.items():
            if hasattr(value, "item"):
                with suppress(ValueError):
                    value = value.item()
            if not isinstance(value, numbers.Number):
                raise ValueError(msg % (value, type(value), name))
            scores[name] = value
    else:
        if hasattr(scores, "item"):
            with suppress(ValueError):
                scores = scores.item()
        if not isinstance(scores, numbers.Number):
            raise ValueError(msg % (scores, type(scores), scorer))
    return scores
