"""The grammar, the parser and the AST: every example parses, and spans point at the right text."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
from lark import Lark, Token, Tree

from placeverify.diagnostics import Code, Diagnostic, PlaceError, Severity, Source, Span, did_you_mean
from placeverify.ir.placement import Role, Schedule
from placeverify.lower import load, load_text, lower
from placeverify.prove.syntax import IMPORTED, RuleBuilder, rules_parser
from placeverify.syntax import ast
from placeverify.syntax.errors import MAX_NESTING
from placeverify.syntax.grammar import grammar_path, parser
from placeverify.syntax.parser import parse_source, parse_text, tree_of
from placeverify.syntax.to_ast import DERIVED, AstBuilder, built_rules, number_problem, rule_name

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(ROOT.glob("examples/**/*.place"))
MINIMAL = "model { params = 7.5e9 }\nmesh { dp = 8 }\nplace zero3 over dp\n"


def example_id(path: Path) -> str:
    return str(path.relative_to(ROOT / "examples"))


def slice_span(source: Source, span: Span) -> str:
    """The text a span covers (end column exclusive, as Lark reports it)."""
    if span.line == span.end_line:
        return source.line_text(span.line)[span.column - 1:span.end_column - 1]
    parts = [source.line_text(span.line)[span.column - 1:]]
    parts += [source.line_text(n) for n in range(span.line + 1, span.end_line)]
    parts.append(source.line_text(span.end_line)[:span.end_column - 1])
    return "\n".join(parts)


def nodes(node: object) -> Iterator[object]:
    """Every AST node under ``node`` (dataclasses, tuples of them), depth first."""
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, tuple):
            stack.extend(current)
        elif dataclasses.is_dataclass(current) and not isinstance(current, Span):
            yield current
            stack.extend(getattr(current, f.name) for f in dataclasses.fields(current))


# ---- the examples --------------------------------------------------------------------------------


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 40
    assert {p.parent.name for p in EXAMPLES} >= {"ok", "bugs", "strategies", "zero-paper"}


@pytest.mark.parametrize("path", EXAMPLES, ids=example_id)
def test_example_parses_and_lowers(path: Path) -> None:
    tree = tree_of(path.read_text(encoding="utf-8"))
    assert isinstance(tree, Tree) and tree.data == "start"
    strategy = load(str(path))
    assert strategy.placements, "every example places its states over some axis"
    assert {p.axis for p in strategy.placements} == set(strategy.mesh.names)


@pytest.mark.parametrize("path", EXAMPLES, ids=example_id)
def test_example_spans_slice_their_text(path: Path) -> None:
    """Names, numbers, quantities and strings: each span slices exactly its own text."""
    source = Source(str(path), path.read_text(encoding="utf-8"))
    tree = parse_source(source)
    checked = 0
    for node in nodes(tree):
        if isinstance(node, ast.Name | ast.NumberValue | ast.QuantityValue):
            assert slice_span(source, node.span) == node.text
        elif isinstance(node, ast.StringValue):
            assert slice_span(source, node.span) == '"' + node.value.replace('"', '\\"') + '"'
        else:
            continue
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=example_id)
def test_statement_spans_start_at_their_keyword(path: Path) -> None:
    source = Source(str(path), path.read_text(encoding="utf-8"))
    keywords = {ast.StrategyStmt: "strategy", ast.ModelStmt: "model", ast.PrecisionStmt: "precision",
                ast.MeshStmt: "mesh", ast.PlaceStmt: "place", ast.RecomputeStmt: "recompute",
                ast.OffloadStmt: "offload", ast.LossStmt: "loss", ast.StepStmt: "step",
                ast.MicrobatchesStmt: "microbatches", ast.ClipStmt: "clip",
                ast.LossScaleStmt: "loss_scale", ast.UnusedStmt: "unused", ast.EmptyStmt: "empty"}
    for statement in parse_source(source).statements:
        text = slice_span(source, statement.span)
        assert text.startswith(keywords[type(statement)])
        if isinstance(statement, ast.MeshStmt | ast.StepStmt):
            assert text.endswith("}")


def test_placement_axis_span_is_the_axis_name() -> None:
    text = ("model llama3_8b\nmesh {\n    tp = 8\n    dp = 4\n}\nplace megatron over tp\n"
            "place  zero1   over   dp  # spaced\n")
    source = Source("spans.place", text)
    places = [s for s in parse_source(source).statements if isinstance(s, ast.PlaceStmt)]
    axes = [term.name for place in places for term in place.group.terms if isinstance(term, ast.AxisRef)]
    assert [(a.text, a.span) for a in axes] == [("tp", Span(6, 21, 6, 23)), ("dp", Span(7, 23, 7, 25))]
    assert [slice_span(source, a.span) for a in axes] == ["tp", "dp"]
    presets = [p.placement for p in places]
    assert [slice_span(source, p.span) for p in presets] == ["megatron", "zero1"]
    # the lowered placement keeps the statement's span, which the divisibility errors point at
    strategy = lower(parse_source(source), source)
    assert [slice_span(source, p.span) for p in strategy.placements] == [
        "place megatron over tp", "place  zero1   over   dp"]


def test_tuple_and_starred_spans() -> None:
    source = Source("t.place", "model { params = 1e9 }\nmesh { dp = 8 }\nplace (S*, S, S, R) over dp\n")
    [place] = [s for s in parse_source(source).statements if isinstance(s, ast.PlaceStmt)]
    assert isinstance(place.placement, ast.TuplePlacement)
    assert slice_span(source, place.placement.span) == "(S*, S, S, R)"
    values = [a.value for a in place.placement.args if isinstance(a, ast.PositionalArg)]
    assert isinstance(values[0], ast.StarredValue)
    assert [slice_span(source, v.span) for v in values] == ["S*", "S", "S", "R"]


def test_multi_line_spans() -> None:
    source = Source("m.place", "model transformer {\n  layers = 4\n  hidden = 1024\n}\n" + MINIMAL[25:])
    model = parse_source(source).statements[0]
    assert isinstance(model, ast.ModelStmt)
    assert model.span.line == 1 and model.span.end_line == 4
    assert slice_span(source, model.span).endswith("hidden = 1024\n}")


def grammar_rules(lark: Lark, prefix: str = "") -> set[str]:
    """Every rule (or alias) a parse tree of ``lark`` can contain, without ``prefix``."""
    names = set()
    for rule in lark.rules:
        name = rule.alias or rule.origin.name
        if isinstance(name, Token):
            name = name.value
        kept = [s for s in rule.expansion if not getattr(s, "filter_out", False)]
        if name.startswith("_") or (rule.options.expand1 and not rule.alias and len(kept) < 2):
            continue  # a '?rule' with one child is replaced by that child
        names.add(name.removeprefix(prefix))
    return names


def test_every_grammar_rule_has_an_ast_builder_and_back() -> None:
    """One AST class per rule: each rule the parse tree can contain is built, and nothing else."""
    names = grammar_rules(parser())
    assert names == built_rules(), (f"rules without a builder: {sorted(names - built_rules())}; "
                                    f"builders without a rule: {sorted(built_rules() - names)}")


def test_every_ast_class_is_built_by_a_rule() -> None:
    """The other half of 'one AST class per rule': no class of syntax/ast.py lacks its rule."""
    classes = {c for c in vars(ast).values() if isinstance(c, type)
               and dataclasses.is_dataclass(c) and c.__module__ == ast.__name__} - {ast.Name}
    built = {d.cls for d in DERIVED.values()}
    for name in built_rules() - set(DERIVED):
        returned = str(vars(AstBuilder)[name].__annotations__["return"])
        built.add(getattr(ast, returned.removeprefix("ast."), tuple))
    assert not classes - built, f"AST classes no rule builds: {sorted(c.__name__ for c in classes - built)}"
    for rule, derived in DERIVED.items():
        assert rule in ("start", "clip_op_stmt") or rule_name(derived.cls) == rule


def test_every_rules_grammar_rule_has_a_builder_and_back() -> None:
    """rules.lark: its own rules and the .place rules it imports are all built by the rule builder."""
    names = grammar_rules(rules_parser(), IMPORTED)
    own = {n for n, v in vars(RuleBuilder).items() if not n.startswith("_") and callable(v)}
    assert names == built_rules() | own, sorted(names ^ (built_rules() | own))


def test_grammar_is_the_only_syntax_definition() -> None:
    assert grammar_path().name == "placement.lark"
    assert grammar_path().read_text(encoding="utf-8").startswith("// placeverify strategy language")


# ---- keywords and names ----------------------------------------------------------------------------


@pytest.mark.parametrize("axis", ["model", "over", "place", "mesh", "strategy", "each", "seed"])
def test_keywords_are_names_where_a_name_is_expected(axis: str) -> None:
    strategy = load_text(f"mesh {{ {axis} = 2 }}\nmodel {{ params = 1e9 }}\nplace ddp over {axis}\n")
    assert strategy.mesh.names == (axis,)
    assert strategy.placements[0].axis == axis


def test_a_keyword_after_a_group_starts_the_next_statement() -> None:
    strategy = load_text("mesh { dp = 2 }\nplace ddp over dp\nmodel { params = 1e9 }\n")
    assert strategy.model.params == 10**9


@pytest.mark.parametrize("name", ["step", "microbatch", "ends"])
def test_reserved_axis_names(name: str) -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(f"mesh {{ {name} = 2, dp = 2 }}\nmodel {{ params = 1e9 }}\nplace ddp over dp\n")
    [diagnostic] = raised.value.diagnostics
    assert diagnostic.message == f"'{name}' is reserved and cannot name an axis"


def test_world_is_a_mesh_property_not_an_axis() -> None:
    with pytest.raises(PlaceError) as raised:
        load_text("mesh { world = 2 }\nmodel { params = 1e9 }\nplace ddp over world\n")
    assert [d.message for d in raised.value.diagnostics] == ["the mesh has no axes, e.g. 'dp = 8'"]


def test_statement_keywords_are_case_sensitive() -> None:
    with pytest.raises(PlaceError) as raised:
        parse_text("Model { params = 1e9 }\n")
    [diagnostic] = raised.value.diagnostics
    assert diagnostic.message == "unknown statement 'Model'; did you mean 'model'?"
    assert diagnostic.span == Span(1, 1, 1, 6)


# ---- values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "number", "unit"), [
    ("80 GB", Fraction(80), "GB"),
    ("80GB", Fraction(80), "GB"),
    ("1.5e3 MiB", Fraction(1500), "MiB"),
    ("25 GB/s", Fraction(25), "GB/s"),
    ("400 Gb/s", Fraction(400), "Gb/s"),
    ("2 us", Fraction(2), "us"),
    ("2 µs", Fraction(2), "µs"),
    ("-1 ms", Fraction(-1), "ms"),
    ("1_000 B", Fraction(1000), "B"),
    (".5 TB", Fraction(1, 2), "TB"),
])
def test_quantities(text: str, number: Fraction, unit: str) -> None:
    file = parse_text(f"model {{ x = {text} }}\n")
    model = file.statements[0]
    assert isinstance(model, ast.ModelStmt) and model.block is not None
    value = model.block.entries[0].value
    assert isinstance(value, ast.QuantityValue)
    assert (value.number, value.unit, value.text) == (number, unit, text)


@pytest.mark.parametrize(("memory", "expected"), [
    ("80 GB", 80 * 10**9), ("80 GiB", 80 * 2**30), ("640 Gb", 80 * 10**9), ("1 TB", 10**12)])
def test_memory_units_lower_to_bytes(memory: str, expected: int) -> None:
    strategy = load_text(f"model {{ params = 1e9 }}\nmesh {{ dp = 8, device_memory = {memory} }}\n"
                         "place ddp over dp\n")
    assert strategy.mesh.device_memory == expected


@pytest.mark.parametrize(("text", "value"), [
    ("7.5e9", Fraction(7_500_000_000)), ("1_000_000", Fraction(1_000_000)), ("0.25", Fraction(1, 4)),
    ("+8", Fraction(8)), ("-8", Fraction(-8)), ("1E3", Fraction(1000)), ("1e100", Fraction(10**100))])
def test_numbers(text: str, value: Fraction) -> None:
    model = parse_text(f"model {{ x = {text} }}\n").statements[0]
    assert isinstance(model, ast.ModelStmt) and model.block is not None
    number = model.block.entries[0].value
    assert isinstance(number, ast.NumberValue)
    assert number.value == value and number.text == text


@pytest.mark.parametrize(("text", "problem"), [
    ("1e100", None), ("1e-100", None), ("0", None), ("0.000", None), ("9" * 100, None),
    ("1e101", "is out of range"), ("1e-101", "is out of range"), ("10e100", "is out of range"),
    ("0.01e-99", "is out of range"), ("1e999999999999", "is out of range"),
    ("9" * 101, "has more than 100 digits"), ("1_0e100", "is out of range")])
def test_number_range(text: str, problem: str | None) -> None:
    assert number_problem(text) == problem


def test_schedule_1f1b_is_one_token() -> None:
    text = ("model llama3_8b\nmesh { pp = 4, dp = 2 }\nplace pipeline(1f1b, microbatches = 8) over pp\n"
            "place ddp over dp\n")
    assert "SCHEDULE" in {t.type for t in tree_of(text).scan_values(lambda v: isinstance(v, Token))}
    [pipeline] = [p for p in load_text(text).placements if p.role is Role.PIPELINE]
    assert pipeline.schedule is Schedule.ONE_F_ONE_B
    assert pipeline.microbatches == 8


def test_schedule_as_keyword_argument() -> None:
    text = ("model llama3_8b\nmesh { pp = 4 }\nplace pipeline(schedule = 1f1b, microbatches = 8) over pp\n")
    [pipeline] = load_text(text).placements
    assert pipeline.schedule is Schedule.ONE_F_ONE_B


def test_strings_keep_hashes_and_escaped_quotes() -> None:
    strategy = load_text('strategy "zero3 # not a comment \\"quoted\\""\n' + MINIMAL)
    assert strategy.name == 'zero3 # not a comment "quoted"'


# ---- layout: comments, line ends, encodings ---------------------------------------------------------


def test_comments_anywhere() -> None:
    text = ("# heading\nmodel { # open\n  params = 7.5e9 # the count\n} # close\n"
            "mesh { dp = 8 }#tight\nplace zero3 over dp # end\n# trailing")
    assert load_text(text).model.params == 7_500_000_000


def test_commas_in_blocks_are_optional() -> None:
    a = load_text("model transformer { layers = 4, hidden = 1024, heads = 16, vocab = 32000, seq = 2048 }\n"
                  "mesh { dp = 2 }\nplace ddp over dp\n")
    b = load_text("model transformer {\n layers = 4\n hidden = 1024\n heads = 16\n vocab = 32000\n"
                  " seq = 2048\n}\nmesh { dp = 2 }\nplace ddp over dp\n")
    assert a.model == b.model


def test_crlf_and_tabs_parse_like_lf() -> None:
    crlf = load_text(MINIMAL.replace("\n", "\r\n").replace(" ", "\t"))
    assert crlf.model.params == load_text(MINIMAL).model.params


def test_crlf_errors_point_at_the_same_place() -> None:
    bad = "model { params = 7.5e9 }\nmesh { dp = 8 }\nplace zero3 over dq\n"
    errors = []
    for text in (bad, bad.replace("\n", "\r\n")):
        with pytest.raises(PlaceError) as raised:
            load_text(text, "x.place")
        errors.append(str(raised.value))
    assert errors[0] == errors[1]
    assert "   3 | place zero3 over dq\n" in errors[0]


def test_byte_order_mark_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "bom.place"
    path.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())
    assert load(str(path)).model.params == 7_500_000_000


def test_unicode_in_comments_and_strings() -> None:
    strategy = load_text('# Θ, Ω, G, A — ΖeRO ✓\nstrategy "全分片 Ψ = 7.5B"\n' + MINIMAL)
    assert strategy.name == "全分片 Ψ = 7.5B"


# ---- nesting -----------------------------------------------------------------------------------------


def test_nesting_up_to_the_limit_parses() -> None:
    depth = MAX_NESTING - 2  # inside 'step {' and the outer parenthesis budget
    text = (MINIMAL.replace("zero3", "ddp") + "step {\n  backward " + "(" * depth + "sum" + ")" * depth
            + " / tokens(dp, step)\n  all_reduce(sum) grads over dp\n  update params\n}\n")
    assert load_text(text).step.microbatches == 1


def test_nesting_past_the_limit_is_refused_before_parsing() -> None:
    text = MINIMAL + "step { backward " + "(" * 10_000 + "sum" + ")" * 10_000 + " }\n"
    with pytest.raises(PlaceError) as raised:
        parse_text(text)
    [diagnostic] = raised.value.diagnostics
    assert diagnostic.code is Code.TOO_DEEP
    assert diagnostic.span == Span.point(4, 16 + MAX_NESTING)


def test_brackets_in_comments_and_strings_do_not_count() -> None:
    text = '# ' + "(" * 100 + '\nstrategy "' + "{" * 100 + '"\n' + MINIMAL
    assert load_text(text).name == "{" * 100


# ---- rendering helpers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("word", "candidates", "hint"), [
    ("zer3", ["zero1", "zero2", "zero3"], "; did you mean 'zero3'?"),
    ("dq", ["dp", "tp"], "; did you mean 'dp'?"),
    ("pd", ["dp", "tp"], "; did you mean 'dp'?"),  # a swap of two letters
    ("tp", ["step", "mesh"], "; expected one of 'mesh', 'step'"),  # no loose match for short words
    ("xx", ["dp", "tp"], "; expected one of 'dp', 'tp'"),
    ("qq", [f"a{i}" for i in range(13)], ""),  # too many to list
    ("Dp", ["dp"], "; did you mean 'dp'?"),
])
def test_did_you_mean(word: str, candidates: list[str], hint: str) -> None:
    assert did_you_mean(word, candidates) == hint


def render(text: str, span: Span) -> str:
    return Diagnostic(Severity.ERROR, "m", Code.SYNTAX, span).render(Source("f", text))


def test_caret_under_tabs_and_wide_characters() -> None:
    assert render("\tab", Span(1, 2, 1, 4)).splitlines()[1:] == ["   1 |     ab", "     |     ^^"]
    # two wide characters take two cells each: the caret moves four cells
    assert render('"全分" x', Span(1, 6, 1, 7)).splitlines()[1:] == ['   1 | "全分" x', "     |        ^"]


def test_control_characters_are_not_printed_raw() -> None:
    out = render("a\x1b[31mb", Span(1, 2, 1, 3))
    assert "\x1b" not in out
    assert out.splitlines()[1:] == ["   1 | a\ufffd[31mb", "     |  ^"]


def test_long_lines_are_cut_around_the_caret() -> None:
    line = "x" * 300 + "BAD" + "y" * 300
    excerpt, caret = render(line, Span(1, 301, 1, 304)).splitlines()[1:]
    assert excerpt.startswith("   1 | …") and excerpt.endswith("…")
    assert len(excerpt) < 180
    assert excerpt[caret.index("^"):caret.index("^") + 3] == "BAD"


def test_form_feed_and_line_separators_do_not_shift_line_numbers() -> None:
    source = Source("f", "a\u2028b\x0cc\nsecond\n")
    assert source.line_text(2) == "second"
    assert source.end_span() == Span.point(2, 7)


def test_spans_render_as_file_line_column() -> None:
    with pytest.raises(PlaceError) as raised:
        load_text(MINIMAL.replace("over dp", "over dq"), "where.place")
    first = str(raised.value).splitlines()[0]
    assert re.match(r"^where\.place:3:18: error: unknown axis 'dq'; did you mean 'dp'\?  \[unknown-name\]$",
                    first)
