"""The tests a launch script's reader decides (:mod:`placeverify.importers.shell`): ``[[ ]]``,
``[ ]`` and ``test`` over known values, and integer arithmetic, never evaluated by Python."""

from __future__ import annotations

import fnmatch
import re

from placeverify.importers.shell_values import Text

FILE_TESTS = frozenset("-" + c for c in "abcdefghkprstuwxGLNOS")
INTEGER_TESTS = ("-eq", "-ne", "-lt", "-le", "-gt", "-ge")
BINARY = frozenset(("=", "==", "!=", "=~", "<", ">", "-nt", "-ot", "-ef", *INTEGER_TESTS))


TestArg = tuple[str, bool, Text, bool]  # text, may be an operator, value, a pattern (in [[ ]])


def truth(args: list[TestArg], arithmetic: bool = False) -> bool | str:
    """A test's truth, or why it is undecided."""
    position = 0

    def peek(k: int = 0) -> str | None:
        i = position + k
        return args[i][0] if i < len(args) and args[i][1] else None

    def take() -> TestArg:
        nonlocal position
        position += 1
        return args[position - 1]

    def or_() -> bool | str:
        value = and_()
        while peek() in ("||", "-o"):
            take()
            value = _either(value, and_(), True)
        return value

    def and_() -> bool | str:
        value = not_()
        while peek() in ("&&", "-a"):
            take()
            value = _either(value, not_(), False)
        return value

    def not_() -> bool | str:
        if peek() == "!" and position + 1 < len(args):
            take()
            value = not_()
            return (not value) if isinstance(value, bool) else value
        return primary()

    def primary() -> bool | str:
        if position >= len(args):
            return "an empty test"
        if peek() == "(":
            take()
            value = or_()
            if peek() != ")":
                return "a test without its closing ')'"
            take()
            return value
        if peek(1) in BINARY and position + 2 < len(args):
            left = take()
            op = take()[0]
            right = take()
            return _binary(left, op, right, arithmetic)
        first = peek()
        if first is not None and first.startswith("-") and len(first) == 2 \
                and position + 1 < len(args):
            op = take()[0]
            operand = take()
            return _unary(op, operand)
        arg = take()
        return _known(arg) or arg[0] != ""

    result = or_()
    if position != len(args):
        return "a test placeverify does not read (" + " ".join(a[0] for a in args) + ")"
    return result


def _known(arg: TestArg) -> str | None:
    problem = arg[2].problem()
    return problem.reason if problem is not None else None


def _either(a: bool | str, b: bool | str, stop: bool) -> bool | str:
    if a is stop or b is stop:
        return stop
    if isinstance(a, str):
        return a
    return b


def _unary(op: str, operand: TestArg) -> bool | str:
    if op in ("-z", "-n"):
        why = _known(operand)
        if why:
            return why
        return (operand[0] == "") == (op == "-z")
    if op in FILE_TESTS:
        return f"`{op}` tests the file system (only running the script tells)"
    return f"the test operator `{op}` is not one placeverify evaluates"


def _integer(arg: TestArg, arithmetic: bool) -> int | None:
    text = arg[0].strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return arithmetic_value(text) if arithmetic else None


def _binary(left: TestArg, op: str, right: TestArg, arithmetic: bool) -> bool | str:
    why = _known(left) or _known(right)
    if op in ("=", "==", "!="):
        if why:
            return why
        same = fnmatch.fnmatchcase(left[0], right[0]) if right[3] else left[0] == right[0]
        return same if op != "!=" else not same
    if op in INTEGER_TESTS:
        if why:
            return why
        a, b = _integer(left, arithmetic), _integer(right, arithmetic)
        if a is None or b is None:
            return f"`{op}` compares whole numbers, not '{left[0]}' and '{right[0]}'"
        return {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b,
                "-ge": a >= b}[op]
    return f"the test operator `{op}` is not one placeverify evaluates"


def arithmetic_value(expression: str) -> int | None:
    """Integer + - * / % and parentheses; None for anything else (never evaluated by Python)."""
    tokens: list[str] = re.findall(r"\d+|[-+*/%()]|\S", expression)
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> str:
        nonlocal position
        position += 1
        return tokens[position - 1]

    def atom() -> int | None:
        token = peek()
        if token is None:
            return None
        if token == "(":
            take()
            value = sum_()
            return value if value is not None and peek() == ")" and take() else None
        if token == "-":
            take()
            value = atom()
            return None if value is None else -value
        if token.isdigit():
            return int(take())
        return None

    def product() -> int | None:
        value = atom()
        while value is not None and peek() in ("*", "/", "%"):
            op, right = take(), atom()
            if right is None or (op != "*" and right == 0):
                return None
            value = value * right if op == "*" else (int(value / right) if op == "/"
                                                     else value - right * int(value / right))
        return value

    def sum_() -> int | None:
        value = product()
        while value is not None and peek() in ("+", "-"):
            op, right = take(), product()
            if right is None:
                return None
            value = value + right if op == "+" else value - right
        return value

    result = sum_()
    return result if position == len(tokens) else None
