"""Compute: where an estimator runs, and the single place estimators are called.

Owns the routes of an estimator (``models``: cuML twins, scikit-learn's array-API dispatch, logged CPU
fallback), fitting and applying one estimator (``estimators``), and estimators that must not run concurrently
(``threadsafety``).  May import :mod:`gpunets.devices` and :mod:`gpunets.base`; knows nothing of networks.
"""
