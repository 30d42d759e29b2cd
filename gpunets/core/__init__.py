"""The network model: sources, nodes, machines, traversals and the rules of retraining.

Owns the pure graph (``nodes``), traversals and upstream digests (``graph``), machines and their retraining
rules (``machines``), what a node function receives for a trained machine (``fitted_machine``), keyword
training arguments (``weights``) and the combining nodes (``ops``, whose kernels live in
:mod:`gpunets.kernels`).  May import :mod:`gpunets.compute`, :mod:`gpunets.kernels`, :mod:`gpunets.devices`
and :mod:`gpunets.base`; it compiles and runs nothing itself (running is reached through ``base.verbs``).
"""
