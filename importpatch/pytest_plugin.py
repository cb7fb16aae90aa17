"""The public name of ``importpatch.tools.pytest_plugin``, kept for users' imports:
``from importpatch.pytest_plugin import assert_applies_cleanly``.

The same module object: ``importpatch.pytest_plugin`` is
``importpatch.tools.pytest_plugin`` in ``sys.modules``.
"""

import sys

from importpatch.tools import pytest_plugin as _module

# its names, for type checkers (the module object is the same one)
from importpatch.tools.pytest_plugin import *  # noqa: F403

sys.modules[__name__] = _module
