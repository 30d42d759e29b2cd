"""Compiling: a fit or a call of a network becomes a :class:`~gpunets.planning.plan.Plan` of tasks.

Owns which machines (re)train and why, where each task runs and which data moves (placement, constants, the
caller's scikit-learn configuration), and how tasks group into lanes.  May import :mod:`gpunets.core` and
everything below it; never runs a task.
"""
