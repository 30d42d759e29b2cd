"""The store of fitted states (issue 26): a search or a network fit interrupted by Ctrl-C
(KeyboardInterrupt), run again with the store, fits only what was not finished."""

import threading
import time

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.linear_model import Ridge
from sklearn.metrics import make_scorer, r2_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import gpunets as gn

_LOCK = threading.Lock()
_COUNT = {"fits": 0, "started": 0, "limit": None, "scores": 0, "score_limit": None}


def _reset(limit=None, score_limit=None):
    _COUNT.update(fits=0, started=0, limit=limit, scores=0, score_limit=score_limit)


def _start():
    """Count a fit's start. Once ``limit`` fits have started, the next one waits for them to finish, then raises
    KeyboardInterrupt (Ctrl-C): exactly ``limit`` fits finish, however many run at once (on 16 cores and a GPU
    all three Ridges of the network start together, and a check of finished fits at the start saw none)."""
    with _LOCK:
        over = _COUNT["limit"] is not None and _COUNT["started"] >= _COUNT["limit"]
        if not over:
            _COUNT["started"] += 1
    if over:
        deadline = time.monotonic() + 60
        while _COUNT["fits"] < _COUNT["limit"] and time.monotonic() < deadline:
            time.sleep(0.001)
        raise KeyboardInterrupt


class CountedRidge(Ridge):
    """A Ridge that counts its finished fits; the fit started once ``limit`` fits started raises KeyboardInterrupt."""

    def fit(self, X, y, sample_weight=None):
        _start()
        super().fit(X, y, sample_weight=sample_weight)
        with _LOCK:
            _COUNT["fits"] += 1
        return self


class CountedScaler(StandardScaler):
    def fit(self, X, y=None, sample_weight=None):
        _start()
        super().fit(X, y, sample_weight=sample_weight)
        with _LOCK:
            _COUNT["fits"] += 1
        return self


def _score(y_true, y_pred):
    with _LOCK:
        if _COUNT["score_limit"] is not None and _COUNT["scores"] >= _COUNT["score_limit"]:
            raise KeyboardInterrupt
        _COUNT["scores"] += 1
    return r2_score(y_true, y_pred)


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(300, 10)), rng.normal(size=300)


def _search(executor):
    pipe = make_pipeline(CountedScaler(), PCA(4), CountedRidge())
    return gn.GridSearchCV(pipe, {"countedridge__alpha": [0.1, 1.0, 10.0]}, cv=3, scoring=make_scorer(_score),
                           executor=executor, refit=False)   # the refit is not a search step


_STEP_FITS = 3 + 3 * 3   # a scaler per fold and a Ridge per (candidate, fold); the PCA is not counted


@pytest.fixture
def cold():
    X, y = _data()
    _reset()
    search = _search("serial").fit(X, y)
    assert _COUNT["fits"] == _STEP_FITS and _COUNT["scores"] == 9
    return search


@pytest.mark.parametrize("executor", ["serial", "threads", "streams"])
@pytest.mark.parametrize("where", ["fit", "score"])
def test_an_interrupted_search_resumes_where_it_stopped(tmp_path, cold, executor, where):
    X, y = _data()
    with gn.config(store=gn.Store(tmp_path / "s"), workers=2):
        _reset(limit=6 if where == "fit" else None, score_limit=4 if where == "score" else None)
        with pytest.raises(KeyboardInterrupt):
            _search(executor).fit(X, y)
        fits, scores = _COUNT["fits"], _COUNT["scores"]
        assert 0 < fits < _STEP_FITS and scores < 9
        _reset()
        again = _search(executor).fit(X, y)
        # no step fitted twice, no (candidate, fold) scored twice: each was kept as soon as it was done
        assert _COUNT["fits"] == _STEP_FITS - fits
        assert _COUNT["scores"] == 9 - scores
        assert again.search_report_.remembered == scores
        for k in ("mean_test_score", "split0_test_score", "split2_test_score", "rank_test_score"):
            np.testing.assert_array_equal(again.cv_results_[k], cold.cv_results_[k])
        _reset()
        third = _search(executor).fit(X, y)   # and once finished, a third run fits and scores nothing
        assert _COUNT["fits"] == 0 and _COUNT["scores"] == 0 and third.search_report_.fitted == 0


def _network(Xd, yd):
    X, y = gn.source(Xd, name="X"), gn.source(yd, name="y")
    scale = gn.machine(CountedScaler(), X)
    Z = scale.transform(X)
    P = gn.machine(PCA(3), Z).transform(Z)
    ridges = [gn.machine(CountedRidge(alpha=a), P, y) for a in (0.1, 1.0, 10.0)]
    return ridges[0].predict(P) + ridges[1].predict(P) + ridges[2].predict(P)


@pytest.mark.parametrize("executor", ["serial", "threads", "streams"])
def test_an_interrupted_network_fit_loads_what_finished(tmp_path, executor):
    Xd, yd = _data()
    _reset()
    cold = _network(Xd, yd)
    cold.fit(executor="serial")
    expected = cold()
    with gn.config(store=gn.Store(tmp_path / "s")):
        _reset(limit=2)   # the scaler and one Ridge finish, then Ctrl-C in the second Ridge's fit
        with pytest.raises(KeyboardInterrupt):
            _network(Xd, yd).fit(executor=executor)
        fits = _COUNT["fits"]
        assert fits == 2
        assert gn.store_info().entries == fits + 1            # the PCA too: each fit written when it finished
        _reset()
        net = _network(Xd, yd)
        report = net.fit(executor=executor)
        assert _COUNT["fits"] == 4 - fits                      # only the Ridges that had not finished
        actions = sorted(report.actions.by_label().values())
        assert actions.count("stored") == fits + 1 and actions.count("train") == 4 - fits
        np.testing.assert_allclose(net(), expected, rtol=0, atol=1e-12)
