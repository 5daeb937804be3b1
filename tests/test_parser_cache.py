"""The parser cache: JSON only, keyed by the grammar, and never trusted when damaged."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from lark import Lark

from placeverify.syntax import parser_cache
from placeverify.syntax.grammar import PARSER_OPTIONS, grammar_path
from placeverify.syntax.to_ast import AstBuilder
from tests.conftest import example_files


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PLACEVERIFY_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PLACEVERIFY_NO_CACHE", raising=False)
    return tmp_path


def grammar() -> str:
    return grammar_path().read_text(encoding="utf-8")


def test_a_cached_parser_builds_the_same_asts_with_the_same_spans(cache: Path) -> None:
    fresh = Lark(grammar(), **PARSER_OPTIONS)
    parser_cache.load_or_build(grammar(), PARSER_OPTIONS, "t")  # writes the cache
    files = list(cache.glob("t-parser-*.json"))
    assert len(files) == 1
    json.loads(files[0].read_text())  # plain JSON: nothing to unpickle
    loaded = parser_cache.load_or_build(grammar(), PARSER_OPTIONS, "t")
    assert loaded is not fresh
    for path in example_files("bugs", "ok", "strategies"):
        text = path.read_text()
        assert AstBuilder().transform(loaded.parse(text)) == AstBuilder().transform(fresh.parse(text))


def test_a_damaged_or_foreign_cache_file_is_rebuilt(cache: Path) -> None:
    parser_cache.load_or_build(grammar(), PARSER_OPTIONS, "t")
    (path,) = cache.glob("t-parser-*.json")
    for damage in ("{not json", json.dumps({"key": "someone else's", "data": {}, "memo": {}}),
                   json.dumps({"key": path.name, "data": 1})):
        path.write_text(damage)
        assert parser_cache._read(path, "expected-key") is None
        rebuilt = parser_cache.load_or_build(grammar(), PARSER_OPTIONS, "t")
        assert rebuilt.parse("model { params = 1e9 }\nmesh { dp = 2 }\nplace ddp over dp\n")


def test_the_key_changes_with_the_grammar(cache: Path) -> None:
    parser_cache.load_or_build(grammar(), PARSER_OPTIONS, "t")
    parser_cache.load_or_build(grammar() + "\n// a comment\n", PARSER_OPTIONS, "t")
    assert len(list(cache.glob("t-parser-*.json"))) == 2


def test_the_cache_can_be_turned_off(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLACEVERIFY_NO_CACHE", "1")
    parser_cache.load_or_build(grammar(), PARSER_OPTIONS, "t")
    assert not list(cache.glob("*.json"))


def _cache_file(cache: Path) -> Path:
    key = parser_cache._key(grammar(), PARSER_OPTIONS, "t", [])
    return cache / f"t-parser-{key[:24]}.json"


@pytest.mark.parametrize("what", ["directory", "fifo"])
def test_something_else_at_the_cache_path_is_left_alone_and_nothing_leaks(
        cache: Path, what: str) -> None:
    target = _cache_file(cache)
    if what == "directory":
        target.mkdir()
    else:
        os.mkfifo(target)
    for _ in range(3):
        parser = parser_cache.load_or_build(grammar(), PARSER_OPTIONS, "t")
        assert parser.parse("model { params = 1e9 }\nmesh { dp = 2 }\nplace ddp over dp\n")
    assert [p.name for p in cache.iterdir()] == [target.name]
    assert target.is_dir() if what == "directory" else stat.S_ISFIFO(target.stat().st_mode)


def test_a_failed_rename_leaves_no_temporary_file(cache: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_src: str, _dst: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(parser_cache.os, "replace", refuse)
    parser_cache.load_or_build(grammar(), PARSER_OPTIONS, "t")
    assert list(cache.iterdir()) == []
