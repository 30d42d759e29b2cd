"""Composition: networks exported as estimators, and stacking built on them.

Owns composite models (``composite``, with ``_composite_ops`` and ``_composite_extras``), sample weights and
metadata routing for composites (``routing``) and ``gn.StackingRegressor`` / ``gn.StackingClassifier``
(``stacking``).  May import :mod:`gpunets.api` and everything below it.
"""
