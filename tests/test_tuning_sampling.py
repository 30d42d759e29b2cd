"""A randomized search draws its candidates once per fit, as scikit-learn's does (issue 35, item 6)."""

import numpy as np
from scipy.stats import loguniform, uniform
from sklearn.linear_model import Ridge
from sklearn.model_selection import RandomizedSearchCV

import gpunets as gn


def test_a_randomstate_object_gives_scikit_learns_candidates(gn_executor):
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 3)), rng.normal(size=60)
    dists = {"alpha": loguniform(1e-3, 1e3), "tol": uniform(1e-4, 1e-3)}
    ours = gn.RandomizedSearchCV(Ridge(), dists, n_iter=5, cv=2, random_state=np.random.RandomState(0)).fit(X, y)
    theirs = RandomizedSearchCV(Ridge(), dists, n_iter=5, cv=2, random_state=np.random.RandomState(0)).fit(X, y)
    assert ours.cv_results_["params"] == theirs.cv_results_["params"]
    np.testing.assert_array_equal(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"])
