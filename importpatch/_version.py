"""The version's one source (read at build time by hatch, [tool.hatch.version] in pyproject.toml;
``importpatch.__version__`` and the bytecode cache's key read it here, a module that imports
nothing)."""

__version__ = "0.1.0"
