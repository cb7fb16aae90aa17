"""The packages of patch folders (see importpatch/discover/folders.py). Importing this package, as
unpickling an object defined in a helper of a patch folder does in another process, installs the
finder that makes those packages and finds their helpers."""

from importpatch.discover.folders import install

install()
