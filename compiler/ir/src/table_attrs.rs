//! What the attributes of table ops may hold, checked before any engine sees a node.
//!
//! Table ops reach an engine that speaks a query language (DuckDB SQL), so every string a
//! program puts in their attributes is refused here unless it is one of the closed set of
//! names the op knows (aggregates, statistics, join kinds, formats, plot kinds) or a name
//! the engine quotes (columns, sheets, titles), bounded and free of control characters.
//! Row expressions are typed data ([`crate::rowexpr`]). Paths are only checked for shape
//! here; confining them to the data roots needs the filesystem and is the caller's job (the
//! runtime does it for every program, whatever its source language).

use crate::rowexpr::{self, ColumnType, check_column_name};
use crate::{Attrs, DType, Op};

/// The aggregate functions of `group_agg` and `pivot`.
pub const AGGREGATES: &[&str] =
    &["count", "sum", "mean", "std", "var", "min", "max", "median", "first", "nunique"];

/// The statistics `describe` knows besides percentiles (`N%`, 0 ≤ N ≤ 100), in pandas' order.
pub const DESCRIBE_STATS: &[&str] = &["count", "mean", "std", "min", "25%", "50%", "75%", "max"];

/// `join.how`.
pub const JOIN_KINDS: &[&str] = &["inner", "left", "outer"];

/// `write_table.format`.
pub const WRITE_FORMATS: &[&str] = &["csv", "parquet"];

/// `plot.kind`.
pub const PLOT_KINDS: &[&str] = &["bar", "line", "scatter", "hist"];

/// The longest path, title or sheet name accepted (bytes).
pub const MAX_TEXT: usize = 4096;

/// `"25%"` → 0.25; `None` for anything that is not a percentile in 0..=100.
pub fn percentile(stat: &str) -> Option<f64> {
    let digits = stat.strip_suffix('%')?;
    // Plain decimal digits only: `parse` would also take `inf`, `1e2` or `+5`.
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let n: f64 = digits.parse().ok()?;
    (0.0..=100.0).contains(&n).then_some(n / 100.0)
}

/// Checks a table op's attributes; the message names the attribute and what is wrong.
pub fn check(op: Op, attrs: &Attrs) -> Result<(), String> {
    let one_of = |key: &str, default: &str, allowed: &[&str]| -> Result<(), String> {
        let v = attrs.str(key, default);
        if allowed.contains(&v) {
            Ok(())
        } else {
            Err(format!("`{key}` = {v:?} is not one of: {}", allowed.join(", ")))
        }
    };
    let column = |key: &str| -> Result<(), String> {
        match attrs.get(key) {
            None => Ok(()),
            Some(_) => check_column_name(attrs.str(key, "")).map_err(|m| format!("`{key}`: {m}")),
        }
    };
    let columns = |key: &str| -> Result<(), String> {
        for c in attrs.strs(key).unwrap_or(&[]) {
            check_column_name(c).map_err(|m| format!("`{key}`: {m}"))?;
        }
        Ok(())
    };
    let text = |key: &str| -> Result<(), String> { bounded_text(key, attrs.str(key, "")) };
    let path = |key: &str| -> Result<(), String> {
        let p = attrs.str(key, "");
        if p.is_empty() {
            return Err(format!("`{key}`: a path is required"));
        }
        bounded_text(key, p)
    };
    match op {
        Op::ReadCsv => {
            path("path")?;
            let sep = attrs.str("sep", ",");
            let mut chars = sep.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) if !c.is_control() || c == '\t' => {}
                _ => {
                    return Err(format!(
                        "`sep` = {sep:?} must be one character (not a control character other than tab)"
                    ));
                }
            }
            if matches!(sep, "\"" | "\n" | "\r") {
                return Err(format!("`sep` = {sep:?} cannot separate fields"));
            }
            for v in attrs.strs("na_values").unwrap_or(&[]) {
                bounded_text("na_values", v)?;
            }
            Ok(())
        }
        Op::ReadXlsx => {
            path("path")?;
            text("sheet")
        }
        Op::ReadParquet => path("path"),
        Op::WriteTable => {
            path("path")?;
            one_of("format", "csv", WRITE_FORMATS)
        }
        Op::SelectColumns | Op::SortRows => columns("columns"),
        Op::FilterRows => {
            let e = row(attrs, "predicate")?;
            match e.check(&|_| ColumnType::Unknown) {
                Ok(None | Some(DType::Bool)) => Ok(()),
                Ok(Some(d)) => Err(format!("`predicate` must be a bool, it is {d}")),
                Err(e) => Err(format!("`predicate`: {e}")),
            }
        }
        Op::WithColumn => {
            let e = row(attrs, "expr")?;
            e.check(&|_| ColumnType::Unknown).map_err(|e| format!("`expr`: {e}"))?;
            check_column_name(attrs.str("name", "")).map_err(|m| format!("`name`: {m}"))
        }
        Op::GroupAgg => {
            columns("keys")?;
            columns("names")?;
            let funcs = attrs.strs("funcs").unwrap_or(&[]);
            let cols = attrs.strs("columns").unwrap_or(&[]);
            let names = attrs.strs("names").unwrap_or(&[]);
            if funcs.len() != cols.len() || funcs.len() != names.len() {
                return Err(format!(
                    "`funcs`, `columns` and `names` must be as long as each other ({}, {}, {})",
                    funcs.len(),
                    cols.len(),
                    names.len()
                ));
            }
            for (f, c) in funcs.iter().zip(cols) {
                if !AGGREGATES.contains(&f.as_str()) {
                    return Err(format!("`funcs`: {f:?} is not one of: {}", AGGREGATES.join(", ")));
                }
                // `count` of no column counts rows; every other aggregate needs one.
                if !(c.is_empty() && f == "count") {
                    check_column_name(c).map_err(|m| format!("`columns`: {m}"))?;
                }
            }
            Ok(())
        }
        Op::Describe => {
            columns("columns")?;
            for s in attrs.strs("stats").unwrap_or(&[]) {
                if !DESCRIBE_STATS.contains(&s.as_str()) && percentile(s).is_none() {
                    return Err(format!(
                        "`stats`: {s:?} is not one of {} or a percentile `N%` (0 ≤ N ≤ 100)",
                        DESCRIBE_STATS.join(", ")
                    ));
                }
            }
            Ok(())
        }
        Op::Pivot => {
            column("index")?;
            column("columns")?;
            column("values")?;
            one_of("agg", "mean", AGGREGATES)
        }
        Op::Join => {
            columns("on")?;
            one_of("how", "inner", JOIN_KINDS)
        }
        Op::ValueCounts => column("column"),
        Op::TableToTensor => {
            columns("columns")?;
            let rows = attrs.str("rows", "rows");
            if rows.is_empty()
                || rows.len() > 256
                || !rows.chars().all(|c| c.is_alphanumeric() || c == '_')
            {
                return Err(format!(
                    "`rows` = {rows:?} must be a symbol name (letters, digits, _)"
                ));
            }
            Ok(())
        }
        Op::Plot => {
            path("path")?;
            one_of("kind", "line", PLOT_KINDS)?;
            text("title")?;
            // No `x` (empty): a histogram's bins, or the row number for the others.
            if !attrs.str("x", "").is_empty() {
                column("x")?;
            }
            columns("y")
        }
        Op::Head | Op::Distinct | Op::ConcatTables => Ok(()),
        _ => Ok(()),
    }
}

/// A row-expression attribute; SQL text (a string) is refused by name.
fn row<'a>(attrs: &'a Attrs, key: &str) -> Result<&'a rowexpr::RowExpr, String> {
    match attrs.get(key) {
        Some(crate::Attr::Row(e)) => Ok(e),
        Some(other) => Err(format!(
            "`{key}` must be a row expression such as row(gt(col(\"Age\"), 30)), not {} \
             (query text is not accepted)",
            other.kind().name()
        )),
        None => Err(format!("`{key}` is required")),
    }
}

fn bounded_text(key: &str, v: &str) -> Result<(), String> {
    if v.len() > MAX_TEXT {
        return Err(format!("`{key}` may have at most {MAX_TEXT} bytes, it has {}", v.len()));
    }
    if v.contains('\0') {
        return Err(format!("`{key}` holds a NUL character"));
    }
    Ok(())
}

/// Re-exported so callers need one import for table-op limits.
pub use rowexpr::MAX_COLUMN_NAME;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Attr;

    fn check_attrs(op: Op, attrs: &[(&str, Attr)], expect: Result<(), &str>) {
        let mut a = Attrs::new();
        for (k, v) in attrs {
            a.set(k, v.clone());
        }
        assert_eq!(check(op, &a), expect.map_err(str::to_string), "{op} {attrs:?}");
    }

    fn s(v: &str) -> Attr {
        Attr::Str(v.into())
    }

    fn ss(v: &[&str]) -> Attr {
        Attr::Strs(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn closed_sets_refuse_everything_else() {
        check_attrs(Op::WriteTable, &[("path", s("o.csv")), ("format", s("csv"))], Ok(()));
        check_attrs(
            Op::WriteTable,
            &[("path", s("o.csv")), ("format", s("csv) TO 'x' (FORMAT csv"))],
            Err("`format` = \"csv) TO 'x' (FORMAT csv\" is not one of: csv, parquet"),
        );
        check_attrs(
            Op::Join,
            &[("how", s("inner JOIN x"))],
            Err("`how` = \"inner JOIN x\" is not one of: inner, left, outer"),
        );
        check_attrs(Op::Describe, &[("stats", ss(&["mean", "90%", "12.5%"]))], Ok(()));
        check_attrs(
            Op::Describe,
            &[("stats", ss(&["1e2%"]))],
            Err(
                "`stats`: \"1e2%\" is not one of count, mean, std, min, 25%, 50%, 75%, max or a percentile `N%` (0 ≤ N ≤ 100)",
            ),
        );
        check_attrs(
            Op::GroupAgg,
            &[("funcs", ss(&["sum(1); --"])), ("columns", ss(&["a"])), ("names", ss(&["b"]))],
            Err(
                "`funcs`: \"sum(1); --\" is not one of: count, sum, mean, std, var, min, max, median, first, nunique",
            ),
        );
        check_attrs(
            Op::GroupAgg,
            &[("funcs", ss(&["count"])), ("columns", ss(&[""])), ("names", ss(&["n"]))],
            Ok(()),
        );
        check_attrs(
            Op::ReadCsv,
            &[("path", s("a.csv")), ("sep", s("';"))],
            Err("`sep` = \"';\" must be one character (not a control character other than tab)"),
        );
        check_attrs(Op::ReadCsv, &[("path", s(""))], Err("`path`: a path is required"));
        let plot = |x: &str| [("path", s("a.png")), ("kind", s("hist")), ("x", s(x))];
        check_attrs(Op::Plot, &plot(""), Ok(()));
        check_attrs(
            Op::Plot,
            &plot("a\nb"),
            Err("`x`: column name \"a\\nb\" holds the control character '\\n'"),
        );
        check_attrs(
            Op::TableToTensor,
            &[("rows", s("n) --"))],
            Err("`rows` = \"n) --\" must be a symbol name (letters, digits, _)"),
        );
    }

    #[test]
    fn predicates_are_typed_row_expressions() {
        use crate::rowexpr::{Literal, RowExpr, RowFunc};
        let gt =
            RowExpr::call(RowFunc::Gt, vec![RowExpr::col("Age"), RowExpr::lit(Literal::Int(30))]);
        check_attrs(Op::FilterRows, &[("predicate", Attr::Row(gt))], Ok(()));
        check_attrs(
            Op::FilterRows,
            &[("predicate", Attr::Row(RowExpr::lit(Literal::Int(1))))],
            Err("`predicate` must be a bool, it is i64"),
        );
        check_attrs(Op::FilterRows, &[], Err("`predicate` is required"));
    }
}
