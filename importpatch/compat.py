"""The public name of ``importpatch.integrations.compat``, kept for users' imports:
the blog-style API, ``from importpatch.compat import VLLMPatch``.

The same module object: ``importpatch.compat`` is
``importpatch.integrations.compat`` in ``sys.modules``.
"""

import sys

from importpatch.integrations import compat as _module

# its names, for type checkers (the module object is the same one)
from importpatch.integrations.compat import *  # noqa: F403

sys.modules[__name__] = _module
