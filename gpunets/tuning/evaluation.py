"""One search ``fit``: scikit-learn's ``evaluate_candidates``, each call run as one network, and what it gathered.

scikit-learn's ``BaseSearchCV.fit`` hands ``evaluate_candidates`` to the search's ``_run_search`` (all candidates
at once for a grid; rung after rung for successive halving).  Here each call evaluates its candidates with the
search's ``_evaluate`` (one network, the search's memory first), applies scikit-learn's accounting of failures,
fires the per-(candidate, fold) callback hooks, and returns scikit-learn's ``cv_results_`` so far.
"""

from __future__ import annotations

import warnings
from typing import Any

from sklearn.model_selection._validation import _insert_error_scores, _warn_or_raise_about_fit_failures

from gpunets.tuning import dropin, tasks

__all__ = ["Run", "by_candidate"]


def by_candidate(todo: list[list[int]], n: int) -> list[list[int]]:
    """Per candidate, the folds it runs on (``todo`` gives, per fold, the candidates that run)."""
    out: list[list[int]] = [[] for _ in range(n)]
    for f, cs in enumerate(todo):
        for c in cs:
            out[c].append(f)
    return out


class Run:
    """One ``fit``: scikit-learn's ``evaluate_candidates`` (each call one network) and what it gathered."""

    def __init__(self, search: Any, base: Any, X: Any, y: Any, split_params: dict[str, Any],
                 fit_params: dict[str, Any], score_params: dict[str, Any], scorers: Any,
                 workers: int | None) -> None:
        self.search, self.X, self.y, self.split_params = search, X, y, split_params
        # the last item: what the calls of one fit share (the search's memory for this data, fingerprinted once)
        self.data: tuple[Any, ...] = (X, y, fit_params, score_params, scorers, workers, base, {})
        self.candidates: list[dict[str, Any]] = []
        self.outs: list[dict[str, Any]] = []
        self.more: dict[str, list[Any]] = {}
        self.results: dict[str, Any] = {}

    def evaluate_candidates(self, candidate_params: Any, cv: Any = None, more_results: Any = None,
                            callback_ctx: Any = None) -> dict[str, Any]:
        s = self.search
        cv = cv or s._checked_cv_orig
        candidates = list(candidate_params)
        splits = list(cv.split(self.X, self.y, **self.split_params))
        if len(splits) != s.n_splits_:
            msg = (f"cv.split and cv.get_n_splits return inconsistent results. Expected {s.n_splits_} "
                   f"splits, got {len(splits)}")
            raise ValueError(msg)
        if not splits or not candidates:   # scikit-learn's words (BaseSearchCV.fit), before anything is built
            msg = (f"No fits were performed. Was the CV iterator empty? Were there no candidates? "
                   f"(cv={s.cv!r} yielded no train/test split. Hint: pass cv=5, a splitter whose split() "
                   f"yields pairs, or a list of (train, test) index arrays.)")
            raise ValueError(msg)
        # the search's "Fitting ... folds" line (verbose > 0) is printed by its _evaluate, once it knows what is left
        evals = dropin.evaluations(s, callback_ctx, len(candidates) * len(splits))   # made ahead, in order
        s._gn_evaluations = evals
        try:
            outs = s._evaluate(candidates, splits, self.data)
        finally:
            s.__dict__.pop("_gn_evaluations", None)
        # scikit-learn's accounting, in its order (candidate-major): a fit failure raises with
        # error_score="raise"; a scoring error scikit-learn lets through raises whatever error_score
        for o in outs:
            if o.get("_raise") is not None:
                raise tasks.unwrap_error(o["_raise"])
            if s.error_score == "raise" and o.get("_error") is not None:
                raise tasks.unwrap_error(o["_error"])
        dropin.print_fits(s.verbose, candidates, len(splits), outs, bool(s.return_train_score))
        for o in outs:   # "Scoring failed" warnings, issued here (their tasks may have run elsewhere)
            for msg in o.pop("_warnings", ()):
                warnings.warn(msg, UserWarning, stacklevel=4)
        report = s._gn_reports[-1]
        for i, o in enumerate(outs):
            o.pop("_error", None)
            o.pop("_raise", None)
            c = i // len(splits)
            if o["fit_error"] is not None and c not in report.errors:
                report.errors[c] = (candidates[c], o["fit_error"].strip().splitlines()[-1])
        dropin.fire_evaluations(evals)
        _warn_or_raise_about_fit_failures(outs, s.error_score)
        if callable(s.scoring):
            _insert_error_scores(outs, s.error_score)
        self.candidates.extend(candidates)
        self.outs.extend(outs)
        for key, value in (more_results or {}).items():
            self.more.setdefault(key, []).extend(value)
        self.results = s._format_results(self.candidates, s.n_splits_, self.outs, self.more or None)
        return self.results
