"""``python -m gpunets.kernels --ptx [--cc 80 90]``: compile every CUDA kernel to PTX (see ``_ptx``)."""

import sys

from gpunets.kernels._ptx import main

if __name__ == "__main__":
    sys.exit(main())
