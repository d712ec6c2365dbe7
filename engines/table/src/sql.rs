//! SQL text for table nodes: quoting, row expressions, the aggregate functions MiniLang
//! names, and the statement each op runs. Pure string building, so it is tested without a
//! database. This is the only place program data becomes SQL: identifiers through [`ident`],
//! strings through [`lit`], row expressions through [`row_expr`] (typed `RowExpr`s, checked
//! by the IR before they get here), everything else from closed lists.

use xpu_ir::DType;
use xpu_ir::rowexpr::{Literal, RowExpr, RowFunc};

/// A double-quoted SQL identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A single-quoted SQL string literal.
pub fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A row expression as an SQL expression. Every part is bracketed, so operator precedence in
/// SQL cannot regroup it, and no two `-` ever meet (`--` would open a comment).
pub fn row_expr(e: &RowExpr) -> String {
    match e {
        RowExpr::Col { name } => ident(name),
        RowExpr::Lit { value } => literal(value),
        RowExpr::Cast { arg, to } => {
            let ty = match to {
                DType::F64 => "DOUBLE",
                DType::I64 => "BIGINT",
                DType::Bool => "BOOLEAN",
                _ => "VARCHAR",
            };
            format!("TRY_CAST({} AS {ty})", row_expr(arg))
        }
        RowExpr::Call { func, args } => call(*func, &args.iter().map(row_expr).collect::<Vec<_>>()),
    }
}

fn literal(v: &Literal) -> String {
    match v {
        Literal::Null => "NULL".into(),
        Literal::Bool(b) => if *b { "TRUE" } else { "FALSE" }.into(),
        Literal::Int(i) => format!("({i})"),
        Literal::Float(f) if f.is_finite() => format!("({f:?}::DOUBLE)"),
        Literal::Float(f) if f.is_nan() => "('nan'::DOUBLE)".into(),
        Literal::Float(f) => format!("('{}'::DOUBLE)", if *f > 0.0 { "inf" } else { "-inf" }),
        Literal::Str(s) => lit(s),
    }
}

fn call(func: RowFunc, a: &[String]) -> String {
    use RowFunc::*;
    let bin = |op: &str| format!("({} {op} {})", a[0], a[1]);
    match func {
        Neg => format!("(- {})", a[0]),
        Not => format!("(NOT {})", a[0]),
        Add => bin("+"),
        Sub => bin("-"),
        Mul => bin("*"),
        Div => format!("({}::DOUBLE / {})", a[0], a[1]),
        // Python's (and pandas') modulo takes the divisor's sign.
        Mod => format!("({0} - {1} * floor({0}::DOUBLE / {1}))", a[0], a[1]),
        Pow => format!("power({}, {})", a[0], a[1]),
        Concat => bin("||"),
        Eq => bin("="),
        Ne => bin("<>"),
        Lt => bin("<"),
        Le => bin("<="),
        Gt => bin(">"),
        Ge => bin(">="),
        And => bin("AND"),
        Or => bin("OR"),
        IsNull => format!("({} IS NULL)", a[0]),
        NotNull => format!("({} IS NOT NULL)", a[0]),
        FillNull => format!("coalesce({}, {})", a[0], a[1]),
        If => format!("(CASE WHEN {} THEN {} ELSE {} END)", a[0], a[1], a[2]),
        Abs => format!("abs({})", a[0]),
        Sqrt => format!("sqrt({}::DOUBLE)", a[0]),
        Exp => format!("exp({}::DOUBLE)", a[0]),
        Log => format!("ln({}::DOUBLE)", a[0]),
        Floor => format!("floor({}::DOUBLE)", a[0]),
        Ceil => format!("ceil({}::DOUBLE)", a[0]),
        Round if a.len() == 2 => format!("round({}::DOUBLE, {})", a[0], a[1]),
        Round => format!("round({}::DOUBLE)", a[0]),
        Lower => format!("lower({})", a[0]),
        Upper => format!("upper({})", a[0]),
        Len => format!("length({})", a[0]),
        Contains => format!("contains({}, {})", a[0], a[1]),
        StartsWith => format!("starts_with({}, {})", a[0], a[1]),
        EndsWith => format!("ends_with({}, {})", a[0], a[1]),
    }
}

/// The aggregate functions of `agg`, `pivot` and their SQL, pandas semantics: nulls skipped,
/// `std`/`var` sample statistics, `median` interpolated, `sum` of nothing 0, `count()` the
/// group size.
pub const AGG_FUNCS: &[&str] = xpu_ir::table_attrs::AGGREGATES;

/// The SQL of one aggregate over `col`, an SQL expression already quoted (`None` for
/// `count()`), given the column's type;
/// `order` is the expression giving input order (for `first`).
pub fn aggregate(func: &str, col: Option<&str>, ty: Option<DType>, order: &str) -> Option<String> {
    let Some(col) = col else {
        return (func == "count").then(|| "count(*)".to_string());
    };
    let c = col;
    Some(match func {
        "count" => format!("count({c})"),
        "sum" => match ty {
            Some(DType::F64) => format!("coalesce(sum({c}), 0)::DOUBLE"),
            Some(DType::Bool) => format!("coalesce(sum({c}::BIGINT), 0)::BIGINT"),
            _ => format!("coalesce(sum({c}), 0)::BIGINT"),
        },
        "mean" => format!("avg({c}::DOUBLE)"),
        "std" => format!("stddev_samp({c}::DOUBLE)"),
        "var" => format!("var_samp({c}::DOUBLE)"),
        "median" => format!("quantile_cont({c}::DOUBLE, 0.5)"),
        "min" => format!("min({c})"),
        "max" => format!("max({c})"),
        "first" => format!("first({c} ORDER BY {order}) FILTER (WHERE {c} IS NOT NULL)"),
        "nunique" => format!("count(DISTINCT {c})"),
        _ => return None,
    })
}

/// A DuckDB type name as the dtype MiniLang sees: integers i64, other numbers f64, booleans
/// bool, everything else (text, dates, nested values) string.
pub fn dtype_of_sql(ty: &str) -> DType {
    let t = ty.to_ascii_uppercase();
    match t.as_str() {
        "BOOLEAN" => DType::Bool,
        "TINYINT" | "SMALLINT" | "INTEGER" | "BIGINT" | "UTINYINT" | "USMALLINT" | "UINTEGER" => {
            DType::I64
        }
        "UBIGINT" | "HUGEINT" | "UHUGEINT" | "FLOAT" | "DOUBLE" | "REAL" => DType::F64,
        _ if t.starts_with("DECIMAL") => DType::F64,
        _ => DType::String,
    }
}

/// The SQL type a column of `dtype` is read back as.
pub fn sql_of_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "BOOLEAN",
        DType::I64 => "BIGINT",
        DType::F64 => "DOUBLE",
        _ => "VARCHAR",
    }
}

pub use xpu_ir::table::PANDAS_NA_VALUES;

/// The `read_csv` table function call for a file.
/// The column types DuckDB's CSV sniffer may choose: MiniLang's (bool, i64, f64, string).
const AUTO_TYPES: &[&str] = &["'BOOLEAN'", "'BIGINT'", "'DOUBLE'", "'VARCHAR'"];

pub fn read_csv(path: &str, sep: &str, header: bool, na_values: &[String]) -> String {
    let mut opts = vec![format!("header = {header}")];
    if !sep.is_empty() {
        opts.push(format!("delim = {}", lit(sep)));
    }
    let na: Vec<String> = if na_values.is_empty() {
        PANDAS_NA_VALUES.iter().map(|s| lit(s)).collect()
    } else {
        na_values.iter().map(|s| lit(s)).collect()
    };
    opts.push(format!("nullstr = [{}]", na.join(", ")));
    // MiniLang has no date or time type: such columns are strings at compile time, so they
    // must be strings when the SQL runs too (as pandas' read_csv keeps them), not DuckDB's
    // DATE, TIME or TIMESTAMP — else `starts_with(date, "2024-03")` checks and then fails.
    opts.push(format!("auto_type_candidates = [{}]", AUTO_TYPES.join(", ")));
    format!("read_csv({}, {})", lit(path), opts.join(", "))
}

/// The statistic names `describe` knows, in pandas' order; any `N%` (0 ≤ N ≤ 100) is a
/// percentile too.
pub const DESCRIBE_STATS: &[&str] = xpu_ir::table_attrs::DESCRIBE_STATS;

/// A statistic's aggregate over the column `c` (already quoted), as DOUBLE.
pub fn describe_stat(stat: &str, c: &str) -> Option<String> {
    Some(match stat {
        "count" => format!("count({c})::DOUBLE"),
        "mean" => format!("avg({c}::DOUBLE)"),
        "std" => format!("stddev_samp({c}::DOUBLE)"),
        "min" => format!("min({c})::DOUBLE"),
        "max" => format!("max({c})::DOUBLE"),
        p => {
            let q = percentile(p)?;
            format!("quantile_cont({c}::DOUBLE, {q})")
        }
    })
}

pub use xpu_ir::table_attrs::percentile;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_the_quote_characters() {
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(lit("it's"), "'it''s'");
    }

    #[test]
    fn percentiles_parse_in_range_only() {
        assert_eq!(percentile("25%"), Some(0.25));
        assert_eq!(percentile("100%"), Some(1.0));
        assert_eq!(percentile("101%"), None);
        assert_eq!(percentile("mean"), None);
    }

    #[test]
    fn aggregates_follow_pandas() {
        assert_eq!(aggregate("count", None, None, "r").as_deref(), Some("count(*)"));
        assert_eq!(
            aggregate("nunique", Some("\"a\""), None, "r").as_deref(),
            Some("count(DISTINCT \"a\")")
        );
        assert!(aggregate("mode", Some("a"), None, "r").is_none());
        assert_eq!(dtype_of_sql("DECIMAL(10,2)"), DType::F64);
        assert_eq!(dtype_of_sql("DATE"), DType::String);
    }
}
