"""Hatchling build hook for importpatch-hook.

Editable installs (``pip install -e .``): hatchling applies the wheel target's
``force-include`` map to editable wheels as well.  We keep the two start-up
files (``importpatch.pth`` / ``importpatch.start``, which must land at the root
of site-packages for the hook to run in every process) but drop the
``patches -> importpatch/_builtin_patches`` entry: in an editable install the
``importpatch`` package is imported from the checkout, so a copy under
site-packages would be dead weight and go stale.  An editable checkout finds
its built-in patches in ``<repo>/patches`` instead.
"""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

EDITABLE_FORCE_INCLUDE = {
    "bootstrap/importpatch.pth": "importpatch.pth",
    "bootstrap/importpatch.start": "importpatch.start",
}


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version == "editable":
            build_data["force_include_editable"] = dict(EDITABLE_FORCE_INCLUDE)
