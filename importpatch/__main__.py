"""``python -m importpatch``: the ``importpatch`` command (see importpatch.cli)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
