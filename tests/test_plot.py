"""Pictures (``placeverify[plot]``): every chart rendered to PNG and SVG and read back, the pipeline
schedule against the published bubble formula, and ``check --plot`` end to end.

Expected figures are derived by hand: image sizes from the figure size at 100 dpi; the idle share
of a pipeline from Narayanan et al. 2021 §2.2, (p - 1) / (v·m + p - 1); labels from the inputs.
"""

from __future__ import annotations

import itertools
import os
import re
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from placeverify.api import check, load_text
from placeverify.ir.placement import Schedule
from placeverify.report.plot import (
    FrontierPoint,
    available,
    check_format,
    frontier_chart,
    frontier_figure,
    memory_chart,
    schedule_chart,
    schedule_path,
    simulate,
    stage_orders,
)

# the rendering tests need the plot extra (CI installs it with dev); the schedule, the format
# rules and the exit code without matplotlib do not
renders = pytest.mark.skipif(not available(), reason="the plot extra (matplotlib) is not installed")

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "examples" / "strategies" / "llama3-70b-1f1b.place"  # p = 8, m = 32
FLAT = ROOT / "examples" / "strategies" / "llama3-8b-zero3.place"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which the PNG specification puts first."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def svg_texts(path: Path) -> str:
    """Every <text> of an SVG, joined (it must parse as XML)."""
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return "\n".join("".join(node.itertext()) for node in root.iter("{http://www.w3.org/2000/svg}text"))


# ---- the schedule, against the published bubble ------------------------------------------------


@pytest.mark.parametrize(("schedule", "p", "m", "v"), [
    (Schedule.GPIPE, 4, 8, 1), (Schedule.ONE_F_ONE_B, 4, 8, 1), (Schedule.ONE_F_ONE_B, 8, 32, 1),
    (Schedule.ONE_F_ONE_B, 4, 2, 1), (Schedule.INTERLEAVED, 4, 8, 2),
    (Schedule.INTERLEAVED, 8, 64, 3)])
def test_the_schedule_idles_as_narayanan_et_al_count(schedule: Schedule, p: int, m: int,
                                                      v: int) -> None:
    ops = simulate(schedule, p, m, v)
    assert len(ops) == 2 * p * m * v  # every forward and backward of every chunk once
    span = max(op.end for op in ops)
    busy = sum(op.end - op.start for op in ops)
    # forward 1, backward 2 per micro-batch and stage: the ideal is 3m, the bubble 3(p-1)/v
    assert span == pytest.approx(3 * m + 3 * (p - 1) / v)
    assert 1 - busy / (span * p) == pytest.approx((p - 1) / (v * m + p - 1))


def test_1f1b_keeps_at_most_p_minus_s_microbatches_in_flight() -> None:
    # Narayanan et al. 2021 §2.2.1: stage s warms up with p - s - 1 forwards, then alternates
    p, m = 4, 8
    for s, order in enumerate(stage_orders(Schedule.ONE_F_ONE_B, p, m, 1)):
        in_flight = peak = 0
        for backward, _, _ in order:
            in_flight += -1 if backward else 1
            peak = max(peak, in_flight)
        assert peak == p - s
    gpipe = stage_orders(Schedule.GPIPE, p, m, 1)[0]
    assert [b for b, _, _ in gpipe] == [False] * m + [True] * m


def test_a_stage_never_runs_two_things_at_once_and_waits_for_its_input() -> None:
    ops = simulate(Schedule.INTERLEAVED, 4, 8, 2)
    for s in range(4):
        mine = sorted((op for op in ops if op.stage == s), key=lambda op: op.start)
        assert all(a.end <= b.start + 1e-12 for a, b in itertools.pairwise(mine))
    end = {(op.backward, op.chunk * 4 + op.stage, op.microbatch): op.end for op in ops}
    for op in ops:
        vstage = op.chunk * 4 + op.stage
        if not op.backward and vstage > 0:
            assert op.start >= end[(False, vstage - 1, op.microbatch)] - 1e-12


# ---- the three charts, read back -------------------------------------------------------------------


@renders
@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_memory_chart(tmp_path: Path, suffix: str) -> None:
    result = check(str(PIPELINE), verify_conditions=False)
    path = tmp_path / f"m{suffix}"
    memory_chart(result, str(path))
    if suffix == ".png":
        # three rank kinds: max(6.5, 3.5 + 1.3 x 3) = 7.4 by 4.5 inches at 100 dpi
        assert png_size(path) == (740, 450)
        return
    text = svg_texts(path)
    for label in ("first stage", "middle stage", "last stage", "params", "optimizer",
                  "gradients", "activations", "device memory 80 GB", "peak",
                  "GB per device"):
        assert label in text, label


@renders
@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_schedule_chart(tmp_path: Path, suffix: str) -> None:
    strategy = load_text(PIPELINE.read_text(encoding="utf-8"), str(PIPELINE))
    path = tmp_path / f"s{suffix}"
    assert schedule_chart(strategy, str(path)) is None
    if suffix == ".png":
        width, height = png_size(path)
        assert height == round(100 * (1.2 + 0.45 * 8))  # 8 stages
        assert width > 400
        return
    text = svg_texts(path)
    # (p - 1) / (m + p - 1) = 7 / 39 = 17.9%
    assert "pipeline schedule: 1F1B, p = 8, m = 32; idle 17.9%" in text
    assert "stage 0" in text and "stage 7" in text and "backward" in text


@renders
def test_schedule_chart_without_a_pipeline_says_so(tmp_path: Path) -> None:
    strategy = load_text(FLAT.read_text(encoding="utf-8"), str(FLAT))
    path = tmp_path / "s.svg"
    note = schedule_chart(strategy, str(path))
    assert note is not None and note.startswith("no pipeline")
    assert "no pipeline" in svg_texts(path)


@renders
@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_frontier_chart(tmp_path: Path, suffix: str) -> None:
    gib = 2**30
    points = [FrontierPoint("tp8 pp16 dp128", 30 * gib, 10.0, True),
              FrontierPoint("tp8 pp8 dp256", 50 * gib, 7.0, True),
              FrontierPoint("tp4 pp16 dp256", 60 * gib, 9.0, False),
              FrontierPoint("tp8 pp4 dp512", 70 * gib, 6.5, True)]
    path = tmp_path / f"f{suffix}"
    frontier_chart(points, points[1], str(path), capacity=80 * 10**9)
    if suffix == ".png":
        assert png_size(path) == (900, 450)  # 9 by 4.5 inches: the axes and the key beside them
        return
    text = svg_texts(path)
    for label in ("peak memory per device (GB, 10⁹ bytes)", "predicted step time (s)",
                  "Pareto frontier", "chosen: tp8 pp8 dp256", "other layouts",
                  # 80e9 bytes = 74.505806 GiB
                  "device memory 80 GB (74.51 GiB)"):
        assert label in text, label
    # the key: the frontier by memory, 30 GiB = 32.21 GB and 70 GiB = 75.16 GB
    assert re.search(r"1  tp8 pp16 dp128\s+32.21 GB\s+10 s", text), text
    assert re.search(r"3  tp8 pp4 dp512\s+75.16 GB\s+6.5 s", text), text
    assert "tp4 pp16 dp256" not in text  # off the frontier: a grey dot, not labelled


@renders
def test_crowded_frontier_numbers_overlap_nothing() -> None:
    """Twenty frontier points 0.1 GB and 0.05 s apart: every number sits clear of every other
    number, every marker and the legend; the device line is drawn at its capacity."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    points = [FrontierPoint(f"layout {i}", (30 * 10**9) + i * 10**8, 10.0 - 0.05 * i, True)
              for i in range(20)]
    figure = frontier_figure(points, points[0], capacity=40 * 10**9)
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    ax = figure.axes[0]
    renderer = canvas.get_renderer()
    numbers = [t for t in ax.texts if t.get_text().isdigit()]
    assert sorted(int(t.get_text()) for t in numbers) == list(range(1, 21))
    boxes = [t.get_window_extent(renderer) for t in numbers]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    markers = ax.transData.transform([(q.peak_bytes / 1e9, q.step_seconds) for q in points])
    for box in boxes:
        assert not any(box.x0 < x < box.x1 and box.y0 < y < box.y1 for x, y in markers)
        assert not box.overlaps(ax.get_legend().get_window_extent(renderer))
    lines = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_xdata()[0] for line in lines] == [40.0]


def test_frontier_point_is_frozen() -> None:
    point = FrontierPoint("a", 1, 1.0, True)
    with pytest.raises(AttributeError):
        point.label = "b"  # type: ignore[misc]


def test_the_format_is_the_suffix() -> None:
    assert check_format("x.PNG") == "png" and check_format("a/b.svg") == "svg"
    with pytest.raises(ValueError, match=r"not \.pdf"):
        check_format("x.pdf")
    with pytest.raises(ValueError, match="without a suffix"):
        check_format("x")
    assert schedule_path("out/mem.png") == str(Path("out/mem-schedule.png"))


# ---- check --plot --------------------------------------------------------------------------------


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "placeverify", *args], cwd=ROOT,
                          env=env or dict(os.environ), capture_output=True, text=True,
                          timeout=120, check=False)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    return done


@renders
def test_check_plot_writes_the_memory_chart_and_the_schedule(tmp_path: Path) -> None:
    target = tmp_path / "mem.png"
    done = run("check", str(PIPELINE), "--no-verify", "--plot", str(target))
    assert done.returncode == 0, done.stderr
    assert png_size(target) == (740, 450)
    assert png_size(tmp_path / "mem-schedule.png")[1] == 480
    assert f"plot written to {target}" in done.stderr


@renders
def test_check_plot_without_a_pipeline_writes_only_the_memory_chart(tmp_path: Path) -> None:
    target = tmp_path / "mem.svg"
    done = run("check", str(FLAT), "--no-verify", "--plot", str(target))
    assert done.returncode == 0, done.stderr
    assert "only" in svg_texts(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mem.svg"]


def test_check_plot_usage_errors(tmp_path: Path) -> None:
    done = run("check", str(FLAT), "--no-verify", "--plot", str(tmp_path / "mem.pdf"))
    assert done.returncode == 2 and "a plot is written as .png or .svg, not .pdf" in done.stderr
    done = run("check", str(FLAT), str(PIPELINE), "--no-verify", "--plot", str(tmp_path / "m.png"))
    assert done.returncode == 2 and "--plot takes exactly one file" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_check_plot_without_matplotlib_is_exit_5(tmp_path: Path) -> None:
    # a matplotlib that cannot be imported, first on the path
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT), env.get("PYTHONPATH", "")])
    done = run("check", str(FLAT), "--no-verify", "--plot", str(tmp_path / "m.png"), env=env)
    assert done.returncode == 5
    assert "--plot needs matplotlib, the plot extra: pip install 'placeverify[plot]'" in done.stderr
    assert not (tmp_path / "m.png").exists()
    # without --plot the same check runs: it never imports matplotlib
    assert run("check", str(FLAT), "--no-verify", env=env).returncode == 0


@renders
def test_check_plot_to_a_missing_folder_is_exit_4(tmp_path: Path) -> None:
    done = run("check", str(FLAT), "--no-verify", "--plot", str(tmp_path / "no" / "m.png"))
    assert done.returncode == 4 and "cannot write plot" in done.stderr
