"""Golden tests of the proof rules (proofs/NAME.rule with proofs/NAME.rule.expect, Dafny-style).

Regenerate the .expect files with PLACEVERIFY_UPDATE_GOLDENS=1 and review the diff by eye.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from placeverify.diagnostics import ExitCode
from placeverify.prove.cli import expect_text, prove_file
from placeverify.prove.lemmas import partition_lemma, split_lemma
from placeverify.verdicts import Verdict
from tests.conftest import ROOT

PROOFS = sorted((ROOT / "proofs").glob("*.rule"))
UPDATE = os.environ.get("PLACEVERIFY_UPDATE_GOLDENS") == "1"

# The issue's 13 rules (by file-name prefix) and the refuted compositions it names.
PROVED_RULES = {f"{n:02d}" for n in range(1, 14)}
REFUTED_COMPOSITIONS = {"14-zero2-pipeline-traffic", "14-zero2-pipeline-freed",
                        "15-hsdp-shard-group-of-one", "01-dp-unequal-means"}


@pytest.mark.parametrize("path", PROOFS, ids=lambda p: p.stem)
def test_rule_matches_its_expected_outcome(path: Path) -> None:
    result = prove_file(str(path), None, timeout_ms=30_000)
    expect = path.with_name(path.name + ".expect")
    text = expect_text(result)
    if UPDATE:
        expect.write_text(text)
    assert expect.is_file(), f"missing {expect.name}; run with PLACEVERIFY_UPDATE_GOLDENS=1"
    assert text == expect.read_text()
    assert result.holds is True, [(c.claim.text, c.verdict, c.detail) for c in result.claims]


def test_every_rule_of_the_issue_has_a_proof_and_the_refuted_ones_a_counterexample() -> None:
    proved = set()
    for path in PROOFS:
        result = prove_file(str(path), None, timeout_ms=30_000)
        if result.verdict is Verdict.PROVED:
            proved.add(path.stem[:2])
        if path.stem in REFUTED_COMPOSITIONS:
            assert result.verdict is Verdict.REFUTED
            assert all(c.counterexample for c in result.claims if c.verdict is Verdict.REFUTED)
    assert proved >= PROVED_RULES


def test_the_summation_lemmas_are_proved_by_induction() -> None:
    for lemma in (split_lemma(), partition_lemma()):
        assert lemma.base and lemma.step, lemma


def test_a_wrong_identity_is_refuted_with_sizes(tmp_path: Path) -> None:
    rule = tmp_path / "wrong.rule"
    rule.write_text('rule "off by one"\nfor every t >= 1, w >= 1\n'
                    "prove identity sum(r < t) sum(j < w) x[r*w + j] = sum(q < t*w + 1) x[q]\n")
    result = prove_file(str(rule), None, timeout_ms=10_000)
    assert result.verdict is Verdict.REFUTED and result.holds is False
    witness = result.claims[0].counterexample
    assert witness is not None and witness["left"] != witness["right"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "placeverify", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_a_user_rule_needs_no_package_change(tmp_path: Path) -> None:
    good = tmp_path / "mine.rule"
    good.write_text('rule "ZeRO-1 over my mesh"\nfor every dp\nmodel { params = 1e9 }\n'
                    "precision megatron\nmesh { dp = 16 }\nplace zero1 over dp\n"
                    "prove gradient_integrity, state_consistency\n"
                    "prove memory optimizer = 12 * Ψ / dp\n")
    done = run_cli("prove", str(tmp_path))
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    bad = tmp_path / "wrong.rule"
    bad.write_text('rule "DDP with a SUM and no division"\nfor every dp\nmodel { params = 1e9 }\n'
                   "precision megatron\nmesh { dp = 4 }\nplace ddp over dp\nloss sample_mean\n"
                   "step {\n  backward mean\n  all_reduce(sum) grads over dp\n  update params\n}\n"
                   "prove gradient_integrity\n")
    done = run_cli("prove", "--json", str(bad))
    assert done.returncode == ExitCode.REFUTED, done.stdout + done.stderr
    assert '"verdict": "refuted"' in done.stdout


def test_a_malformed_rule_is_an_input_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.rule"
    bad.write_text('rule "x"\nprove memory total = \n')
    done = run_cli("prove", str(bad))
    assert done.returncode == ExitCode.INPUT_ERROR
    assert "broken.rule:3" in done.stderr or "broken.rule:2" in done.stderr
    assert "Traceback" not in done.stderr
