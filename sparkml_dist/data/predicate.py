"""A user's row filter (`finetune.where`) as a checked boolean expression over the input's columns.

The text is parsed by Spark's own SQL parser and every node of the parsed tree is checked against
an allow-list before Spark ever evaluates it: column references (only the input's own columns),
literals, comparisons, boolean and arithmetic operators, CASE/IF/CAST/LIKE, and a short list of
pure scalar functions. Subqueries, `reflect`/`java_method`, file-reading and nondeterministic
functions, and anything not listed are refused with the node named. The result must be boolean.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

from sparkml_dist.errors import ConfigError

MAX_CHARS = 2000
MAX_NODES = 500

OPERATORS = frozenset(
    {
        "Literal",
        "And",
        "Or",
        "Not",
        "EqualTo",
        "EqualNullSafe",
        "LessThan",
        "LessThanOrEqual",
        "GreaterThan",
        "GreaterThanOrEqual",
        "In",
        "InSet",
        "IsNull",
        "IsNotNull",
        "IsNaN",
        "Add",
        "Subtract",
        "Multiply",
        "Divide",
        "IntegralDivide",
        "Remainder",
        "UnaryMinus",
        "UnaryPositive",
        "Abs",
        "Cast",
        "CaseWhen",
        "If",
        "Like",
        "ILike",
        "RLike",
        "LikeAny",
        "LikeAll",
        "NotLikeAny",
        "NotLikeAll",
        "Coalesce",
        "Concat",
        "Upper",
        "Lower",
    }
)
FUNCTIONS = frozenset(
    {
        "abs",
        "between",
        "ceil",
        "ceiling",
        "coalesce",
        "concat",
        "contains",
        "date",
        "day",
        "dayofmonth",
        "dayofweek",
        "dayofyear",
        "endswith",
        "floor",
        "greatest",
        "hour",
        "if",
        "ifnull",
        "isnan",
        "isnotnull",
        "isnull",
        "lcase",
        "least",
        "left",
        "length",
        "lower",
        "ltrim",
        "month",
        "nanvl",
        "nvl",
        "nvl2",
        "quarter",
        "right",
        "round",
        "rtrim",
        "sign",
        "signum",
        "startswith",
        "substr",
        "substring",
        "to_date",
        "trim",
        "ucase",
        "upper",
        "weekofyear",
        "year",
    }
)


def checked_predicate(rows: DataFrame, where: str, key: str = "finetune.where") -> Column:
    """`where` as a Column, once every node is allowed and it is boolean over `rows`' columns."""
    if len(where) > MAX_CHARS:
        raise ConfigError(f"{key}: {len(where)} characters; a row filter is at most {MAX_CHARS}")
    columns = [c for c in rows.columns if not c.startswith("_")]
    spark = rows.sparkSession
    try:
        tree = spark._jsparkSession.sessionState().sqlParser().parseExpression(where)
    except Exception as exc:
        raise ConfigError(
            f"{key}: {where!r} does not parse as a SQL expression: {_first_line(exc)}"
        ) from None
    _check_tree(tree, {c.lower() for c in columns}, where, key, columns)
    column = F.expr(where)
    try:
        kind = rows.select(column).schema[0].dataType
    except Exception as exc:
        raise ConfigError(
            f"{key}: {where!r} is not a valid predicate over the columns {columns}: {_first_line(exc)}"
        ) from None
    if not isinstance(kind, BooleanType):
        raise ConfigError(
            f"{key}: {where!r} is {kind.simpleString()}, not boolean: write a condition, "
            f"e.g. age > 40 AND sex = 'Female'"
        )
    return column


def named_columns(rows: DataFrame, where: str) -> list[str]:
    """The columns of `rows` that a checked `where` names, in the order it first names them."""
    tree = rows.sparkSession._jsparkSession.sessionState().sqlParser().parseExpression(where)
    by_lower = {c.lower(): c for c in rows.columns}
    named: list[str] = []
    for node in _nodes(tree):
        if node.getClass().getSimpleName() == "UnresolvedAttribute":
            column = by_lower.get(".".join(_parts(node)).lower())
            if column and column not in named:
                named.append(column)
    return named


def _nodes(root):
    """The parsed tree's nodes, parents before their children, left to right."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        children = node.children()
        stack.extend(children.apply(i) for i in reversed(range(children.size())))


def _check_tree(root, allowed_columns: set[str], where: str, key: str, columns: Sequence[str]) -> None:
    for seen, node in enumerate(_nodes(root), start=1):
        if seen > MAX_NODES:
            raise ConfigError(f"{key}: more than {MAX_NODES} terms; a row filter should be short")
        kind = node.getClass().getSimpleName()
        if kind == "UnresolvedAttribute":
            name = ".".join(_parts(node))
            if name.lower() not in allowed_columns:
                raise ConfigError(
                    f"{key}: {where!r} names {name!r}, which is not a column of the input "
                    f"{list(columns)} (quote names with spaces in backticks)"
                )
        elif kind == "UnresolvedFunction":
            name = ".".join(_parts(node)).lower()
            if name not in FUNCTIONS:
                raise ConfigError(
                    f"{key}: {where!r} calls {name}(), which a row filter may not use; allowed "
                    f"functions: {', '.join(sorted(FUNCTIONS))}"
                )
        elif kind not in OPERATORS:
            raise ConfigError(
                f"{key}: {where!r} contains a {kind}, which a row filter may not use (only "
                f"comparisons, boolean and arithmetic operators, CASE, CAST, LIKE, IN and "
                f"simple functions over the input's columns)"
            )


def _parts(node) -> list[str]:
    parts = node.nameParts()
    return [parts.apply(i) for i in range(parts.size())]


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("ParseException:", "AnalysisException:"):
        if marker in text:
            text = text.split(marker, 1)[1]
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
