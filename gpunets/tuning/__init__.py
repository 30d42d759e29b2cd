"""Hyperparameter search as one learning network (see :mod:`gpunets.tuning.search`).

* ``search.py``: :class:`GridSearchCV`, :class:`RandomizedSearchCV` (scikit-learn's API and attributes);
* ``networks.py``: building the search network fold by fold, equal machines merged;
* ``tasks.py``: what its nodes run (fits, transforms, scores; failures passed on as values);
* ``report.py``: :class:`SearchReport`, the fits done against a candidate-by-candidate search.
"""

from __future__ import annotations

from gpunets.tuning.report import SearchReport
from gpunets.tuning.search import GridSearchCV, RandomizedSearchCV
from gpunets.tuning.tasks import step_key

__all__ = ["GridSearchCV", "RandomizedSearchCV", "SearchReport", "step_key"]
