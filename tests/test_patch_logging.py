"""A logger made in a patch file by ``__name__`` is in the family of the package the file patches
(``<package>.importpatch.<stem>``), so that package's logging configuration prints it (issue 38,
item 4). A stand-in package configured as vLLM configures its ``vllm`` logger (a handler of its
own, ``propagate=False``), in real child interpreters of the wheel venv (``lab``); the same on
real vLLM: tests/test_patch_logging_vllm.py."""

from __future__ import annotations

import pytest
from coreutil import Lab

TARGET = {
    # as vllm/logger.py does: the package's logger has the handler and does not propagate
    "lpkg/__init__.py": '''
        import logging, sys

        _handler = logging.StreamHandler(sys.stdout)
        _handler.setFormatter(logging.Formatter("LPKG %(name)s %(levelname)s %(message)s"))
        _root = logging.getLogger("lpkg")
        _root.addHandler(_handler)
        _root.setLevel(logging.INFO)
        _root.propagate = False
        ''',
    "lpkg/mod.py": '''
        def f():
            return 1
        ''',
}
PATCHES = {
    "logp.py": '''
        import logging

        from importpatch import Patch

        logger = logging.getLogger(__name__)
        NAME = __name__
        patch = Patch("logp")


        @patch.wrap("lpkg.mod:f")
        def f(wrapped, instance, args, kwargs):
            logger.info("patched f ran (logger %s)", NAME)
            return wrapped(*args, **kwargs) + 1
        ''',
    "other-name.py": '''
        import logging

        from importpatch import Patch

        Patch("dashed").after_import(
            "lpkg.mod", lambda mod: logging.getLogger(__name__).warning("hook ran"))
        ''',
}

pytestmark = pytest.mark.lab(target=TARGET, patch=PATCHES)


def test_a_logger_named_by_dunder_name_is_printed_by_the_package_s_configuration(lab: Lab
                                                                                ) -> None:
    proc = lab.ok("import lpkg.mod; print('result', lpkg.mod.f())", enable="logp")
    assert "LPKG lpkg.importpatch.logp INFO patched f ran (logger lpkg.importpatch.logp)" in (
        proc.stdout), proc.stdout + proc.stderr
    assert "result 2" in proc.stdout


def test_a_file_name_that_is_no_identifier_still_gets_a_logger_name_in_the_family(lab: Lab
                                                                                  ) -> None:
    proc = lab.ok("import lpkg.mod", enable="dashed")
    assert "LPKG lpkg.importpatch.other_name WARNING hook ran" in proc.stdout, (
        proc.stdout + proc.stderr)
