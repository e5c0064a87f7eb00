"""``python -m qkv.cli``, as the benchmarks start it: the same as ``python -m qkv``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
