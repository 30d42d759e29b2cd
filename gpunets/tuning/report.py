"""What the search shared: step fits done against those of a candidate-by-candidate search."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpunets.base.trace import TraceRecord

__all__ = ["SearchReport", "batch_fit_name", "fit_name"]

_BATCH = re.compile(r"fit (\d+)× ")   # batch_fit_name's head


def fit_name(label: str) -> str:
    """The name the search gives the node that fits step (or machine) ``label``.

    >>> fit_name("pca")
    'fit pca'
    """
    return f"fit {label}"


def batch_fit_name(label: str, n: int) -> str:
    """The name of the node that fits ``n`` last steps ``label`` together (:mod:`gpunets.tuning.batched`).

    >>> batch_fit_name("ridge", 30)
    'fit 30× ridge'
    """
    return f"fit {n}× {label}"


@dataclass
class SearchReport:
    """Step fits done by the search against those a candidate-by-candidate search would do.

    Attributes
    ----------
    fits : dict
        ``{step label: fits that ran}`` over every fold (the refit excluded): step fits loaded from the store
        are not fits (see ``loaded``); a fit run again on a copy of a loaded step to get its training output
        (``fit_transform`` may differ from ``transform``: ``PCA``, ``TargetEncoder``) is one (see ``again``).
    naive : dict
        ``{step label: candidates × folds}``: what a search fitting each candidate on its own would do.
    transforms : int
        Test-row transforms done by shared steps (a candidate-by-candidate search does one per
        step, candidate and fold).
    seconds : float
        Wall time of the search network.
    errors : dict
        ``{candidate index: (its parameters, the last line of its first error)}`` for every candidate
        that failed on some fold (its scores are ``error_score``).
    ran : dict or None
        ``{step label: fits that ran}``, read from the run's trace: its fit tasks, less those that loaded
        their step from the store, plus the fits run again inside them (each a nested record of the trace,
        ``trace.nested``, labelled "fit_transform again"); equal to ``fits`` when each shared fit ran once
        (more only when Dask reran tasks of a worker that died); None when the executor recorded no trace
        (``DaskExecutor(trace=False)``).
    where : dict or None
        ``{step label: {lane: fit tasks}}``: where the step's fit tasks ran (on Dask, each worker's address;
        else the executor's lane), those that loaded their step included; None with ``ran``.
    remembered : int
        (candidate, fold) results not computed again: given by the search's memory (a fit resumed after an
        interrupt, or a grid grown on the same data: :mod:`gpunets.tuning.memory`) or loaded from the store
        (``results_stored`` of them).
    results_stored : int
        (candidate, fold) results loaded from the store of fitted states (an earlier search's, in any process).
    reused : dict
        ``{step label: fits taken from the search's memory}``: upstream steps fitted on the same fold by an
        earlier ``fit`` of the search (a widened grid, a resumed fit: :mod:`gpunets.tuning.memory`), not
        fitted again (nor counted in ``fits``).
    refit_reused : int
        Upstream steps of the refit on all rows taken from the search's memory (an earlier refit's).
    refit_stored : int
        Steps of the refit on all rows loaded from the store of fitted states (an earlier search's refit,
        or an upstream step of an earlier refit); a refit whose every step is stored computes nothing.
    refit_again : int
        Loaded steps of the refit fitted again (on a copy) for their output on all rows, as ``again``.
    warm : int
        Last-step fits that continued the candidate's fit of the previous rung (successive halving with
        an iteration budget as the resource, warm-started) instead of refitting it.
    batched : int
        Last-step fits done together with others of the same fold (:mod:`gpunets.tuning.batched`: ``Ridge``
        fits that differ only in ``alpha`` share their rows' centring and Gram matrix), each equal to its own
        fit bit for bit; counted in ``fits``.
    batched_gpu : int
        Of ``batched``, those on a GPU (:mod:`gpunets.tuning.batched_gpu`: ``Ridge(solver="svd")`` on the
        array-API route, one SVD per fold shared by every alpha), each fit equal to its own bit for bit.
    batched_close : int
        Of ``batched_gpu``, those whose scores (one metric call over the candidates' predictions as columns) are
        scikit-learn's within 1e-9 relative rather than bit for bit (a column reduction of CuPy sums in another
        order); the others' scores are bit for bit.
    stored : int
        Step fits loaded from the store of fitted states instead of fitted (``gn.config(store=...)``,
        docs/store.md; also those loaded on Dask workers that share the store, counted back with the scores):
        the sum of ``loaded``.
    loaded : dict
        ``{step label: step fits loaded from the store}`` (not counted in ``fits``).
    again : dict
        ``{step label: fits run again}``: a loaded step whose ``fit_transform`` may differ from its
        ``transform`` is fitted again on a copy to pass on its fit's output bit for bit (counted in ``fits``);
        ``gn.Store(path, outputs=True)`` keeps those outputs instead (docs/store.md, "Training outputs").
    outputs : int
        Training outputs of loaded steps read from the store (``gn.Store(path, outputs=True)``) instead of
        fitting again.
    rungs : list of SearchReport
        Successive halving: the report of each rung (one network each); these totals are their sums.
    one_pass : OnePass or None
        Which path the search's steps took and why (:mod:`gpunets.tuning.onepass_search`): the one-pass path
        (every step fitted from the folds' moments) or the network, with the reason the one-pass path declined;
        a successive-halving search: the last rung's.
    trace : Trace or None
        The :class:`~gpunets.base.trace.Trace` of the network run (``trace.plot()`` draws its timeline);
        a successive-halving search has one per rung, in ``rungs[i].trace``.
    """

    fits: dict[str, int] = field(default_factory=dict)
    naive: dict[str, int] = field(default_factory=dict)
    transforms: int = 0
    seconds: float = 0.0
    errors: dict = field(default_factory=dict)
    candidates: int = field(default=0, repr=False)   # candidates of the run (their indices in ``errors``)
    refit_route: tuple | None = field(default=None, repr=False)  # (route, device) of a search on a GPU
    ran: dict[str, int] | None = None
    where: dict[str, dict[str, int]] | None = None
    remembered: int = 0
    reused: dict[str, int] = field(default_factory=dict)
    refit_reused: int = 0
    refit_stored: int = 0
    warm: int = 0
    batched: int = 0
    batched_gpu: int = 0
    batched_close: int = 0
    stored: int = 0
    loaded: dict[str, int] = field(default_factory=dict)
    again: dict[str, int] = field(default_factory=dict)
    outputs: int = 0
    results_stored: int = 0
    refit_again: int = 0
    rungs: list[SearchReport] = field(default_factory=list, repr=False)
    one_pass: Any = field(default=None, repr=False)
    trace: Any = field(default=None, repr=False)

    @property
    def last(self) -> SearchReport:
        """The report of the last network run (the last rung of a successive-halving search)."""
        return self.rungs[-1] if self.rungs else self

    @classmethod
    def merged(cls, reports: list[SearchReport]) -> SearchReport:
        """One report summing ``reports`` (one per network run: the rungs of a successive-halving search),
        each kept in ``rungs``.

        >>> a, b = SearchReport({"pca": 2}, {"pca": 4}, warm=0), SearchReport({"pca": 1}, {"pca": 2}, warm=1)
        >>> m = SearchReport.merged([a, b])
        >>> m.fits, m.naive, m.warm, len(m.rungs)
        ({'pca': 3}, {'pca': 6}, 1, 2)
        """
        out = cls(rungs=list(reports))
        for r in reports:
            for name in ("fits", "naive", "reused", "loaded", "again"):   # counts per step, summed step by step
                total = getattr(out, name)
                for k, v in getattr(r, name).items():
                    total[k] = total.get(k, 0) + v
            for name in ("transforms", "seconds", "remembered", "warm", "batched", "batched_gpu", "batched_close",
                         "stored", "outputs", "results_stored"):
                setattr(out, name, getattr(out, name) + getattr(r, name))
        offset = 0
        for r in reports:   # candidate indices of cv_results_ (rung after rung)
            for c, e in r.errors.items():
                out.errors[offset + c] = e
            offset += r.candidates
        if all(r.ran is not None for r in reports) and reports:
            out.ran, out.where = {}, {}
            for r in reports:
                assert r.ran is not None and r.where is not None
                for k, v in r.ran.items():
                    out.ran[k] = out.ran.get(k, 0) + v
                for k, lanes in r.where.items():
                    for lane, n in lanes.items():
                        out.where.setdefault(k, {})
                        out.where[k][lane] = out.where[k].get(lane, 0) + n
        out.refit_route = reports[-1].refit_route if reports else None
        out.one_pass = reports[-1].one_pass if reports else None
        return out

    @property
    def total(self) -> tuple[int, int]:
        """``(fits done, fits a candidate-by-candidate search would do)``."""
        return sum(self.fits.values()), sum(self.naive.values())

    @property
    def fitted(self) -> int:
        """Step fits that ran (those run again for a loaded step's output included).

        >>> SearchReport({"pca": 2, "ridge": 6}, {}, stored=7).fitted
        8
        """
        return sum(self.fits.values())

    def count_done(self, done: Iterable[tuple[str, Any]]) -> None:
        """Count what the step tasks did with the store: ``(step label, gpunets.tuning.stored.Done)`` pairs,
        each once.  A loaded step fit leaves ``fits`` (and ``ran``) for ``loaded``; a fit run again for a loaded
        step's output joins ``fits`` and ``again`` (and ``ran``, with a nested record in ``trace``).  Call it
        after :meth:`read_trace`.

        >>> from gpunets.tuning.stored import done
        >>> r = SearchReport({"pca": 3, "ridge": 6}, {"pca": 6, "ridge": 6}, ran={"pca": 3, "ridge": 6})
        >>> r.count_done([("pca", done("loaded", 1)), ("pca", done("again", 1)), ("pca", done("loaded", 1))])
        >>> r.fits, r.loaded, r.again, r.stored, r.ran
        ({'pca': 2, 'ridge': 6}, {'pca': 2}, {'pca': 1}, 2, {'pca': 2, 'ridge': 6})
        """
    
        for step, d in done:
            what = getattr(d, "what", "loaded")
            if what == "output":
                self.outputs += 1
                continue
            sign = -1 if what == "loaded" else 1
            book = self.loaded if what == "loaded" else self.again
            book[step] = book.get(step, 0) + 1
            self.fits[step] = self.fits.get(step, 0) + sign
            if self.ran is not None:
                self.ran[step] = self.ran.get(step, 0) + sign
            if what == "again" and self.trace is not None and self.trace.origin is not None:
                import os

                here = getattr(d, "pid", 0) == os.getpid()
                start = d.start - self.trace.origin if here else 0.0
                self.trace.nested.append(TraceRecord(
                    -1, "fit", f"{fit_name(step)}: fit_transform again (the training output of a stored fit)",
                    f"{fit_name(step)} (inside)", "cpu", start, start + d.seconds, "task", parent=fit_name(step)))
        self.stored = sum(self.loaded.values())

    def count_batched(self, marks: Any) -> None:
        """Count the last-step fits done in batches from their results' marks (``True``: on the CPU, ``"gpu"``:
        on a GPU, scores bit for bit, ``"gpu close"``: scores within 1e-9 relative; falsy: not batched).

        >>> r = SearchReport(); r.count_batched([True, None, "gpu", "gpu close"]); (r.batched, r.batched_gpu, r.batched_close)
        (3, 2, 1)
        """
        for mark in marks:
            if mark:
                self.batched += 1
                if isinstance(mark, str) and mark.startswith("gpu"):
                    self.batched_gpu += 1
                    self.batched_close += mark == "gpu close"

    def read_trace(self, records: Iterable[Any]) -> None:
        """Fill ``ran`` and ``where`` from the trace records of the search's run.

        A fit task is recognised by its label, ``"fit <step>(...)"`` (see :func:`fit_name`).

        >>> from gpunets.base.trace import TraceRecord
        >>> r = SearchReport(fits={"pca": 1, "ridge": 2})
        >>> recs = [TraceRecord(k, "node", f"{fit_name(s)}(X)", lane, "cpu", 0.0, 1.0, "w")
        ...         for k, (s, lane) in enumerate([("pca", "w1"), ("ridge", "w1"), ("ridge", "w2")])]
        >>> r.read_trace(recs)
        >>> r.ran, r.where["ridge"]
        ({'pca': 1, 'ridge': 2}, {'w1': 1, 'w2': 1})
        """
        heads = {fit_name(s) + "(": s for s in self.fits}
        ran = dict.fromkeys(self.fits, 0)
        where: dict[str, dict[str, int]] = {s: {} for s in self.fits}
        seen = False
        for rec in records:
            seen = True
            label, n = rec.label, 1
            batch = _BATCH.match(label)
            if batch is not None:   # a task that fitted n last steps together (batch_fit_name)
                n, label = int(batch.group(1)), "fit " + label[batch.end():]
            head = label[: label.find("(") + 1]
            step = heads.get(head)
            if step is None:   # a step label holding "(": the longest head that matches
                step = max((s for h, s in heads.items() if label.startswith(h)), key=len, default=None)
            if step is None:
                continue
            ran[step] += n
            lane = str(rec.lane)
            where[step][lane] = where[step].get(lane, 0) + n
        self.ran, self.where = (ran, where) if seen else (None, None)

    def __repr__(self) -> str:
        """The fits that ran, what the store and the search's memory gave instead, per step.

        >>> SearchReport({}, {}, remembered=50, results_stored=50)
        SearchReport (nothing fitted: all 50 (candidate, fold) results loaded from the store, 0.000 s)
        """
        done, naive = self.total
        ran = self.ran is not None
        store = bool(self.stored or self.loaded or self.again or self.outputs)
        if not self.fits and not naive:   # no network ran: every result was there already
            whence = _whence(self.remembered, self.results_stored)
            lines = [f"SearchReport (nothing fitted: all {self.remembered} (candidate, fold) results {whence}, "
                     f"{self.seconds:.3f} s)"]
        else:
            head = f"SearchReport ({done} fits instead of {naive}"
            if self.stored:
                head += f", {self.stored} loaded from the store"
            lines = [head + f", {self.seconds:.3f} s)",
                     f"  {'step':<24} {'fits':>6}" + (f" {'loaded':>6}" if store else "") + f" {'naive':>6}"
                     + (f" {'ran':>6}  where (fit tasks)" if ran else "")]
            for k in self.fits:
                line = f"  {k:<24} {self.fits[k]:>6}" + (f" {self.loaded.get(k, 0):>6}" if store else "")
                line += f" {self.naive.get(k, 0):>6}"
                if self.ran is not None and self.where is not None:
                    line += f" {self.ran.get(k, 0):>6}  " + ", ".join(f"{n} on {lane}"
                                                                     for lane, n in self.where.get(k, {}).items())
                lines.append(line)
        if self.batched:
            line = f"  {self.batched} last-step fits done in batches (gpunets.tuning.batched)"
            if self.batched_gpu:   # which equality the GPU batches promise (gpunets.tuning.batched_gpu)
                exact = self.batched_gpu - self.batched_close
                said = ([f"{exact} scored bit for bit"] if exact else []) + \
                    ([f"{self.batched_close} scored within 1e-9 relative"] if self.batched_close else [])
                line += f", {self.batched_gpu} on the GPU (one SVD per fold; fits bit for bit, {' and '.join(said)})"
            lines.append(line)
        if self.one_pass is not None:
            lines.extend("  " + line for line in str(self.one_pass).splitlines())
        if (self.remembered or self.warm) and (self.fits or naive):
            lines.append(f"  {self.remembered} (candidate, fold) results {_whence(self.remembered, self.results_stored)}"
                         f", {self.warm} warm-started fits")
        if store:
            line = f"  {self.stored} step fits loaded from the store"
            if self.again:
                line += (f"; {sum(self.again.values())} of them fitted again for their training output (counted in "
                         f"fits: {', '.join(f'{k}: {v}' for k, v in self.again.items())}; "
                         "gn.Store(path, outputs=True) keeps such outputs)")
            if self.outputs:
                line += f"; {self.outputs} training outputs loaded"
            lines.append(line)
        if self.refit_stored or self.refit_again:
            lines.append(f"  {self.refit_stored} steps of the refit loaded from the store"
                         + (f", {self.refit_again} fitted again for their output" if self.refit_again else ""))
        if self.reused or self.refit_reused:
            lines.append(f"  {sum(self.reused.values())} upstream step fits reused from the search's memory "
                         f"({', '.join(f'{k}: {v}' for k, v in self.reused.items()) or 'none'}), "
                         f"{self.refit_reused} in the refit")
        for i, r in enumerate(self.rungs):
            done, naive = r.total
            if naive:
                lines.append(f"  rung {i}: {r.candidates} candidates, {done} fits instead of {naive} "
                             f"({r.warm} warm, {r.stored} loaded, {r.remembered} results remembered)")
            else:
                lines.append(f"  rung {i}: {r.candidates} candidates, nothing fitted: all {r.remembered} results "
                             f"{_whence(r.remembered, r.results_stored)}")
        lines += [f"  candidate {i} {params} failed: {err}" for i, (params, err) in self.errors.items()]
        return "\n".join(lines)


def _whence(remembered: int, from_store: int) -> str:
    """Where ``remembered`` (candidate, fold) results came from.

    >>> _whence(6, 2)
    "not computed again (2 loaded from the store, 4 from the search's memory)"
    """
    if from_store == remembered:
        return "loaded from the store"
    if not from_store:
        return "remembered (the search's memory)"
    return f"not computed again ({from_store} loaded from the store, {remembered - from_store} from the search's memory)"
