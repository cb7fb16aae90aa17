"""``python -m importpatch``: the ``importpatch`` command (see importpatch.tools.cli)."""

import sys

from importpatch.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
