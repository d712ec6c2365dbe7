//! Excel workbooks through calamine (DuckDB has no built-in reader): the first row is the
//! header, column types follow pandas' `read_excel` — all-integral numbers i64, other
//! numbers f64, booleans bool, anything else text — and `sheet = "*"` stacks every sheet.

use std::collections::BTreeSet;
use std::path::PathBuf;

use calamine::{Data, Reader, open_workbook_auto};
use xpu_ir::{Attrs, Column, ColumnData, DType, Table};

pub fn read(attrs: &Attrs, roots: &[PathBuf]) -> Result<Table, String> {
    let path = crate::confined(attrs.str("path", ""), "workbook", roots)?;
    let mut book = open_workbook_auto(&path)
        .map_err(|e| format!("{}: not a readable workbook: {e}", path.display()))?;
    let names = book.sheet_names();
    let wanted = attrs.str("sheet", "");
    let sheets: Vec<String> = match wanted {
        "" => names.first().cloned().into_iter().collect(),
        "*" => names.clone(),
        s if names.iter().any(|n| n == s) => vec![s.to_string()],
        s => {
            return Err(format!(
                "{}: no sheet named {s:?} (sheets: {})",
                path.display(),
                names.join(", ")
            ));
        }
    };
    if sheets.is_empty() {
        return Err(format!("{}: the workbook has no sheets", path.display()));
    }
    let mut parts = Vec::new();
    for name in &sheets {
        let range = book
            .worksheet_range(name)
            .map_err(|e| format!("{}: sheet {name:?}: {e}", path.display()))?;
        parts.push(sheet_table(range.rows()));
    }
    Ok(stack(parts))
}

/// The sheets of a workbook, in order.
pub fn sheet_names(path: &str, roots: &[PathBuf]) -> Result<Vec<String>, String> {
    let path = crate::confined(path, "workbook", roots)?;
    let book = open_workbook_auto(&path)
        .map_err(|e| format!("{}: not a readable workbook: {e}", path.display()))?;
    Ok(book.sheet_names())
}

/// The column names and types [`read`] will produce.
pub fn schema(attrs: &Attrs, roots: &[PathBuf]) -> Result<Vec<(String, DType)>, String> {
    let t = read(attrs, roots)?;
    Ok(t.columns
        .iter()
        .map(|c| {
            let d = match c.data {
                ColumnData::Bool(_) => DType::Bool,
                ColumnData::I64(_) => DType::I64,
                ColumnData::F64(_) => DType::F64,
                ColumnData::String(_) => DType::String,
            };
            (c.name.clone(), d)
        })
        .collect())
}

fn cell_text(d: &Data) -> Option<String> {
    match d {
        Data::Empty | Data::Error(_) => None,
        Data::String(s) => Some(s.clone()),
        Data::Float(f) => Some(f.to_string()),
        Data::Int(i) => Some(i.to_string()),
        Data::Bool(b) => Some(if *b { "True" } else { "False" }.into()),
        Data::DateTime(d) => Some(d.to_string()),
        Data::DateTimeIso(s) | Data::DurationIso(s) => Some(s.clone()),
    }
}

fn sheet_table<'a>(mut rows: impl Iterator<Item = &'a [Data]>) -> Table {
    let Some(header) = rows.next() else { return Table::default() };
    let mut seen = BTreeSet::new();
    let names: Vec<String> = header
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let base = cell_text(h).unwrap_or_else(|| format!("Unnamed: {i}"));
            // pandas de-duplicates repeated headers as `a`, `a.1`, `a.2`.
            let mut name = base.clone();
            let mut k = 1;
            while !seen.insert(name.clone()) {
                name = format!("{base}.{k}");
                k += 1;
            }
            name
        })
        .collect();
    let body: Vec<&[Data]> = rows.collect();
    let columns = names
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let cells: Vec<&Data> = body.iter().map(|r| r.get(i).unwrap_or(&Data::Empty)).collect();
            Column { name, data: column(&cells) }
        })
        .collect();
    Table::new(columns)
}

fn column(cells: &[&Data]) -> ColumnData {
    let present: Vec<&&Data> = cells.iter().filter(|c| !matches!(c, Data::Empty)).collect();
    let number = |d: &Data| match d {
        Data::Float(f) => Some(*f),
        Data::Int(i) => Some(*i as f64),
        _ => None,
    };
    if !present.is_empty()
        && present.iter().all(|c| matches!(c, Data::Bool(_)))
        && present.len() == cells.len()
    {
        return ColumnData::Bool(
            cells.iter().map(|c| if let Data::Bool(b) = c { Some(*b) } else { None }).collect(),
        );
    }
    if !present.is_empty() && present.iter().all(|c| number(c).is_some()) {
        let integral =
            present.iter().all(|c| number(c).is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.0e15));
        if integral && present.len() == cells.len() {
            return ColumnData::I64(cells.iter().map(|c| number(c).map(|f| f as i64)).collect());
        }
        return ColumnData::F64(cells.iter().map(|c| number(c)).collect());
    }
    ColumnData::String(cells.iter().map(|c| cell_text(c)).collect())
}

/// Rows of every part in order, columns matched by name (first appearance order), missing
/// cells null; a column whose parts disagree on type becomes text.
fn stack(parts: Vec<Table>) -> Table {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let mut names: Vec<String> = Vec::new();
    for p in &parts {
        for c in &p.columns {
            if !names.contains(&c.name) {
                names.push(c.name.clone());
            }
        }
    }
    let columns = names
        .into_iter()
        .map(|name| {
            let pieces: Vec<(usize, Option<&ColumnData>)> =
                parts.iter().map(|p| (p.rows(), p.column(&name).map(|c| &c.data))).collect();
            let kinds: BTreeSet<&str> =
                pieces.iter().filter_map(|(_, d)| d.map(|d| d.type_name())).collect();
            let data = match kinds.iter().next().copied() {
                Some("i64") if kinds.len() == 1 => {
                    ColumnData::I64(gather(&pieces, |d, i| match d {
                        ColumnData::I64(v) => v[i],
                        _ => None,
                    }))
                }
                Some("bool") if kinds.len() == 1 => {
                    ColumnData::Bool(gather(&pieces, |d, i| match d {
                        ColumnData::Bool(v) => v[i],
                        _ => None,
                    }))
                }
                Some("f64" | "i64") if kinds.iter().all(|k| *k == "f64" || *k == "i64") => {
                    ColumnData::F64(gather(&pieces, |d, i| {
                        let f = d.get_f64(i);
                        (!f.is_nan()).then_some(f)
                    }))
                }
                _ => ColumnData::String(gather(&pieces, |d, i| match d {
                    ColumnData::String(v) => v[i].clone(),
                    ColumnData::I64(v) => v[i].map(|x| x.to_string()),
                    ColumnData::F64(v) => v[i].map(|x| x.to_string()),
                    ColumnData::Bool(v) => {
                        v[i].map(|b| if b { "True".into() } else { "False".into() })
                    }
                })),
            };
            Column { name, data }
        })
        .collect();
    Table::new(columns)
}

fn gather<T>(
    pieces: &[(usize, Option<&ColumnData>)],
    get: impl Fn(&ColumnData, usize) -> Option<T>,
) -> Vec<Option<T>> {
    let mut out = Vec::new();
    for (rows, data) in pieces {
        for i in 0..*rows {
            out.push(data.and_then(|d| get(d, i)));
        }
    }
    out
}
