"""gn.from_sklearn: scikit-learn compositions as networks, same answers and parameters as the original."""

import re

import numpy as np
import pandas as pd
import pytest
from scipy import sparse
from sklearn.base import clone
from sklearn.compose import (
    ColumnTransformer,
    TransformedTargetRegressor,
    make_column_selector,
)
from sklearn.decomposition import PCA
from sklearn.ensemble import (
    RandomForestRegressor,
    StackingClassifier,
    StackingRegressor,
    VotingClassifier,
    VotingRegressor,
)
from sklearn.feature_extraction.text import CountVectorizer
from sklearn.feature_selection import SelectKBest
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV
from sklearn.multiclass import OneVsRestClassifier
from sklearn.naive_bayes import GaussianNB
from sklearn.pipeline import FeatureUnion, Pipeline, make_pipeline, make_union
from sklearn.preprocessing import (
    MinMaxScaler,
    OneHotEncoder,
    QuantileTransformer,
    StandardScaler,
)
from sklearn.svm import SVC
from sklearn.tree import DecisionTreeClassifier
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpunets as gn

rng = np.random.default_rng(0)
X = rng.normal(size=(80, 4))
y = X @ [1.0, 2.0, 3.0, 4.0] + rng.normal(size=80)
yc = np.where(X[:, 0] + X[:, 1] > 0, "pos", "neg")
y3 = np.digitize(X[:, 0], [-0.5, 0.5])
df = pd.DataFrame(X, columns=["a", "b", "c", "d"])
df["cat"] = rng.choice(["x", "y", "z"], 80)
text = pd.DataFrame({"text": rng.choice(["red apple", "green pear", "red pear", "blue sky"], 80), "a": X[:, 0]})


def same(model, ref, data, ops=("predict", "predict_proba", "predict_log_proba", "decision_function", "transform")):
    done = []
    for op in ops:
        if hasattr(ref, op):
            assert hasattr(model, op), op
            a, b = getattr(model, op)(data), getattr(ref, op)(data)
            if sparse.issparse(b):
                assert sparse.issparse(a)
                a, b = a.toarray(), b.toarray()
            a, b = np.asarray(a), np.asarray(b)
            assert a.shape == b.shape, op
            if a.dtype.kind in "fc":
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
            else:
                np.testing.assert_array_equal(a, b)
            done.append(op)
    assert done
    return done


CASES = [
    ("pipeline", lambda: make_pipeline(StandardScaler(), Ridge()), X, y),
    ("pipeline-passthrough", lambda: Pipeline([("s", StandardScaler()), ("skip", "passthrough"), ("n", None),
                                               ("r", Ridge())]), X, y),
    ("pipeline-transformer", lambda: make_pipeline(StandardScaler(), PCA(2)), X, None),
    ("pipeline-selectkbest", lambda: make_pipeline(SelectKBest(k=2), LinearRegression()), X, y),
    ("union-weights-drop", lambda: make_pipeline(FeatureUnion([("s", StandardScaler()), ("p", PCA(2)),
                                                                ("gone", "drop"), ("id", "passthrough")],
                                                               transformer_weights={"p": 2.0}), Ridge()), X, y),
    ("union-sparse", lambda: make_union(StandardScaler(), OneHotEncoder()), X[:, :1].round(), None),
    ("ct-names-remainder", lambda: make_pipeline(ColumnTransformer(
        [("num", StandardScaler(), ["a", "b"]), ("cat", OneHotEncoder(), ["cat"])], remainder="passthrough"),
        Ridge()), df, y),
    ("ct-selector-remainder-est", lambda: make_pipeline(ColumnTransformer(
        [("num", StandardScaler(), make_column_selector(dtype_include="number", pattern="[ab]")),
         ("cat", OneHotEncoder(sparse_output=False), make_column_selector(dtype_include=object))],
        remainder=MinMaxScaler(), transformer_weights={"num": 0.5}), Ridge()), df, y),
    ("ct-index-mask-callable", lambda: ColumnTransformer(
        [("i", StandardScaler(), [0, 2]), ("m", MinMaxScaler(), np.array([False, True, False, False])),
         ("c", "passthrough", lambda X: [3])]), X, None),
    ("ct-sparse", lambda: ColumnTransformer([("oh", OneHotEncoder(), ["cat"]), ("n", "passthrough", ["a"])],
                                            sparse_threshold=0.9), df, None),
    ("ct-dense", lambda: ColumnTransformer([("oh", OneHotEncoder(), ["cat"]), ("n", "passthrough", ["a"])],
                                           sparse_threshold=0.0), df, None),
    ("ct-all-dropped", lambda: ColumnTransformer([("d", "drop", ["a"])]), df[["a"]], None),
    ("voting-regressor", lambda: VotingRegressor([("r", Ridge()), ("rf", RandomForestRegressor(10, random_state=0)),
                                                  ("x", "drop")], weights=[1, 3, 5]), X, y),
    ("voting-hard", lambda: VotingClassifier([("lr", LogisticRegression()), ("nb", GaussianNB()),
                                              ("dt", DecisionTreeClassifier(random_state=0))]), X, yc),
    ("voting-hard-weights", lambda: VotingClassifier([("lr", LogisticRegression()), ("nb", GaussianNB()),
                                                      ("dt", DecisionTreeClassifier(random_state=0))],
                                                     weights=[1, 1, 3]), X, y3),
    ("voting-soft", lambda: VotingClassifier([("lr", LogisticRegression()), ("nb", GaussianNB())], voting="soft",
                                             weights=[2, 1]), X, y3),
    ("stacking-regressor", lambda: StackingRegressor([("r", Ridge()), ("rf", RandomForestRegressor(8, random_state=0))],
                                                     final_estimator=Ridge(), cv=3), X, y),
    ("stacking-classifier", lambda: make_pipeline(StandardScaler(), StackingClassifier(
        [("lr", LogisticRegression()), ("nb", GaussianNB())], cv=3)), X, yc),
    ("ttr-transformer", lambda: TransformedTargetRegressor(Ridge(), transformer=QuantileTransformer(n_quantiles=20)),
     X, y),
    ("ttr-func", lambda: make_pipeline(StandardScaler(), TransformedTargetRegressor(
        Ridge(), func=np.log1p, inverse_func=np.expm1)), X, np.abs(y)),
    ("opaque", lambda: OneVsRestClassifier(LogisticRegression()), X, y3),
    ("pipeline-svc-decision", lambda: make_pipeline(StandardScaler(), SVC(probability=False)), X, yc),
    ("ct-text-scalar-column", lambda: make_pipeline(ColumnTransformer(
        [("words", CountVectorizer(), "text"), ("num", StandardScaler(), ["a"])]), LogisticRegression()), text, yc),
    ("union-inside-ct", lambda: make_pipeline(ColumnTransformer(
        [("both", make_union(StandardScaler(), PCA(1)), ["a", "b", "c"])], remainder="drop"), Ridge()), df, y),
    ("voting-soft-pandas", lambda: make_pipeline(ColumnTransformer([("n", StandardScaler(), ["a", "b"])]),
                                                 VotingClassifier([("lr", LogisticRegression()),
                                                                   ("dt", DecisionTreeClassifier(random_state=0))],
                                                                  voting="soft")), df, yc),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_answers_as_sklearn(case, executor):
    _name, make, data, target = case
    ref = make().fit(data, target)
    model = gn.from_sklearn(make()).fit(data, target)
    same(model, ref, data)
    if hasattr(ref, "classes_"):
        np.testing.assert_array_equal(model.classes_, ref.classes_)


@pytest.mark.parametrize("case", [c for c in CASES if c[0].startswith(("ct", "union", "pipeline-t"))],
                         ids=lambda c: c[0])
def test_feature_names_out(case):
    _name, make, data, target = case
    ref = make().fit(data, target)
    if not hasattr(ref[-1] if isinstance(ref, Pipeline) else ref, "get_feature_names_out"):
        ref = ref[:-1]
        make = (lambda m=make: m()[:-1])
    model = gn.from_sklearn(make(), executor="serial").fit(data, target)
    np.testing.assert_array_equal(model.get_feature_names_out(), ref.get_feature_names_out())


def test_verbose_feature_names_out_false():
    ct = ColumnTransformer([("s", StandardScaler(), ["a"]), ("p", "passthrough", ["b"])],
                           verbose_feature_names_out=False)
    model = gn.from_sklearn(ct, executor="serial").fit(df)
    assert model.get_feature_names_out().tolist() == ["a", "b"] == clone(ct).fit(df).get_feature_names_out().tolist()


SET_OUTPUT_CASES = [
    ("ct", lambda: ColumnTransformer([("s", StandardScaler(), ["a", "b"]),
                                      ("o", OneHotEncoder(sparse_output=False), ["cat"])], remainder="passthrough")),
    ("ct-short-names", lambda: ColumnTransformer([("s", StandardScaler(), ["a", "b"])], remainder="passthrough",
                                                 verbose_feature_names_out=False)),
    ("union", lambda: make_union(StandardScaler(), PCA(2))),
    ("pipeline", lambda: make_pipeline(ColumnTransformer([("s", StandardScaler(), ["a", "b"])]),
                                       make_union(StandardScaler(), PCA(1)))),
]


@pytest.mark.parametrize("case", SET_OUTPUT_CASES, ids=[c[0] for c in SET_OUTPUT_CASES])
def test_set_output_pandas_is_reproduced(case, executor):
    _name, make = case
    data = df.set_index(np.arange(100, 180)) if _name.startswith(("ct", "pipeline")) else df[["a", "b", "c", "d"]]
    ref = make().set_output(transform="pandas").fit(data, y).transform(data)
    out = gn.from_sklearn(make().set_output(transform="pandas")).fit(data, y).transform(data)
    pd.testing.assert_frame_equal(out, ref)


def test_global_transform_output_is_followed(executor):
    """scikit-learn's global transform_output, followed as scikit-learn follows it: on every executor (its
    configuration is per thread: the caller's reaches the workers) and on a GPU (the leaves then run on the
    host, where frames are built, as with an estimator's own set_output) (issue 24 item 6)."""
    import sklearn

    data = df[["a", "b", "c", "d"]]
    with sklearn.config_context(transform_output="pandas"):
        ref = make_union(StandardScaler(), PCA(2)).fit(data).transform(data)
        out = gn.from_sklearn(make_union(StandardScaler(), PCA(2)), executor=executor).fit(data).transform(data)
    pd.testing.assert_frame_equal(out, ref)


def test_the_callers_scikit_learn_configuration_reaches_the_tasks(executor):
    """A plain network: a machine's transform runs on a worker thread (or process) under the caller's
    scikit-learn configuration, as scikit-learn's Parallel runs its jobs."""
    import sklearn

    data = df[["a", "b", "c", "d"]]
    X = gn.source(data, name="X")
    W = gn.hstack(gn.machine(StandardScaler(), X).transform(X), gn.machine(MinMaxScaler(), X).transform(X))
    with sklearn.config_context(transform_output="pandas"):
        W.fit(executor=executor, force=True)
        parts = [m(executor=executor) for m in (W.args[0], W.args[1])]
    for part, ref in zip(parts, (StandardScaler(), MinMaxScaler())):
        with sklearn.config_context(transform_output="pandas"):
            expected = ref.fit_transform(data)
        pd.testing.assert_frame_equal(part, expected)


w = rng.uniform(0.1, 3.0, 80)
FIT_PARAM_CASES = [
    ("pipeline", lambda: make_pipeline(StandardScaler(), Ridge()), {"ridge__sample_weight": w}, y),
    ("nested-voting", lambda: make_pipeline(StandardScaler(), VotingRegressor(
        [("r", Ridge()), ("f", RandomForestRegressor(8, random_state=0))])), {"votingregressor__sample_weight": w}, y),
    ("voting", lambda: VotingRegressor([("r", Ridge()), ("f", RandomForestRegressor(8, random_state=0))]),
     {"sample_weight": w}, y),
    ("stack", lambda: StackingRegressor([("r", Ridge()), ("f", RandomForestRegressor(8, random_state=0))],
                                        final_estimator=Ridge()), {"sample_weight": w}, y),
    ("ttr", lambda: TransformedTargetRegressor(make_pipeline(StandardScaler(), Ridge()), func=np.log1p,
                                               inverse_func=np.expm1), {"ridge__sample_weight": w}, np.abs(y)),
    ("voting-classifier", lambda: VotingClassifier([("l", LogisticRegression()), ("g", GaussianNB())], voting="soft"),
     {"sample_weight": w}, yc),
    ("union", lambda: make_pipeline(make_union(StandardScaler(), MinMaxScaler()), Ridge()),
     {"ridge__sample_weight": w}, y),
]


@pytest.mark.parametrize("case", FIT_PARAM_CASES, ids=[c[0] for c in FIT_PARAM_CASES])
def test_fit_params_are_routed_as_sklearn_does(case, executor):
    _name, make, params, target = case
    op = "predict_proba" if _name.endswith("classifier") else "predict"
    ref = make().fit(X, target, **params)
    model = gn.from_sklearn(make()).fit(X, target, **params)
    np.testing.assert_allclose(getattr(model, op)(X), getattr(ref, op)(X), rtol=0, atol=1e-12)
    unweighted = getattr(make().fit(X, target), op)(X)
    assert not np.allclose(unweighted, getattr(ref, op)(X))   # the weights matter in every case


def test_new_weights_retrain_what_takes_them():
    model = gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor="serial")
    model.fit(X, y, ridge__sample_weight=w)
    model.fit(X, y, ridge__sample_weight=w[::-1].copy())
    actions = model.fit_report_.actions.by_label()
    assert actions["standardscaler"] == "skip" and actions["ridge"] != "skip"


@pytest.mark.parametrize("params, error, match", [
    ({"sample_weight": w}, ValueError, "stepname__parameter"),
    ({"nostep__sample_weight": w}, ValueError, "no step named 'nostep'"),
    ({"ridge__foo": 1}, TypeError, r"Ridge.fit \(at 'ridge'\) does not take \['foo'\]"),
])
def test_bad_fit_params_raise_before_training(params, error, match):
    model = gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor="serial")
    with pytest.raises(error, match=match):
        model.fit(X, y, **params)
    assert not hasattr(model, "fit_report_")


def test_weights_for_a_member_that_cannot_take_them_name_it():
    from sklearn.neighbors import KNeighborsRegressor

    vote = VotingRegressor([("r", Ridge()), ("knn", KNeighborsRegressor())])
    with pytest.raises(TypeError, match=r"KNeighborsRegressor.fit \(at 'knn'\) does not take"):
        gn.from_sklearn(vote, executor="serial").fit(X, y, sample_weight=w)
    with pytest.raises(TypeError, match="only sample_weight"):
        gn.from_sklearn(VotingRegressor([("r", Ridge())]), executor="serial").fit(X, y, r__sample_weight=w)


def test_pandas_selected_by_name_at_predict(executor):
    ct = make_pipeline(ColumnTransformer([("num", StandardScaler(), ["a", "b"]), ("cat", OneHotEncoder(), ["cat"])]),
                       Ridge())
    ref, model = clone(ct).fit(df, y), gn.from_sklearn(ct).fit(df, y)
    shuffled = df[["cat", "b", "a", "c", "d"]]
    np.testing.assert_allclose(model.predict(shuffled), ref.predict(shuffled), rtol=0, atol=1e-12)


def test_random_state_gives_identical_predictions(executor):
    est = VotingRegressor([("rf1", RandomForestRegressor(15, random_state=1)),
                           ("rf2", RandomForestRegressor(15, max_features=0.5, random_state=2))])
    np.testing.assert_array_equal(gn.from_sklearn(est).fit(X, y).predict(X), clone(est).fit(X, y).predict(X))


def test_params_use_the_original_names():
    pipe = make_pipeline(ColumnTransformer([("num", make_pipeline(StandardScaler()), ["a"])]), Ridge())
    model = gn.from_sklearn(pipe)
    params = model.get_params()
    assert params["ridge__alpha"] == 1.0
    assert params["columntransformer__num__standardscaler__with_mean"] is True
    assert {"executor", "device", "workers", "sklearn_estimator"} <= set(params)
    model.set_params(ridge__alpha=3.0, columntransformer__num__standardscaler__with_mean=False, executor="serial")
    assert model.get_params()["ridge__alpha"] == 3.0 and model.executor == "serial"
    assert pipe.named_steps["ridge"].alpha == 1.0, "the user's object is never changed"
    assert clone(model).get_params()["ridge__alpha"] == 3.0


def test_set_params_then_fit_retrains_only_what_changed(executor):
    est = make_pipeline(ColumnTransformer([("num", StandardScaler(), ["a", "b"]), ("cat", OneHotEncoder(), ["cat"])]),
                        VotingRegressor([("r", Ridge()), ("rf", RandomForestRegressor(5, random_state=0))]))
    model = gn.from_sklearn(est).fit(df, y)
    acts = model.fit(df, y).fit_report_.actions.by_label()
    assert set(acts.values()) == {"skip"}
    acts = model.set_params(votingregressor__r__alpha=5.0).fit(df, y).fit_report_.actions.by_label()
    assert acts["votingregressor__r"] == "update"
    assert acts["votingregressor__rf"] == "skip" and acts["columntransformer__num"] == "skip"
    acts = model.set_params(columntransformer__num__with_mean=False).fit(df, y).fit_report_.actions.by_label()
    assert acts["columntransformer__num"] == "update" and acts["columntransformer__cat"] == "skip"
    assert acts["votingregressor__rf"] == "train"
    ref = clone(est).set_params(votingregressor__r__alpha=5.0, columntransformer__num__with_mean=False).fit(df, y)
    np.testing.assert_allclose(model.predict(df), ref.predict(df), rtol=0, atol=1e-12)


def test_grid_search_with_the_users_grid():
    est = make_pipeline(StandardScaler(), Ridge())
    grid = {"ridge__alpha": [0.1, 10.0], "standardscaler__with_mean": [True, False]}
    ours = GridSearchCV(gn.from_sklearn(est, executor="serial"), grid, cv=3).fit(X, y)
    theirs = GridSearchCV(est, grid, cv=3).fit(X, y)
    assert ours.best_params_ == theirs.best_params_
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"],
                               rtol=0, atol=1e-12)


def test_branches_are_independent_machines():
    est = ColumnTransformer([("a", StandardScaler(), [0]), ("b", MinMaxScaler(), [1]), ("c", PCA(1), [2, 3])])
    model = gn.from_sklearn(est, executor="threads", workers=2).fit(X)
    ms = model.machines_
    for n in ("a", "b", "c"):  # each part trains on the input only: nothing orders them
        assert all(getattr(a, "machine", None) is None for a in ms[n].args)


def test_opaque_meta_estimator_is_reported():
    model = gn.from_sklearn(make_pipeline(StandardScaler(), OneVsRestClassifier(LogisticRegression())),
                            executor="serial").fit(X, y3)
    assert model.report_["onevsrestclassifier"]["kind"] == "opaque"
    assert "opaque" in model.report_["onevsrestclassifier"]["notes"][0]
    assert model.conversion_["standardscaler"]["kind"] == "leaf"


def test_memory_is_ignored_with_a_note(tmp_path):
    model = gn.from_sklearn(Pipeline([("s", StandardScaler()), ("r", Ridge())], memory=str(tmp_path)),
                            executor="serial").fit(X, y)
    assert "memory is ignored" in model.conversion_["(root)"]["notes"][0]


def test_report_shows_where_each_leaf_ran():
    model = gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor="serial", device="cpu").fit(X, y)
    assert {r["device"] for r in model.report_.values()} == {"cpu"}


@pytest.mark.parametrize("bad", [42, "pipeline", Ridge, object()])
def test_not_an_estimator(bad):
    with pytest.raises(TypeError, match=r"from_sklearn needs a scikit-learn estimator.*" + (
            "a class" if isinstance(bad, type) else type(bad).__name__)):
        gn.from_sklearn(bad)


def test_fitted_original_accepted_and_untouched():
    est = make_pipeline(StandardScaler(), Ridge()).fit(X, y)
    coef = est[-1].coef_.copy()
    model = gn.from_sklearn(est, executor="serial")
    assert not hasattr(model.sklearn_estimator[-1], "coef_")
    model.fit(X[:40], y[:40])
    np.testing.assert_array_equal(est[-1].coef_, coef)
    assert set(model.fit_report_.actions.by_label().values()) == {"train"}


def test_missing_column_raises_sklearns_error_before_training(executor):
    est = ColumnTransformer([("ok", StandardScaler(), ["a"]), ("bad", StandardScaler(), ["nope"])])
    with pytest.raises(ValueError) as ours:
        gn.from_sklearn(est).fit(df)
    with pytest.raises(ValueError) as theirs:
        clone(est).fit(df)
    assert str(ours.value) == str(theirs.value)
    model = gn.from_sklearn(est)
    with pytest.raises(ValueError):
        model.fit(df)
    assert not hasattr(model, "fit_report_")


def test_repr_and_html_show_the_original():
    est = make_pipeline(StandardScaler(), Ridge())
    model = gn.from_sklearn(est, executor="serial")
    assert repr(model).startswith("from_sklearn(Pipeline(steps=[('standardscaler', StandardScaler())")
    html = model._repr_html_()
    assert "StandardScaler" in html and "Ridge" in html


class Rendezvous(StandardScaler):
    """A scaler whose fit waits for its twin's: it only completes when two fits run at the same time."""

    def __init__(self, barrier=None, *, copy=True, with_mean=True, with_std=True):
        super().__init__(copy=copy, with_mean=with_mean, with_std=with_std)
        self.barrier = barrier

    def fit(self, X, y=None, sample_weight=None):
        self.barrier.wait(timeout=20)
        return super().fit(X, y)

    def __sklearn_clone__(self):  # the barrier is shared, not copied
        return type(self)(self.barrier, copy=self.copy, with_mean=self.with_mean, with_std=self.with_std)


def test_independent_branches_run_concurrently():
    import threading

    barrier = threading.Barrier(2)
    est = ColumnTransformer([("a", Rendezvous(barrier), [0, 1]), ("b", Rendezvous(barrier), [2, 3])])
    model = gn.from_sklearn(est, executor="threads", workers=2).fit(X)  # serially, the first wait would time out
    np.testing.assert_allclose(model.transform(X), StandardScaler().fit_transform(X), rtol=0, atol=1e-12)


def test_device_placement_is_reported(gn_device):
    est = make_pipeline(StandardScaler(), Ridge())
    model = gn.from_sklearn(est, executor="serial", device=gn_device).fit(X, y)
    for rep in model.report_.values():
        assert rep["device"].startswith("cpu") == (gn_device == "cpu" or rep["path"] == "cpu_fallback"), rep
    tol = 1e-12 if gn_device == "cpu" else 1e-4  # GPU twins (cuML) may compute in another order or precision
    np.testing.assert_allclose(model.predict(X), clone(est).fit(X, y).predict(X), rtol=tol, atol=tol)


def test_reuse_fitted_adopts_what_the_structure_allows(executor):
    est = make_pipeline(ColumnTransformer([("num", StandardScaler(), ["a", "b"]), ("cat", OneHotEncoder(), ["cat"])]),
                        VotingRegressor([("r", Ridge()), ("rf", RandomForestRegressor(5, random_state=0))]))
    est.fit(df, y)
    model = gn.from_sklearn(est, reuse_fitted=True).fit(df, y)
    assert set(model.fit_report_.actions.by_label().values()) == {"skip"}
    assert model.conversion_["votingregressor__rf"]["notes"] == ["reuse_fitted: adopted"]
    np.testing.assert_array_equal(model.predict(df), est.predict(df))
    assert model.machines_["votingregressor__rf"].estimator_ is not est[-1].named_estimators_["rf"]


def test_reuse_fitted_trains_what_differs_or_cannot_be_adopted():
    stack = StackingRegressor([("r", Ridge()), ("l", LinearRegression())], final_estimator=Ridge(), cv=3)
    est = make_pipeline(StandardScaler(), stack).fit(X, y)
    model = gn.from_sklearn(est, reuse_fitted=True, executor="serial")
    model.set_params(standardscaler__with_mean=False).fit(X, y)
    acts = model.fit_report_.actions.by_label()
    assert acts["standardscaler"] == "train" and acts["stackingregressor__final_estimator"] == "train"
    assert "parameters differ" in model.conversion_["standardscaler"]["notes"][0]
    ref = clone(est).set_params(standardscaler__with_mean=False).fit(X, y)
    np.testing.assert_allclose(model.predict(X), ref.predict(X), rtol=0, atol=1e-12)
    unfitted = gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), reuse_fitted=True, executor="serial")
    assert set(unfitted.fit(X, y).fit_report_.actions.by_label().values()) == {"train"}


@pytest.mark.parametrize("make", [
    lambda: make_pipeline(StandardScaler(), Ridge()),
    lambda: make_pipeline(ColumnTransformer([("s", StandardScaler(), [0, 1])], remainder="passthrough"), Ridge()),
    lambda: VotingRegressor([("a", Ridge()), ("b", make_pipeline(StandardScaler(), Ridge()))]),
], ids=["pipeline", "columns", "voting"])
def test_reuse_fitted_parts_fitted_on_another_number_of_features_are_retrained_and_said(make, executor):
    """issue 23 item 12: a fitted original whose parts saw another number of features is not adopted there
    (fit would succeed and every predict fail): those parts train, and the conversion says why."""
    rng = np.random.default_rng(0)
    X5, X3 = rng.normal(size=(50, 5)), rng.normal(size=(50, 3))
    target = X3 @ np.array([1.0, -1.0, 0.5])
    original = make().fit(X5, rng.normal(size=50))
    model = gn.from_sklearn(original, reuse_fitted=True, executor=executor).fit(X3, target)
    notes = [n for part in model.conversion_.values() for n in part["notes"]]
    assert any("fitted on 5 features, and the data it is given here have 3" in n for n in notes)
    assert model.predict(X3).shape == (50,)       # before: fit succeeded and every predict failed
    if not any(n.endswith("adopted") for n in notes):   # nothing could be adopted: a plain fit
        np.testing.assert_allclose(model.predict(X3), make().fit(X3, target).predict(X3), rtol=1e-12)


# Every check passes (issue 35 item 15: no expected failure that passes). A pipeline of steps that all take NaN
# (StandardScaler alone) says so in its allow_nan tag, so check_estimators_nan_inf does not expect it to refuse NaN.
@parametrize_with_checks([gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor="serial"),
                          gn.from_sklearn(make_pipeline(StandardScaler(), LogisticRegression()), executor="serial"),
                          gn.from_sklearn(make_pipeline(StandardScaler()), executor="serial")])
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


@pytest.mark.parametrize("make", [
    lambda: Pipeline([]),
    lambda: Pipeline([("a", StandardScaler()), ("a", Ridge())]),
    lambda: Pipeline([("a__b", StandardScaler()), ("r", Ridge())]),
    lambda: Pipeline([("memory", StandardScaler()), ("r", Ridge())]),
    lambda: Pipeline([("r1", Ridge()), ("r", Ridge())]),                       # a regressor in the middle
    lambda: make_pipeline(Pipeline([("a", StandardScaler()), ("a", StandardScaler())]), Ridge()),   # nested
    lambda: make_pipeline(StandardScaler(), Pipeline([("r1", Ridge()), ("r", Ridge())])),
], ids=["empty", "duplicate-names", "dunder-name", "name-is-a-parameter", "regressor-in-the-middle",
        "nested-duplicates", "nested-regressor-in-the-middle"])
def test_invalid_pipelines_get_scikit_learns_errors_before_any_fit(make, executor):
    """issue 23 item 14: scikit-learn's own validation, its exception class and message, and a composite
    fitted before keeps its fitted state."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    y = X.sum(axis=1)
    with pytest.raises(Exception) as theirs:
        make().fit(X, y)
    model = gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor=executor).fit(X, y)
    before = model.predict(X)
    model.set_params(sklearn_estimator=make())
    with pytest.raises(type(theirs.value)) as ours:
        model.fit(X, y)
    assert str(ours.value) == str(theirs.value)
    np.testing.assert_array_equal(model.predict(X), before)
    with pytest.raises(type(theirs.value), match="^" + re.escape(str(theirs.value)) + "$"):
        gn.from_sklearn(make(), executor=executor).fit(X, y)


# --- issue 23 item 1: a user's subclass keeps its own methods -------------------------------------------------


class ClippedPipeline(Pipeline):
    """A user's Pipeline whose predict clips (its network would lose the override)."""

    def predict(self, X, **params):
        return np.clip(super().predict(X, **params), -1.0, 1.0)


class ScaledVoting(VotingRegressor):
    def predict(self, X):
        return 10.0 * super().predict(X)


class NamedPipeline(Pipeline):
    """A subclass that adds no method: converted as a Pipeline."""


@pytest.mark.parametrize("make, opaque", [
    (lambda: ClippedPipeline([("s", StandardScaler()), ("r", Ridge())]), ""),
    (lambda: make_pipeline(StandardScaler(), ClippedPipeline([("p", PCA(2)), ("r", Ridge())])), "clippedpipeline"),
    (lambda: ScaledVoting([("a", Ridge()), ("b", Ridge(alpha=5.0))]), ""),
    (lambda: VotingRegressor([("a", ClippedPipeline([("s", StandardScaler()), ("r", Ridge())])),
                              ("b", Ridge())]), "a"),
], ids=["pipeline", "nested-pipeline", "voting", "voting-member"])
def test_a_subclass_that_overrides_methods_runs_as_one_opaque_machine(make, opaque, executor):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    y = X @ np.array([1.0, 2.0, -1.0, 0.5])
    expected = make().fit(X, y).predict(X)
    model = gn.from_sklearn(make(), executor=executor).fit(X, y)
    np.testing.assert_allclose(model.predict(X), expected, rtol=1e-12)
    part = model.conversion_[opaque or "(root)"] if opaque or "(root)" in model.conversion_ else None
    part = part or next(v for k, v in model.conversion_.items() if v["kind"] == "opaque")
    assert part["kind"] == "opaque"
    assert any("overrides ['predict']" in n and "opaque machine" in n for n in part["notes"])


def test_a_subclass_adding_no_method_is_converted_as_its_base():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    model = gn.from_sklearn(NamedPipeline([("s", StandardScaler()), ("r", Ridge())])).fit(X, y)
    assert set(model.machines_) == {"s", "r"}
    np.testing.assert_allclose(model.predict(X), NamedPipeline([("s", StandardScaler()), ("r", Ridge())])
                               .fit(X, y).predict(X), rtol=1e-12)


# --- issue 23 item 5: ensembles' feature names, at every depth -------------------------------------------------


@pytest.mark.parametrize("make, target", [
    (lambda: VotingRegressor([("a", Ridge()), ("b", Ridge(alpha=2.0))]), "reg"),
    (lambda: VotingClassifier([("a", LogisticRegression()), ("b", DecisionTreeClassifier(random_state=0))]), "clf"),
    (lambda: VotingClassifier([("a", LogisticRegression()), ("b", GaussianNB())], voting="soft"), "clf"),
    (lambda: StackingRegressor([("a", Ridge()), ("b", Ridge(alpha=2.0))]), "reg"),
    (lambda: StackingRegressor([("a", Ridge()), ("b", Ridge(alpha=2.0))], passthrough=True), "reg"),
    (lambda: StackingClassifier([("a", LogisticRegression()), ("b", GaussianNB())]), "clf"),
    (lambda: make_pipeline(StandardScaler(), VotingRegressor([("a", Ridge()), ("b", Ridge(alpha=2.0))])), "reg"),
    (lambda: make_union(StandardScaler(), StackingClassifier([("a", LogisticRegression()), ("b", GaussianNB())])),
     "clf"),
    (lambda: make_pipeline(make_union(PCA(2), VotingRegressor([("v", Ridge())])), StackingRegressor(
        [("a", Ridge())], passthrough=True)), "reg"),
], ids=["voting-reg", "voting-hard", "voting-soft", "stack-reg", "stack-passthrough", "stack-clf",
        "pipeline-voting", "union-stack", "deep"])
def test_ensembles_feature_names_equal_scikit_learns(make, target):
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.normal(size=(60, 3)), columns=["a", "b", "c"])
    y = X.sum(axis=1) if target == "reg" else (X["a"] > 0).astype(int) + (X["b"] > 0)
    expected = make().fit(X, y).get_feature_names_out()
    got = gn.from_sklearn(make()).fit(X, y).get_feature_names_out()
    np.testing.assert_array_equal(got, expected)


# --- issue 23 item 17: what was asked, what ran, one warning per machine -------------------------------------


def test_cuda_without_a_gpu_reports_what_was_asked_and_warns_once_per_machine(no_gpu, executor):
    import warnings

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = X.sum(axis=1)
    est = make_pipeline(StandardScaler(), VotingRegressor([("a", Ridge()), ("b", Ridge(alpha=3.0))]))
    model = gn.from_sklearn(est, device="cuda", executor=executor)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, gn.DeviceFallbackWarning)]
    named = sorted(m for m in model.machines_ if any(f"machine {m} in its network" in msg for msg in fallbacks))
    assert named == sorted(model.machines_) == ["standardscaler", "votingregressor__a", "votingregressor__b"]
    assert len(fallbacks) == 3                                    # once per (machine, reason)
    for rep in model.report_.values():
        assert (rep["asked"], rep["device"]) == ("cuda:0", "cpu")
    rows = model.fit_report_.rows()
    assert all((r["asked"], r["device"]) == ("cuda:0", "cpu") for r in rows)
    assert "cpu (asked cuda:0)" in str(model.fit_report_)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        model.set_params(votingregressor__a__alpha=2.0).fit(X, y)
    assert not [w for w in again if issubclass(w.category, gn.DeviceFallbackWarning)]   # not at every fit
    np.testing.assert_allclose(model.predict(X), est.set_params(votingregressor__a__alpha=2.0).fit(X, y).predict(X))
