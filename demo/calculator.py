"""The demo agent's calculator: arithmetic read the way people write it, evaluated by a whitelist walk of Python's
AST (never eval()), every value and exponent bounded so that no expression a model writes can take long or grow
large."""
from __future__ import annotations

import ast
import math
import operator
import re

from core.errors import RlproxyError


class CalcError(RlproxyError, ValueError):
    """The expression is not plain arithmetic, or is out of bounds."""


MAX_EXPRESSION_CHARS = 120
MAX_MAGNITUDE = 10**18
MAX_EXPONENT = 12
MAX_DEPTH = 20

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def normalize_expression(expr: str, *, ignore_after_equals: bool = False) -> str:
    """Read the way people write sums: '37 x 46', '37 × 46', '2^8', '1,234 + 5', '37*46 = ?'.

    A trailing '=' or '= ?' is dropped; with ignore_after_equals, everything from the first '=' on is
    (so '37 * 46 = 1600 eggs' reads as 37 * 46).
    """
    if ignore_after_equals:
        expr = expr.split("=", 1)[0]
    expr = re.sub(r"\s*=?\s*\??\s*$", "", expr.strip())
    expr = expr.replace("×", "*").replace("÷", "/").replace("^", "**").replace("−", "-")
    expr = re.sub(r"(?<=\d)\s*[xX]\s*(?=\d)", " * ", expr)
    expr = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", expr)
    return expr


def safe_eval(expr: str, *, ignore_after_equals: bool = False) -> int | float:
    """The value of an arithmetic expression (numbers, + - * / // % **, parentheses), else CalcError."""
    text = normalize_expression(expr, ignore_after_equals=ignore_after_equals)
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalcError("expression too long")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise CalcError("not an arithmetic expression") from exc
    return _check(_eval(tree.body, 0))


def _check(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError("number too large")
    return value


def _eval(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalcError("expression too deep")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # not bool, str or complex
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, depth + 1))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or abs(left) > MAX_MAGNITUDE ** 0.5):
            raise CalcError("power too large")
        try:
            return _check(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError as exc:
            raise CalcError("division by zero") from exc
        except (OverflowError, TypeError) as exc:
            raise CalcError("cannot compute") from exc
    raise CalcError(f"not allowed in an arithmetic expression: {type(node).__name__}")


def format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value) if isinstance(value, int) else format(value, ".10g")
