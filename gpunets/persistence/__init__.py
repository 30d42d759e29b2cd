"""Persistence: saving and loading fitted networks and composites, without their training data.

Owns ``gn.save`` / ``gn.load`` and the trust rules for files (``persist``) and the object-graph codec
(``_persist_codec``).  May import :mod:`gpunets.compose` and everything below it.
"""
