"""gpunets benchmarks: run them all with ``python -m benchmarks [--quick]``."""
