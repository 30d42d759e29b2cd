"""Persistence: saving and loading fitted networks and composites, without their training data.

Owns ``gn.save`` / ``gn.load`` (``persist``), the object-graph codec (``_persist_codec``), the trust rules for
names in a file (``_persist_trust``) and the checks of a whole file before anything in it runs
(``_persist_check``).  May import :mod:`gpunets.compose` and everything below it.
"""
