"""The user-facing verbs on networks: fit, evaluate, report, replace, display.

Owns ``gn.fit`` / ``gn.evaluate`` and calling a node (``network``: compile a plan, pick an executor, run,
convert the output), fit reports and fitted parameters (``report``), ``gn.replace`` (``replace``) and the
pictures of a network (``display``).  May import :mod:`gpunets.executors`, :mod:`gpunets.planning` and
everything below; the lower layers reach it only through :mod:`gpunets.base.verbs`.
"""
