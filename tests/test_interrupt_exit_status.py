"""A Ctrl-C that stops a command exits 130, never by the signal itself (-2 to a caller's ``wait``).

CPython remembers a KeyboardInterrupt that escaped code it ran from a *string* — ``exec(text)``,
as ``dataclasses`` and ``collections.namedtuple`` do to build their methods while a module is
imported — and at the very end of ``python -m``, after the exit handlers, kills the process with
SIGINT whatever exit code the program chose (``Py_RunMain``; the memory is reset only when the
next string is run). A script (the ``placeverify`` entry point) exits by another path that does
not look; ``python -m placeverify`` does, so the driver here runs as a module too.

A fresh-clone suite run beside a CPU hog saw it: ``test_solver_interrupt.py::
test_check_cli_exits_130_on_ctrl_c`` printed "placeverify: interrupted" and exited -2, since
under load the Ctrl-C 1 s in landed while the command was still being imported. Here the
interrupt is raised from a string at the two places a command handles it: while the command
loads, and during its work.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r"""
import importlib.abc, sys

where, place = sys.argv[1], sys.argv[2]
if where == "load":
    class InterruptedLoad(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "placeverify.cli":
                exec("raise KeyboardInterrupt")  # as a dataclass's methods are built
            return None

    sys.meta_path.insert(0, InterruptedLoad())
else:
    import placeverify.api

    def interrupted(*args, **kwargs):
        exec("raise KeyboardInterrupt")

    placeverify.api.check = interrupted
sys.argv = ["placeverify", "check", place]
from placeverify.__main__ import run

run()
"""


@pytest.mark.parametrize("where", ["load", "work"])
def test_an_interrupt_raised_from_a_string_still_exits_130(tmp_path: Path, where: str) -> None:
    place = ROOT / "examples" / "strategies" / "llama3-8b-ddp.place"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PLACEVERIFY_DEBUG", None)
    (tmp_path / "interrupted_driver.py").write_text(DRIVER)
    done = subprocess.run([sys.executable, "-m", "interrupted_driver", where, str(place)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr == "placeverify: interrupted\n"
    assert done.stdout == ""
