"""What ships and what loads: the wheel carries the grammar and works on its own, and
``placeverify check`` never imports torch (torch is an optional extra for replay/measure)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRAMMAR_IN_WHEEL = "placeverify/grammar/placement.lark"
HEAVY = ("torch", "numpy")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PLACEVERIFY_DEBUG", "PYTHONPATH")}
    env.update(extra)
    return env


def imported_modules(args: list[str]) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Run ``python -X importtime -m placeverify ARGS`` and return every module it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "placeverify", *args], cwd=ROOT,
                          env=clean_env(), capture_output=True, text=True, timeout=120, check=False)
    modules = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*([\w.]+)$", done.stderr, re.M))
    return modules, done


def test_the_import_log_is_read_correctly() -> None:
    """The detector sees modules that are imported (so an empty result below means something)."""
    modules, done = imported_modules(["check", "--no-verify", "examples/zero-paper/zero3.place"])
    assert done.returncode == 0, done.stderr
    assert {"placeverify.cli", "placeverify.syntax.parser", "lark", "click"} <= modules


@pytest.mark.parametrize("args", [
    ["check", "examples/zero-paper/zero3.place"],
    ["check", "--json", "--formulas", "examples/strategies/llama3-405b-4d.place"],
    ["check", "examples/bugs/missing-allreduce.place"],
    ["check", "tests/errors/unknown-axis.place"],
    ["compare", "examples/zero-paper/ddp.place", "examples/zero-paper/zero3.place"],
], ids=["proved", "json-formulas", "refuted", "input-error", "compare"])
def test_check_does_not_import_torch(args: list[str]) -> None:
    modules, done = imported_modules(args)
    assert "Traceback" not in done.stderr
    assert "placeverify.cli" in modules
    loaded = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert loaded == [], f"placeverify {' '.join(args)} imported {loaded[:5]}"


# ---- the wheel --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from this checkout, the way a release is built (hatchling, no isolation)."""
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--quiet", "-w", str(out), str(ROOT)], env=clean_env(), capture_output=True,
                          text=True, timeout=300, check=False)
    if done.returncode != 0 and "No module named pip" in done.stderr:
        pytest.skip("pip is not available in this interpreter")
    assert done.returncode == 0, done.stderr
    [built] = out.glob("placeverify-*.whl")
    return built


def test_wheel_contains_the_grammar(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert GRAMMAR_IN_WHEEL in names
        assert archive.read(GRAMMAR_IN_WHEEL) == (ROOT / "grammar" / "placement.lark").read_bytes()
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "placeverify = placeverify.__main__:run" in archive.read(entry_points).decode()
        for schema in ("check", "check-list", "compare"):  # the published JSON Schemas (README)
            name = f"placeverify/schemas/{schema}.schema.json"
            assert archive.read(name) == (ROOT / name).read_bytes()
    assert "placeverify/__main__.py" in names
    assert "placeverify/ir/devices.json" in names  # the bundled device profiles (issue 15)
    assert not [n for n in names if "__pycache__" in n or n.startswith("tests/")]


def test_installed_wheel_parses_an_example(wheel: Path, tmp_path: Path) -> None:
    """Unpacked onto sys.path (as pip would install it), away from the checkout's grammar/ folder."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    example = ROOT / "examples" / "strategies" / "llama3-8b-zero1.place"
    probe = (
        "import sys\n"
        "import placeverify\n"
        "from placeverify.syntax.grammar import grammar_path\n"
        "from placeverify.lower import load\n"
        "strategy = load(sys.argv[1])\n"
        "print(placeverify.__file__)\n"
        "print(grammar_path())\n"
        "print(strategy.model.params)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(example)], cwd=tmp_path,
                          env=clean_env(PYTHONPATH=str(site)), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    package_file, grammar, params = done.stdout.splitlines()
    assert Path(package_file).is_relative_to(site)
    assert Path(grammar) == site / GRAMMAR_IN_WHEEL
    assert int(params) > 8 * 10**9  # Llama 3 8B: 8,030,261,248 parameters


def test_installed_wheel_runs_the_command(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    done = subprocess.run([sys.executable, "-m", "placeverify", "check", "--no-verify",
                           str(ROOT / "examples" / "zero-paper" / "zero3.place")], cwd=tmp_path,
                          env=clean_env(PYTHONPATH=str(site)), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "1.875 GB" in done.stdout
