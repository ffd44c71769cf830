"""A user's row filter (`finetune.where`) as a checked boolean expression over the input's columns.

The text is parsed on the client, by sqlglot's Spark dialect, not by Spark's parser on the
driver's JVM, which a Spark Connect client does not have: one parser and one allow-list on every
kind of session. Every node of the parsed tree is checked before Spark ever sees it: column
references (only the input's own columns), literals, comparisons, boolean and arithmetic
operators, CASE/IF/CAST/LIKE, and a short list of pure scalar functions. Subqueries,
`reflect`/`java_method`, file-reading and nondeterministic functions, and anything not listed are
refused with the node named. What Spark evaluates is the checked tree written back as Spark SQL
(comments dropped), not the user's text, so that no difference between the two parsers can let
an unchecked node through. The result must be boolean.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import sqlglot
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

from sparkml_dist.errors import ConfigError

MAX_CHARS = 2000
MAX_NODES = 500

# sqlglot's node types a row filter may contain (its typed functions among them: sqlglot parses
# `lower(x)` as `Lower`, `substr` as `Substring`, `to_date` as `TsOrDsToDate`)
NODES: tuple[type[exp.Expr], ...] = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.Paren,
    exp.Tuple,
    exp.And,
    exp.Or,
    exp.Not,
    exp.EQ,
    exp.NEQ,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
    exp.LT,
    exp.LTE,
    exp.GT,
    exp.GTE,
    exp.In,
    exp.Is,
    exp.Between,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.IntDiv,
    exp.Mod,
    exp.Neg,
    exp.Cast,
    exp.TryCast,
    exp.DataType,
    exp.DataTypeParam,
    exp.Case,
    exp.If,
    exp.Like,
    exp.ILike,
    exp.RegexpLike,
    exp.Any,
    exp.All,
    exp.Coalesce,
    exp.Concat,
    exp.Upper,
    exp.Lower,
    exp.Abs,
    exp.Ceil,
    exp.Floor,
    exp.Round,
    exp.Sign,
    exp.Greatest,
    exp.Least,
    exp.Length,
    exp.Substring,
    exp.Trim,
    exp.Left,
    exp.Right,
    exp.StartsWith,
    exp.EndsWith,
    exp.Contains,
    exp.IsNan,
    exp.Nanvl,
    exp.Nvl2,
    exp.Year,
    exp.Month,
    exp.Day,
    exp.DayOfMonth,
    exp.DayOfWeek,
    exp.DayOfYear,
    exp.WeekOfYear,
    exp.Quarter,
    exp.Hour,
    exp.TsOrDsToDate,
)
# the functions a row filter may call, by the name the user writes: what the error lists, and the
# allow-list for a function sqlglot has no type for (`Anonymous`, e.g. isnull, ltrim)
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
    columns = [c for c in rows.columns if not c.startswith("_")]
    tree = _parsed(where, key)
    _check_tree(tree, {c.lower() for c in columns}, where, key, columns)
    column = F.expr(tree.sql(dialect="spark", comments=False))  # the checked tree, not the text
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
    by_lower = {c.lower(): c for c in rows.columns}
    named: list[str] = []
    for node in _nodes(_parsed(where, "finetune.where")):
        if isinstance(node, exp.Column):
            column = by_lower.get(_column_name(node).lower())
            if column and column not in named:
                named.append(column)
    return named


def _parsed(where: str, key: str) -> exp.Expr:
    if len(where) > MAX_CHARS:
        raise ConfigError(f"{key}: {len(where)} characters; a row filter is at most {MAX_CHARS}")
    try:
        return sqlglot.parse_one(where, read="spark", into=exp.Condition)
    except SqlglotError as exc:  # ParseError, or TokenError for an unclosed quote
        errors = exc.errors if isinstance(exc, ParseError) else [{"description": str(exc)}]
        reason = next((e.get("description") for e in errors if e.get("description")), "")
        raise ConfigError(
            f"{key}: {where!r} does not parse as a SQL expression"
            + (f": {reason}" if reason else "; write one condition, e.g. age > 40 AND sex = 'Female'")
        ) from None


def _nodes(root: exp.Expr) -> Iterator[exp.Expr]:
    """The parsed tree's nodes, parents before their children, left to right."""
    return root.walk(bfs=False)


def _check_tree(
    root: exp.Expr, allowed_columns: set[str], where: str, key: str, columns: Sequence[str]
) -> None:
    for seen, node in enumerate(_nodes(root), start=1):
        if seen > MAX_NODES:
            raise ConfigError(f"{key}: more than {MAX_NODES} terms; a row filter should be short")
        if isinstance(node, exp.Column):
            name = _column_name(node)
            if name.lower() not in allowed_columns:
                raise ConfigError(
                    f"{key}: {where!r} names {name!r}, which is not a column of the input "
                    f"{list(columns)} (quote names with spaces in backticks)"
                )
        elif isinstance(node, exp.Anonymous):
            if node.name.lower() not in FUNCTIONS:
                _refuse_call(node.name, where, key)
        elif isinstance(node, exp.Func) and not isinstance(node, (exp.Anonymous, *NODES)):
            _refuse_call(node.sql_name(), where, key)
        elif not isinstance(node, NODES):
            raise ConfigError(
                f"{key}: {where!r} contains a {type(node).__name__}, which a row filter may not use (only "
                f"comparisons, boolean and arithmetic operators, CASE, CAST, LIKE, IN and "
                f"simple functions over the input's columns)"
            )


def _refuse_call(name: str, where: str, key: str) -> None:
    raise ConfigError(
        f"{key}: {where!r} calls {name.lower()}(), which a row filter may not use; allowed "
        f"functions: {', '.join(sorted(FUNCTIONS))}"
    )


def _column_name(node: exp.Column) -> str:
    return ".".join(part.name for part in node.parts)


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("ParseException:", "AnalysisException:"):
        if marker in text:
            text = text.split(marker, 1)[1]
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
