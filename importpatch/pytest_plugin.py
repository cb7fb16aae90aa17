"""pytest plugin for patch authors (registered through the ``pytest11`` entry point)."""

from __future__ import annotations
