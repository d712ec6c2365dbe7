//! Tables: the runtime value of SGR-ML values of dtype `table` — named, typed, nullable
//! columns — and their text form, which follows pandas' `DataFrame.__repr__` so results read
//! the same as in a notebook.

use std::fmt;

/// pandas' default missing-value markers (`read_csv(na_values=None)`), so a CSV reads with
/// the same holes in both.
pub const PANDAS_NA_VALUES: &[&str] = &[
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
    "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null",
];

/// The cells of one column; `None` is a missing value (SQL NULL, pandas NaN).
#[derive(Clone, Debug, PartialEq)]
pub enum ColumnData {
    Bool(Vec<Option<bool>>),
    I64(Vec<Option<i64>>),
    F64(Vec<Option<f64>>),
    String(Vec<Option<String>>),
}

impl ColumnData {
    pub fn len(&self) -> usize {
        match self {
            ColumnData::Bool(v) => v.len(),
            ColumnData::I64(v) => v.len(),
            ColumnData::F64(v) => v.len(),
            ColumnData::String(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The SQL-ish type name used in schemas and messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            ColumnData::Bool(_) => "bool",
            ColumnData::I64(_) => "i64",
            ColumnData::F64(_) => "f64",
            ColumnData::String(_) => "string",
        }
    }

    /// The dtype of a column of this kind in a table's schema.
    pub fn dtype(&self) -> crate::DType {
        match self {
            ColumnData::Bool(_) => crate::DType::Bool,
            ColumnData::I64(_) => crate::DType::I64,
            ColumnData::F64(_) => crate::DType::F64,
            ColumnData::String(_) => crate::DType::String,
        }
    }

    /// Cell `i` as f64: numbers as they are, bools 0/1, missing values and strings NaN.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            ColumnData::Bool(v) => v[i].map_or(f64::NAN, |b| b as u8 as f64),
            ColumnData::I64(v) => v[i].map_or(f64::NAN, |x| x as f64),
            ColumnData::F64(v) => v[i].unwrap_or(f64::NAN),
            ColumnData::String(_) => f64::NAN,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    pub name: String,
    pub data: ColumnData,
}

/// A materialised table. `index` marks the first column as row labels (the statistic names
/// of `stats`, the index of a pivot): it prints without a header, like a pandas index.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub columns: Vec<Column>,
    pub index: bool,
}

/// Tables have no order (comparisons of table values are always false); generic kernels over
/// every element type need the trait.
impl PartialOrd for Table {
    fn partial_cmp(&self, _: &Table) -> Option<std::cmp::Ordering> {
        None
    }
}

/// Rows past which a table prints truncated in the middle, and how many rows of each end
/// are kept then (pandas: `display.max_rows`, `display.min_rows`).
const MAX_ROWS: usize = 20;
const EDGE_ROWS: usize = 5;
/// Columns past which a table prints truncated in the middle (pandas `display.max_columns`).
const MAX_COLUMNS: usize = 20;

impl Table {
    pub fn new(columns: Vec<Column>) -> Table {
        Table { columns, index: false }
    }

    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.data.len())
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Every column has as many cells as the first.
    pub fn is_rectangular(&self) -> bool {
        self.columns.iter().all(|c| c.data.len() == self.rows())
    }
}

/// Formats a float column as pandas does: six decimals, then trailing zeros trimmed alike
/// across the column (keeping at least one decimal), NaN for missing values; scientific
/// notation when magnitudes make fixed notation unreadable.
fn format_floats(values: &[Option<f64>]) -> Vec<String> {
    let finite: Vec<f64> = values.iter().flatten().copied().filter(|v| v.is_finite()).collect();
    let max = finite.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let min_nonzero =
        finite.iter().filter(|v| **v != 0.0).fold(f64::INFINITY, |m, v| m.min(v.abs()));
    let scientific = max >= 1e16 || (min_nonzero < 1e-4 && min_nonzero.is_finite() && max < 1e16);
    let fixed = |v: f64| {
        if v.is_nan() {
            "NaN".to_string()
        } else if v.is_infinite() {
            if v > 0.0 { "inf".into() } else { "-inf".into() }
        } else if scientific {
            format!("{v:.6e}")
        } else {
            format!("{v:.6}")
        }
    };
    let mut out: Vec<String> =
        values.iter().map(|v| v.map_or_else(|| "NaN".to_string(), fixed)).collect();
    if !scientific {
        // Trim one trailing zero at a time while every fixed-notation cell ends in one.
        let numeric = |s: &String| s.contains('.');
        while !out.is_empty()
            && out.iter().filter(|s| numeric(s)).count() > 0
            && out.iter().filter(|s| numeric(s)).all(|s| s.ends_with('0') && !s.ends_with(".0"))
        {
            for s in out.iter_mut().filter(|s| s.contains('.')) {
                s.pop();
            }
        }
    }
    out
}

fn format_column(data: &ColumnData) -> Vec<String> {
    match data {
        ColumnData::Bool(v) => v
            .iter()
            .map(|b| match b {
                Some(true) => "True".into(),
                Some(false) => "False".into(),
                None => "NaN".into(),
            })
            .collect(),
        ColumnData::I64(v) => {
            if v.iter().any(Option::is_none) {
                // pandas holds an integer column with missing values as float64.
                format_floats(&v.iter().map(|x| x.map(|x| x as f64)).collect::<Vec<_>>())
            } else {
                v.iter().map(|x| x.map_or_else(|| "NaN".into(), |x| x.to_string())).collect()
            }
        }
        ColumnData::F64(v) => format_floats(v),
        ColumnData::String(v) => {
            v.iter().map(|s| s.clone().unwrap_or_else(|| "NaN".into())).collect()
        }
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rows = self.rows();
        let (label_col, data_cols) = if self.index && !self.columns.is_empty() {
            (Some(&self.columns[0]), &self.columns[1..])
        } else {
            (None, &self.columns[..])
        };
        if data_cols.is_empty() && label_col.is_none() {
            return write!(f, "Empty table\nColumns: []\nIndex: []");
        }
        if rows == 0 {
            let names: Vec<&str> = self.columns.iter().map(|c| c.name.as_str()).collect();
            return write!(f, "Empty table\nColumns: [{}]\nIndex: []", names.join(", "));
        }
        // Which rows and columns are shown; `None` marks the `...` gap.
        let shown_rows: Vec<Option<usize>> = if rows > MAX_ROWS {
            (0..EDGE_ROWS)
                .map(Some)
                .chain([None])
                .chain((rows - EDGE_ROWS..rows).map(Some))
                .collect()
        } else {
            (0..rows).map(Some).collect()
        };
        let ncols = data_cols.len();
        let shown_cols: Vec<Option<usize>> = if ncols > MAX_COLUMNS {
            (0..MAX_COLUMNS / 2)
                .map(Some)
                .chain([None])
                .chain((ncols - MAX_COLUMNS / 2..ncols).map(Some))
                .collect()
        } else {
            (0..ncols).map(Some).collect()
        };
        let pick = |cells: Vec<String>| -> Vec<String> {
            shown_rows
                .iter()
                .map(|r| r.map_or_else(|| "...".to_string(), |r| cells[r].clone()))
                .collect()
        };
        let labels: Vec<String> = match label_col {
            Some(c) => pick(format_column(&c.data)),
            None => shown_rows
                .iter()
                .map(|r| r.map_or_else(|| "..".to_string(), |r| r.to_string()))
                .collect(),
        };
        // Format only the shown cells of wide tables: a million-row column formats 10.
        let columns: Vec<(String, Vec<String>)> = shown_cols
            .iter()
            .map(|c| match c {
                Some(c) => {
                    let col = &data_cols[*c];
                    (col.name.clone(), pick(format_column(&col.data)))
                }
                None => ("...".to_string(), vec!["...".to_string(); shown_rows.len()]),
            })
            .collect();
        let label_width = labels.iter().map(|s| s.chars().count()).max().unwrap_or(0);
        let widths: Vec<usize> = columns
            .iter()
            .map(|(h, cells)| {
                cells
                    .iter()
                    .map(|s| s.chars().count())
                    .chain([h.chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut header = " ".repeat(label_width);
        for ((h, _), w) in columns.iter().zip(&widths) {
            header.push_str(&format!("  {h:>w$}"));
        }
        writeln!(f, "{}", header.trim_end())?;
        for (i, label) in labels.iter().enumerate() {
            let mut line = format!("{label:<label_width$}");
            for ((_, cells), w) in columns.iter().zip(&widths) {
                line.push_str(&format!("  {:>w$}", cells[i]));
            }
            if i + 1 < labels.len() {
                writeln!(f, "{line}")?;
            } else {
                write!(f, "{line}")?;
            }
        }
        if rows > MAX_ROWS || ncols > MAX_COLUMNS {
            write!(f, "\n\n[{rows} rows x {} columns]", self.columns.len())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(cols: Vec<(&str, ColumnData)>) -> Table {
        Table::new(cols.into_iter().map(|(n, d)| Column { name: n.into(), data: d }).collect())
    }

    #[test]
    fn prints_like_pandas() {
        let t = table(vec![
            ("Name", ColumnData::String(vec![Some("Braund".into()), None])),
            ("Age", ColumnData::F64(vec![Some(22.0), Some(38.5)])),
            ("Fare", ColumnData::F64(vec![Some(71.2833), Some(7.25)])),
            ("n", ColumnData::I64(vec![Some(1), Some(20)])),
        ]);
        assert_eq!(
            t.to_string(),
            "     Name   Age     Fare   n\n0  Braund  22.0  71.2833   1\n1     NaN  38.5   7.2500  20"
        );
    }

    #[test]
    fn index_column_prints_as_row_labels() {
        let mut t = table(vec![
            ("", ColumnData::String(vec![Some("count".into()), Some("mean".into())])),
            ("Age", ColumnData::F64(vec![Some(714.0), Some(29.69911764705882)])),
        ]);
        t.index = true;
        assert_eq!(t.to_string(), "              Age\ncount  714.000000\nmean    29.699118");
    }

    #[test]
    fn long_tables_truncate_in_the_middle() {
        let t = table(vec![("x", ColumnData::I64((0..100).map(Some).collect()))]);
        let s = t.to_string();
        assert!(s.ends_with("\n\n[100 rows x 1 columns]"), "{s}");
        assert_eq!(s.lines().count(), 1 + 5 + 1 + 5 + 2);
        assert!(s.contains("\n..  ...\n"), "{s}");
        assert!(s.contains("\n99   99\n"), "{s}");
    }

    #[test]
    fn empty_tables_say_so() {
        let t = table(vec![("a", ColumnData::I64(vec![]))]);
        assert_eq!(t.to_string(), "Empty table\nColumns: [a]\nIndex: []");
    }
}
