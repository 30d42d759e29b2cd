"""``from_sklearn``: checks its argument and builds the composite."""

from __future__ import annotations

from typing import Any

from gpunets.sklearn_import.composite import make_composite

__all__ = ["from_sklearn", "not_an_estimator", "unknown_options"]


def not_an_estimator(obj: Any) -> TypeError:
    """The error for an argument that is not a scikit-learn estimator."""
    kind = "a class" if isinstance(obj, type) else f"an object of type {type(obj).__module__}.{type(obj).__qualname__}"
    hint = (" Hint: pass an instance, e.g. from_sklearn(make_pipeline(StandardScaler(), Ridge()))."
            if isinstance(obj, type) else " Hint: pass a scikit-learn estimator such as a Pipeline.")
    return TypeError(f"from_sklearn needs a scikit-learn estimator (an object with fit and get_params); got "
                     f"{kind}: {obj!r:.80}.{hint}")


def unknown_options(given: dict[str, Any]) -> TypeError:
    """The error for keyword arguments ``from_sklearn`` does not take, with a hint for scikit-learn's habits.

    >>> print(unknown_options({"n_jobs": -1}))
    from_sklearn() got an unexpected keyword argument 'n_jobs'. Hint: gpunets' name for n_jobs is workers: from_sklearn(..., workers=None) runs on all cores (the default; n_jobs=k is workers=k). from_sklearn takes executor=, device=, workers=, reuse_fitted= and split_forests=.
    """
    name = sorted(given)[0]
    hints = {
        "n_jobs": ("gpunets' name for n_jobs is workers: from_sklearn(..., workers=None) runs on all cores "
                   "(the default; n_jobs=k is workers=k)."),
        "memory": ("a converted composition keeps its fitted parts between fits itself; on disk, across processes: "
                   "gn.set_config(store='path/to/dir') (docs/store.md)."),
        "verbose": "the fit's report says what ran: model.fit_report_ (or gn.config(progress=True)).",
    }
    if "__" in name or name in ("steps", "transformers", "estimators"):
        hint = (f"parameters of the composition are set on it before converting, or with "
                f"model.set_params({name}=...) after.")
    else:
        hint = hints.get(name, "")
    msg = (f"from_sklearn() got an unexpected keyword argument {name!r}.{' Hint: ' + hint if hint else ''} "
           "from_sklearn takes executor=, device=, workers=, reuse_fitted= and split_forests=.")
    return TypeError(msg)


def from_sklearn(estimator: Any, *, executor: Any = "auto", device: Any = "auto", workers: int | None = None,
                 reuse_fitted: bool = False, split_forests: bool | None = None, **unknown: Any) -> Any:
    """Turn a scikit-learn composition into a gpunets composite whose network mirrors it.

    ``Pipeline``, ``FeatureUnion``, ``ColumnTransformer``, ``VotingRegressor`` /
    ``VotingClassifier``, ``StackingRegressor`` / ``StackingClassifier`` and
    ``TransformedTargetRegressor`` become networks, recursively; any other
    estimator is one machine (a meta-estimator gpunets does not know, such as
    ``OneVsRestClassifier``, is one opaque machine and ``conversion_`` says so).
    Predictions, probabilities, transforms and feature names are the
    original's; so are the parameter names.

    Parameters
    ----------
    estimator : scikit-learn estimator
        The composition (fitted or not: it is cloned and never changed; its fitted state is reused only with ``reuse_fitted``).
    executor : str or Executor, default="auto"
        Where independent branches run concurrently (``"serial"``, ``"threads"``, ``"streams"``, ``"dask"``).
    device : str, default="auto"
        ``"cuda"`` puts each leaf on its GPU twin where one exists (see :mod:`gpunets.compute.models`).
    workers : int, optional
        Concurrent tasks for the executor.

    reuse_fitted : bool, default=False
        When ``estimator`` is fitted, its fitted parts are adopted at the first ``fit`` wherever the
        structure allows (same class and parameters, every upstream part adopted too); the fit skips
        them, and ``conversion_`` says per machine what was adopted (stacks always train).
    split_forests : bool, optional
        Random and extra-trees forests become one machine per chunk of trees (as many chunks as
        workers) and a join, so their trees train side by side with the rest of the network;
        predictions are the unsplit forest's.  Default (``None``): split unless the executor is
        ``"serial"`` or there is one worker; ``False``: never (a forest is one machine).  Forests with
        ``oob_score`` or ``warm_start``, and with ``reuse_fitted``, are never split.

    Returns
    -------
    FromSklearnRegressor, FromSklearnClassifier or FromSklearnTransformer

    Raises
    ------
    TypeError
        ``estimator`` is not a scikit-learn estimator, or a keyword argument is not one of the above
        (scikit-learn's ``n_jobs`` is ``workers`` here: the error says so).

    Examples
    --------
    >>> import numpy as np, gpunets as gn
    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.preprocessing import StandardScaler
    >>> from sklearn.linear_model import Ridge
    >>> rng = np.random.default_rng(0)
    >>> X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    >>> model = gn.from_sklearn(make_pipeline(StandardScaler(), Ridge()), executor="serial").fit(X, y)
    >>> bool(np.allclose(model.predict(X), make_pipeline(StandardScaler(), Ridge()).fit(X, y).predict(X)))
    True
    >>> model.set_params(ridge__alpha=3.0).fit(X, y).fit_report_.actions.by_label()
    {'standardscaler': 'skip', 'ridge': 'update'}
    """
    if unknown:
        raise unknown_options(unknown)
    if isinstance(estimator, type) or not (callable(getattr(estimator, "fit", None))
                                           and callable(getattr(estimator, "get_params", None))):
        raise not_an_estimator(estimator)
    model = make_composite(estimator, executor=executor, device=device, workers=workers,
                           reuse_fitted=reuse_fitted, split_forests=split_forests)
    if reuse_fitted:
        model._gn_fitted_original = estimator
    return model
