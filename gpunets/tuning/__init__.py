"""Hyperparameter search as one learning network (see :mod:`gpunets.tuning.search`).

* ``search.py``: :class:`GridSearchCV`, :class:`RandomizedSearchCV` (scikit-learn's API and attributes);
* ``halving.py``: :class:`HalvingGridSearchCV`, :class:`HalvingRandomSearchCV` (successive halving, one
  network per rung); ``warm.py``: iteration budgets warm-started across rungs;
* ``memory.py``: a search's memory of its results (resume after an interrupt, grow a grid);
* ``dropin.py``: scikit-learn's ``n_jobs``, ``verbose``, ``pre_dispatch`` and callbacks;
* ``networks.py``: building the search network fold by fold, equal machines merged;
* ``tasks.py``: what its nodes run (fits, transforms, scores; failures passed on as values);
* ``report.py``: :class:`SearchReport`, the fits done against a candidate-by-candidate search.
"""

from __future__ import annotations

from gpunets.tuning.halving import HalvingGridSearchCV, HalvingRandomSearchCV
from gpunets.tuning.report import SearchReport
from gpunets.tuning.search import GridSearchCV, RandomizedSearchCV
from gpunets.tuning.tasks import step_key

__all__ = ["GridSearchCV", "HalvingGridSearchCV", "HalvingRandomSearchCV", "RandomizedSearchCV", "SearchReport",
           "step_key"]
