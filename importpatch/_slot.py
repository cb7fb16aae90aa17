"""importpatch's slot on ``sys.meta_path``: what every way the hook starts
shares (the ``.pth`` line's waiting finder in ``_pth_on``, ``_boot``'s finders, the PatchFinder in
``load/finder.py``), in one place. A shared basic: it imports nothing of importpatch.

Where a process waits, ``_pth_on.slot_module`` executes this module's compiled code as the
``.pth`` line does ``_pth_on``'s and registers it as ``importpatch._slot``, so the classes below
exist once per process whichever way they were reached; a process that waits for nothing never
loads it. Comments, not docstrings, below: every process that waits unmarshals this code, and a
docstring is a string in it.
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


# --- The hook's slot on sys.meta_path (one implementation for every way the hook starts) ---
#
# Invariants:
# - From the .pth line on, exactly one of importpatch's hook finders holds "the slot": the
#   waiting finder (a stamp says what to wait for), ``_boot._AfterSite`` (site is still building
#   sys.path) or the started ``PatchFinder``. Each is a ``Slot``; one replaces another in place
#   (``take_slot``), so there is no moment with none, whatever is raised in between.
# - ``sys.meta_path`` is a ``MetaPath`` from then on: the slot stays ahead of every finder that
#   is not importpatch's own, whenever that was inserted (typeguard, pytest's assertion
#   rewriting, a user's finder at index 0), in every timing of the start. (A program that
#   replaces the list object itself, ``sys.meta_path = [...]``, escapes this: docs/limits.md.)
# - The waiting finder leaves the slot only for a started hook: a failure of the start (any
#   BaseException) leaves it in place, failing the imports of what it waits for closed; a
#   KeyboardInterrupt goes on as it would without importpatch, and the next import starts again.


class Slot:  # a finder that holds importpatch's slot on sys.meta_path (see above)
    pass


# sys.meta_path once importpatch holds a slot on it: the first Slot stays ahead of every finder
# that is not importpatch's own; the others keep their order.
class MetaPath(list):  # type: ignore[type-arg]
    __slots__ = ()

    def insert(self, index: "Any", finder: "Any") -> None:
        list.insert(self, index, finder)
        self.keep_first()

    def __setitem__(self, index: "Any", value: "Any") -> None:
        list.__setitem__(self, index, value)
        self.keep_first()

    def keep_first(self) -> None:
        for i, finder in enumerate(self):
            if isinstance(finder, Slot):
                return
            if not type(finder).__module__.startswith("importpatch."):
                for j in range(i + 1, len(self)):
                    if isinstance(self[j], Slot):
                        list.insert(self, i, list.pop(self, j))
                        return
                return


# Put ``finder`` in importpatch's slot: in place of the Slot there (one list assignment), else
# first; sys.meta_path becomes a MetaPath where it is not one.
def take_slot(finder: Slot) -> None:
    meta_path = sys.meta_path
    if not isinstance(meta_path, MetaPath):
        meta_path = sys.meta_path = MetaPath(meta_path)
    for i, existing in enumerate(meta_path):
        if isinstance(existing, Slot):
            meta_path[i] = finder
            return
    meta_path.insert(0, finder)


def leave_slot(finder: object) -> None:
    meta_path: list[object] = sys.meta_path  # type: ignore[assignment]
    if finder in meta_path:
        meta_path.remove(finder)


# The spec the finders now on sys.meta_path give, ``me`` left out: importlib iterates
# sys.meta_path while a finder runs, so one that changed the list asks them itself.
def ask_others(me: object, name: str, path: "Any", target: "Any") -> "Any":
    for finder in list(sys.meta_path):
        if finder is me:
            continue
        find = getattr(finder, "find_spec", None)
        spec = find(name, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None
