"""What the compiled code of a patched module carries: the address of the run-time hooks it
calls, and the facts its source proved, kept with the code in the bytecode cache.

The rewrite (landing.py, fields.py, transforms.py) compiles calls into the module's code;
they run in stage 3, ``importpatch.install.activation``. The code reaches it by this string,
not by an import, so the rewrite never imports the stage it hands over to, and the code works in
any namespace (runpy's ``__main__`` too): ``__import__`` resolves through ``sys.modules`` at
run time. Both values are baked into cached code; the bytecode cache's key holds a hash of this
module's source (``bytecache.PRODUCERS``). tests/test_layout.py checks that ``HOOKS`` evaluates
to the activation module. Imported on every patched import, cache hit or not: nothing heavy.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# ``__import__('importpatch.install.activation').install.activation``.
HOOKS = "__import__('importpatch.install.activation').install.activation"


class Fact:
    """The binding verdict (``bindings.Verdict``) of one qualname and whether a landing site was
    inserted for it; kept with the compiled code in the bytecode cache. ``digest``: of the bound
    original's normalised text (``rewrite.pins``), compared with a patch's pin at every import."""

    __slots__ = ("state", "seen", "why", "line", "digest")

    def __init__(self, state: str, seen: bool, why: str = "", line: int = 0,
                 digest: str = "") -> None:
        self.state, self.seen, self.why, self.line = state, seen, why, line
        self.digest = digest

    # Marks entries of this format: code made before begin/done existed must never be reused.
    FORMAT = "\tfacts-2"

    @classmethod
    def pack(cls, facts: dict[str, Fact]) -> set[str]:
        packed = {cls.FORMAT}
        for qual, f in facts.items():
            packed.add("\t".join((qual, f.state, "1" if f.seen else "0", str(f.line), f.digest,
                                  f.why)))
        return packed

    @classmethod
    def unpack(cls, packed: Iterable[str]) -> dict[str, Fact] | None:
        """The facts, or None when ``packed`` is not in this format (an older cache entry)."""
        items = set(packed)
        if cls.FORMAT not in items:
            return None
        out: dict[str, Fact] = {}
        for item in items - {cls.FORMAT}:
            parts = item.split("\t", 5)
            if len(parts) != 6 or not parts[3].isdigit():
                return None
            out[parts[0]] = cls(parts[1], parts[2] == "1", parts[5], int(parts[3]), parts[4])
        return out
