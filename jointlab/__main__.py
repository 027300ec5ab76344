"""``python -m jointlab``: the same as the ``jointlab`` console script."""

from __future__ import annotations

import sys

from jointlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
