"""A restricted arithmetic evaluator for the cost models of YAML-only extensions.

An extension written in YAML alone describes what an operation costs as an arithmetic
expression of the op's shapes and the extension's parameters, for example
``"ceil(M/16) * ceil(N/16) * K / 2 + 40"``. Nothing in a YAML file is ever handed to
``eval``: the text is parsed with :func:`ast.parse` and every node is checked against a
whitelist before anything is computed.

The grammar accepted:

* numbers (``int`` and ``float`` literals; not ``True``/``False``, strings, bytes,
  complex numbers);
* names (looked up in the environment given to :meth:`Expr.evaluate`; a name that is
  not there is an error);
* ``+ - * / // % **`` and unary ``+``/``-``, with parentheses;
* calls of ``min``, ``max`` (two or more arguments), ``ceil``, ``floor``, ``log2`` (one
  argument). Nothing else: no attribute access (``a.b``), no subscripts, no other calls,
  no keyword arguments, no comprehensions, lambdas, comparisons or conditionals.

Guards against hostile input: at most :data:`MAX_LENGTH` characters and
:data:`MAX_NODES` syntax nodes; every intermediate value must be finite and below
:data:`MAX_MAGNITUDE` in magnitude (an exponent is checked before it is computed, so
``9**9**9`` is refused without being computed); division by zero and ``log2`` of a
non-positive number are errors. Every refusal is an :class:`ExprError` that says what
was refused and where (1-based column).
"""

from __future__ import annotations

import ast
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..emulator.errors import WiaError

__all__ = [
    "Expr",
    "ExprError",
    "compile_expr",
    "evaluate_expr",
    "FUNCTIONS",
    "MAX_LENGTH",
    "MAX_NODES",
    "MAX_MAGNITUDE",
]

#: Longest expression text accepted.
MAX_LENGTH = 1000
#: Most syntax nodes accepted in one expression.
MAX_NODES = 200
#: Largest magnitude of any intermediate value.
MAX_MAGNITUDE = 1e30

Number = int | float


class ExprError(WiaError, ValueError):
    """An expression was refused (at parse time) or could not be evaluated."""


def _ceil(x: Number) -> int:
    return math.ceil(x)


def _floor(x: Number) -> int:
    return math.floor(x)


def _log2(x: Number) -> float:
    if x <= 0:
        raise ExprError(f"log2 of a non-positive number ({x!r})")
    return math.log2(x)


#: The functions an expression may call, with their argument counts (min, max).
FUNCTIONS: dict[str, tuple[object, int, int]] = {
    "min": (min, 2, 16),
    "max": (max, 2, 16),
    "ceil": (_ceil, 1, 1),
    "floor": (_floor, 1, 1),
    "log2": (_log2, 1, 1),
}

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_UNARY = (ast.UAdd, ast.USub)


def _where(node: ast.AST) -> str:
    col = getattr(node, "col_offset", None)
    return f" at column {col + 1}" if col is not None else ""


def _check(node: ast.AST, names: set[str]) -> None:
    """Raise ExprError unless every node under ``node`` is whitelisted."""
    if isinstance(node, ast.Expression):
        _check(node.body, names)
    elif isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ExprError(f"only numbers are allowed, not {v!r}{_where(node)}")
    elif isinstance(node, ast.Name):
        if node.id in FUNCTIONS:
            raise ExprError(f"{node.id!r} is a function; call it{_where(node)}")
        names.add(node.id)
    elif isinstance(node, ast.BinOp):
        if not isinstance(node.op, _BINOPS):
            raise ExprError(
                f"operator {type(node.op).__name__} is not allowed (allowed: "
                f"+ - * / // % **){_where(node)}"
            )
        _check(node.left, names)
        _check(node.right, names)
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, _UNARY):
            raise ExprError(f"unary operator {type(node.op).__name__} is not allowed{_where(node)}")
        _check(node.operand, names)
    elif isinstance(node, ast.Call):
        func = node.func
        if not isinstance(func, ast.Name) or func.id not in FUNCTIONS:
            what = ast.unparse(func) if isinstance(func, ast.AST) else "?"
            raise ExprError(
                f"call of {what!r} is not allowed (allowed: {', '.join(FUNCTIONS)}){_where(node)}"
            )
        if node.keywords:
            raise ExprError(f"keyword arguments are not allowed{_where(node)}")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise ExprError(f"*arguments are not allowed{_where(node)}")
        _, lo, hi = FUNCTIONS[func.id]
        if not lo <= len(node.args) <= hi:
            need = str(lo) if lo == hi else f"{lo} to {hi}"
            raise ExprError(
                f"{func.id}() takes {need} arguments, got {len(node.args)}{_where(node)}"
            )
        for a in node.args:
            _check(a, names)
    elif isinstance(node, ast.Attribute):
        raise ExprError(f"attribute access ({ast.unparse(node)!r}) is not allowed{_where(node)}")
    else:
        raise ExprError(
            f"{type(node).__name__} is not allowed in an expression (only "
            f"numbers, names, + - * / // % **, min, max, ceil, floor, log2)"
            f"{_where(node)}"
        )


def _bounded(v: Number, node: ast.AST) -> Number:
    if isinstance(v, float) and not math.isfinite(v) or abs(v) > MAX_MAGNITUDE:
        raise ExprError(f"value out of range ({v!r}; the limit is {MAX_MAGNITUDE:g}){_where(node)}")
    return v


def _eval(node: ast.AST, env: Mapping[str, Number]) -> Number:
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant):
        return _bounded(node.value, node)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExprError(
                f"unknown name {node.id!r} (known: {', '.join(sorted(env))}){_where(node)}"
            )
        v = env[node.id]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ExprError(f"name {node.id!r} is not a number ({v!r})")
        return _bounded(v, node)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.Call):
        fn, _, _ = FUNCTIONS[node.func.id]  # type: ignore[attr-defined]
        args = [_eval(a, env) for a in node.args]
        return _bounded(fn(*args), node)  # type: ignore[operator]
    assert isinstance(node, ast.BinOp)
    a, b = _eval(node.left, env), _eval(node.right, env)
    op = node.op
    if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
        raise ExprError(f"division by zero{_where(node)}")
    if isinstance(op, ast.Pow):
        if a == 0 and b < 0:
            raise ExprError(f"division by zero (0 to a negative power){_where(node)}")
        if a < 0 and not float(b).is_integer():
            raise ExprError(f"negative number to a fractional power{_where(node)}")
        # bound the result before computing it: |a|**b <= MAX_MAGNITUDE
        if abs(a) > 1 and b > 0 and b * math.log10(abs(a)) > math.log10(MAX_MAGNITUDE):
            raise ExprError(f"value out of range ({a!r} ** {b!r}){_where(node)}")
        if 0 < abs(a) < 1 and b < 0 and -b * math.log10(abs(a)) < -math.log10(MAX_MAGNITUDE):
            raise ExprError(f"value out of range ({a!r} ** {b!r}){_where(node)}")
        return _bounded(a**b, node)
    result = {
        ast.Add: lambda: a + b,
        ast.Sub: lambda: a - b,
        ast.Mult: lambda: a * b,
        ast.Div: lambda: a / b,
        ast.FloorDiv: lambda: a // b,
        ast.Mod: lambda: a % b,
    }[type(op)]()
    return _bounded(result, node)


@dataclass(frozen=True)
class Expr:
    """A checked expression. ``names`` are the variables it reads."""

    text: str
    names: frozenset[str]
    _tree: ast.Expression

    def evaluate(self, env: Mapping[str, Number]) -> Number:
        """The value with variables taken from ``env``; raises :class:`ExprError`."""
        return _eval(self._tree, env)

    def __str__(self) -> str:
        return self.text


def compile_expr(text: object, allowed_names: set[str] | frozenset[str] | None = None) -> Expr:
    """Parse and check ``text``; with ``allowed_names``, every variable must be one.

    Numbers in YAML may arrive as ``int``/``float``; they are accepted as constant
    expressions. Raises :class:`ExprError` for anything outside the grammar.
    """
    if isinstance(text, bool):
        raise ExprError(f"an expression must be a string or a number, got {text!r}")
    if isinstance(text, (int, float)):
        text = repr(text)
    if not isinstance(text, str):
        raise ExprError(f"an expression must be a string or a number, got {text!r}")
    if not text.strip():
        raise ExprError("empty expression")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression longer than {MAX_LENGTH} characters ({len(text)})")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ExprError(f"syntax error at column {e.offset or 0}: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError):
        raise ExprError("malformed expression") from None
    count = sum(1 for _ in ast.walk(tree))
    if count > MAX_NODES:
        raise ExprError(f"expression has {count} syntax nodes (the limit is {MAX_NODES})")
    names: set[str] = set()
    _check(tree, names)
    if allowed_names is not None:
        unknown = sorted(names - set(allowed_names))
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(allowed_names), n=1)
            raise ExprError(
                f"unknown name{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))} ("
                + (f"did you mean {close[0]!r}? " if close else "")
                + f"known: {', '.join(sorted(allowed_names))})"
            )
    return Expr(text.strip(), frozenset(names), tree)


def evaluate_expr(text: str, env: Mapping[str, Number]) -> Number:
    """Compile ``text`` against the names of ``env`` and evaluate it."""
    return compile_expr(text, set(env)).evaluate(env)
