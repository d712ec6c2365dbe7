//! A CSV file sniffed once. DuckDB's `read_csv` detects the dialect (quote, escape, line
//! ending, date formats) and the column types every time a statement over it is bound, and
//! a job binds many: each node's view, the column checks before each statement, the final
//! read-back. On a 76 MB file each bind sniffs for ~70 ms, so a three-node group-by bound
//! the file six times and spent more time sniffing than aggregating. Here `sniff_csv` runs
//! once, with the node's own options, and the node's view reads the file with what it found
//! pinned (`auto_detect = false`): the same dialect and types an auto-detecting read would
//! use, and binds that cost nothing.
//!
//! The SQL is built by xpu from the sniffer's fields, every value quoted as a literal: a
//! column name in a user's header cannot reach the statement as SQL.

use duckdb::Connection;
use xpu_ir::DType;

use crate::sql::lit;

/// What the sniffer found.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Dialect {
    delimiter: String,
    quote: String,
    escape: String,
    new_line: String,
    comment: String,
    skip: i64,
    header: bool,
    date_format: Option<String>,
    timestamp_format: Option<String>,
    /// (name, DuckDB type) in file order.
    columns: Vec<(String, String)>,
}

/// The dialect DuckDB's sniffer gives a header-first file with no quote character (no
/// quoting, no escape, no comment, nothing skipped; the line ending left to DuckDB) and
/// these numeric columns.
fn plain_numeric(columns: Vec<(String, DType)>) -> Option<Dialect> {
    let columns = columns
        .into_iter()
        .map(|(name, dtype)| match dtype {
            DType::I64 => Some((name, "BIGINT".to_string())),
            DType::F64 => Some((name, "DOUBLE".to_string())),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Dialect {
        delimiter: ",".into(),
        quote: String::new(),
        escape: String::new(),
        new_line: String::new(),
        comment: String::new(),
        skip: 0,
        header: true,
        date_format: None,
        timestamp_format: None,
        columns,
    })
}

/// `sniff_csv` writes an unset character as `(empty)`.
fn unset_is_empty(s: String) -> String {
    if s == "(empty)" { String::new() } else { s }
}

/// `read_csv(...)` (the auto-detecting source xpu built for the node) with its dialect and
/// column types pinned, or `None` when the sniffer cannot read the file (the auto-detecting
/// source then runs and reports the problem where it always has). `numeric`: the file's
/// schema from `native::numeric_schema` where it answers — a header, no quote character,
/// plain integer and decimal columns, what DuckDB's sniffer finds for such a file — which
/// spares DuckDB's sniffing pass. `nulls`: the null markers that can occur in the file
/// (`native::possible_null_markers`), which replace the node's list.
pub fn pinned(
    conn: &Connection,
    auto_source: &str,
    numeric: Option<Vec<(String, DType)>>,
    nulls: Option<Vec<String>>,
) -> Option<String> {
    let args = auto_source.strip_prefix("read_csv(")?.strip_suffix(')')?;
    let dialect = match numeric {
        Some(columns) => plain_numeric(columns)?,
        None => sniff(conn, args).ok()?,
    };
    if dialect.columns.is_empty() {
        return None;
    }
    // The path: the first argument, exactly as xpu wrote it (a quoted literal).
    let path = first_argument(args)?;
    // The node's own options (header, delim, nullstr) stay as written; what the sniffer
    // found is added, so nothing is detected again.
    let rest = args[path.len()..].trim_start_matches([',', ' ']);
    // The options xpu wrote before the null strings (whose values are the user's).
    let own = rest.split("nullstr = [").next().unwrap_or(rest);
    let mut opts = vec![
        "auto_detect = false".to_string(),
        format!("quote = {}", lit(&dialect.quote)),
        format!("escape = {}", lit(&dialect.escape)),
        format!("comment = {}", lit(&dialect.comment)),
        format!("skip = {}", dialect.skip),
    ];
    // A file of one line has no line ending to find (the sniffer says ""): DuckDB's own
    // default then applies, as it does when detecting.
    if !dialect.new_line.is_empty() {
        opts.push(format!("new_line = {}", lit(&dialect.new_line)));
    }
    if !own.contains("delim =") {
        opts.push(format!("delim = {}", lit(&dialect.delimiter)));
    }
    if !own.contains("header =") {
        opts.push(format!("header = {}", dialect.header));
    }
    if let Some(f) = &dialect.date_format {
        opts.push(format!("dateformat = {}", lit(f)));
    }
    if let Some(f) = &dialect.timestamp_format {
        opts.push(format!("timestampformat = {}", lit(f)));
    }
    let columns: Vec<String> =
        dialect.columns.iter().map(|(n, t)| format!("{}: {}", lit(n), lit(t))).collect();
    opts.push(format!("columns = {{{}}}", columns.join(", ")));
    let rest = match nulls {
        Some(markers) => {
            let list: Vec<String> = markers.iter().map(|m| lit(m)).collect();
            format!("{own}nullstr = [{}]", list.join(", "))
        }
        None => rest.to_string(),
    };
    let source = format!("read_csv({path}, {rest}, {})", opts.join(", "));
    // Bound once here (no detection: about a millisecond); a dialect DuckDB will not take
    // back leaves the auto-detecting source in place.
    crate::exec::describe(conn, &format!("SELECT * FROM {source}")).ok()?;
    Some(source)
}

/// The first argument of an argument list whose first argument is a single-quoted literal
/// (quotes inside doubled, as `lit` writes them).
fn first_argument(args: &str) -> Option<&str> {
    let bytes = args.as_bytes();
    if bytes.first() != Some(&b'\'') {
        return None;
    }
    let mut i = 1;
    while i < bytes.len() {
        if bytes[i] == b'\'' {
            if bytes.get(i + 1) == Some(&b'\'') {
                i += 2;
                continue;
            }
            return Some(&args[..=i]);
        }
        i += 1;
    }
    None
}

/// One `sniff_csv` over the file with the node's options: the dialect, and one row per
/// column for its name and type.
fn sniff(conn: &Connection, args: &str) -> Result<Dialect, duckdb::Error> {
    let query = format!(
        "SELECT Delimiter, Quote, Escape, NewLineDelimiter, Comment, SkipRows, HasHeader, \
         DateFormat, TimestampFormat, unnest(Columns).name, unnest(Columns).type \
         FROM sniff_csv({args})"
    );
    let mut stmt = conn.prepare(&query)?;
    let mut rows = stmt.query([])?;
    let mut dialect: Option<Dialect> = None;
    while let Some(row) = rows.next()? {
        let column = (row.get::<_, String>(9)?, row.get::<_, String>(10)?);
        match &mut dialect {
            Some(d) => d.columns.push(column),
            None => {
                dialect = Some(Dialect {
                    delimiter: unset_is_empty(row.get(0)?),
                    quote: unset_is_empty(row.get(1)?),
                    escape: unset_is_empty(row.get(2)?),
                    new_line: unset_is_empty(row.get(3)?),
                    comment: unset_is_empty(row.get(4)?),
                    skip: row.get::<_, i64>(5)?,
                    header: row.get(6)?,
                    date_format: row.get::<_, Option<String>>(7)?.filter(|f| !f.is_empty()),
                    timestamp_format: row.get::<_, Option<String>>(8)?.filter(|f| !f.is_empty()),
                    columns: vec![column],
                })
            }
        }
    }
    dialect.ok_or(duckdb::Error::QueryReturnedNoRows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_argument_is_the_whole_quoted_literal() {
        assert_eq!(first_argument("'a.csv', header = true"), Some("'a.csv'"));
        assert_eq!(first_argument("'it''s, here.csv', x"), Some("'it''s, here.csv'"));
        assert_eq!(first_argument("'unterminated"), None);
        assert_eq!(first_argument("a.csv"), None);
        assert_eq!(first_argument(""), None);
    }
}
