//! The data side of an ask, shared by `xpuctl ask` and xpud: a data file as the model sees
//! it (its path, the table engine's schema — the same reader the program will run on — the
//! sheets of a workbook, and the first rows of a CSV file), and the sample a dry run reads
//! (CSV files cut to their header and first records byte for byte, other files copied).
//! Paths given here are relative to one data root and free of `..`; callers check that
//! (`DataRoots::resolve_read`) before. [`record`] makes the store's record of an ask.

pub mod record;

use std::path::Path;

use xpu_assistant::DataFile;
use xpu_engine_table::TableEngine;
use xpu_ir::{Attr, Attrs, Op};

/// The table reader for a file, by extension.
pub fn table_op(path: &Path) -> Option<Op> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "csv" => Some(Op::ReadCsv),
        "xlsx" => Some(Op::ReadXlsx),
        "parquet" => Some(Op::ReadParquet),
        _ => None,
    }
}

pub fn is_csv(path: &Path) -> bool {
    table_op(path) == Some(Op::ReadCsv)
}

/// `rel` (relative to `root`) as the model sees it: the table engine's schema, a
/// workbook's sheets, and the first `rows` rows of a CSV file (cells cut to 80
/// characters). A file that is not a table is named only.
pub fn describe(
    engine: &TableEngine,
    root: &Path,
    rel: &Path,
    rows: usize,
) -> Result<DataFile, String> {
    let path = rel.to_string_lossy().into_owned();
    let Some(op) = table_op(rel) else {
        let kind = "file".into();
        return Ok(DataFile { path, kind, columns: vec![], rows: vec![], sheets: vec![] });
    };
    let abs = root.join(rel).to_string_lossy().into_owned();
    let attrs = Attrs::new().with("path", Attr::Str(abs.clone()));
    let columns = engine
        .source_schema(op, &attrs)
        .map_err(|m| format!("{path}: {m}"))?
        .into_iter()
        .map(|(n, d)| (n, d.name().to_string()))
        .collect();
    let rows = if is_csv(rel) { first_rows(&root.join(rel), rows)? } else { vec![] };
    let sheets = match op {
        Op::ReadXlsx => engine.workbook_sheets(&abs).map_err(|m| format!("{path}: {m}"))?,
        _ => vec![],
    };
    Ok(DataFile { path, kind: "table".into(), columns, rows, sheets })
}

fn first_rows(path: &Path, n: usize) -> Result<Vec<Vec<String>>, String> {
    let reading = |e: csv::Error| format!("reading {}: {e}", path.display());
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_path(path).map_err(reading)?;
    let mut out = Vec::new();
    for record in reader.records().take(n) {
        let record = record.map_err(reading)?;
        out.push(record.iter().map(|c| c.chars().take(80).collect()).collect());
    }
    Ok(out)
}

/// The data files as one text, a line per file (`path: name type, …`): what a stored ask
/// records of its data, and what later questions are compared with.
pub fn schema_text(files: &[DataFile]) -> String {
    files
        .iter()
        .map(|f| {
            let cols: Vec<String> = f.columns.iter().map(|(n, t)| format!("{n} {t}")).collect();
            format!("{}: {}", f.path, cols.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Largest file (not CSV) a sample copies whole: a dry run of a larger Parquet or XLSX
/// file is refused rather than copied for every ask.
pub const MAX_SAMPLE_COPY_BYTES: u64 = 256 << 20;

/// Writes the sample of each file in `rels` (relative to `root`) to the same relative
/// path under `dir`: CSV files cut to their first `rows` records, other files copied (at
/// most [`MAX_SAMPLE_COPY_BYTES`]; never linked: a dry run that writes the same path must
/// not touch the original).
pub fn write_sample(root: &Path, rels: &[&Path], dir: &Path, rows: usize) -> Result<(), String> {
    for rel in rels {
        let to = dir.join(rel);
        // The caller made `rel` relative and free of `..`; never write elsewhere.
        if !to.starts_with(dir)
            || rel.is_absolute()
            || rel.components().any(|c| c.as_os_str() == "..")
        {
            return Err(format!("{}: not a relative path inside the data root", rel.display()));
        }
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let from = root.join(rel);
        if is_csv(rel) {
            first_records(&from, &to, rows)?;
        } else {
            let size =
                std::fs::metadata(&from).map_err(|e| format!("{}: {e}", rel.display()))?.len();
            if size > MAX_SAMPLE_COPY_BYTES {
                return Err(format!(
                    "{}: {} MiB is too large to copy for a dry run (at most {} MiB; a CSV file \
                     is cut to its first rows instead)",
                    rel.display(),
                    size >> 20,
                    MAX_SAMPLE_COPY_BYTES >> 20
                ));
            }
            std::fs::copy(&from, &to)
                .map_err(|e| format!("copying {} for the dry run: {e}", rel.display()))?;
        }
    }
    Ok(())
}

/// Copies the directory tree `from` into `to` (files and directories; a link is not
/// followed): one attempt's copy of a sample.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", from.display()))?;
        let kind = entry.file_type().map_err(|e| format!("{}: {e}", entry.path().display()))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            std::fs::create_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)
                .map_err(|e| format!("{}: {e}", target.display()))?;
        }
    }
    Ok(())
}

/// The header and the first `n` records of a CSV file, copied byte for byte: the records'
/// ends are found by the csv reader (so a quoted newline stays inside its record) and the
/// file's prefix up to there is copied, so the sample keeps the file's own separator and
/// quoting. Read as a stream: a large file is not read past the sample.
pub fn first_records(from: &Path, to: &Path, n: usize) -> Result<(), String> {
    let reading = |e: &dyn std::fmt::Display| format!("reading {}: {e}", from.display());
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(delimiter_of(from).map_err(|e| reading(&e))?)
        .from_path(from)
        .map_err(|e| reading(&e))?;
    let mut record = csv::ByteRecord::new();
    for _ in 0..=n {
        if !reader.read_byte_record(&mut record).map_err(|e| reading(&e))? {
            break;
        }
    }
    let end = reader.position().byte();
    let mut file = std::fs::File::open(from).map_err(|e| reading(&e))?;
    let writing = |e: std::io::Error| format!("writing {}: {e}", to.display());
    let mut sample = std::fs::File::create(to).map_err(writing)?;
    std::io::copy(&mut std::io::Read::take(&mut file, end), &mut sample).map_err(writing)?;
    Ok(())
}

/// The separator of a CSV file as DuckDB's sniffer would mostly find it: the most
/// frequent of `,` `;` tab `|` in its first line (a comma when none is there), so a
/// quoted newline is found inside its record whatever the separator.
fn delimiter_of(path: &Path) -> std::io::Result<u8> {
    use std::io::{BufRead, Read};
    let mut first = Vec::new();
    let file = std::fs::File::open(path)?;
    std::io::BufReader::new(file).take(1 << 20).read_until(b'\n', &mut first)?;
    let count = |d: u8| first.iter().filter(|&&b| b == d).count();
    Ok([b',', b';', b'\t', b'|'].into_iter().rev().max_by_key(|&d| count(d)).unwrap_or(b','))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_keep_quoting_and_stop_at_n_records() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let csv = "a;b\n1;\"x\ny\"\n2;z\n3;w\n";
        assert_eq!(
            delimiter_of(&{
                std::fs::write(dir.path().join("c.csv"), "a,b\n").unwrap();
                dir.path().join("c.csv")
            })
            .unwrap(),
            b','
        );
        std::fs::write(root.join("sub/t.csv"), csv).unwrap();
        std::fs::write(root.join("notes.txt"), "hello").unwrap();
        let out = dir.path().join("out");
        let rels = [Path::new("sub/t.csv"), Path::new("notes.txt")];
        write_sample(&root, &rels, &out, 2).unwrap();
        let copy = dir.path().join("copy");
        copy_tree(&out, &copy).unwrap();
        assert_eq!(
            std::fs::read(copy.join("sub/t.csv")).unwrap(),
            std::fs::read(out.join("sub/t.csv")).unwrap()
        );
        assert_eq!(
            std::fs::read_to_string(out.join("sub/t.csv")).unwrap(),
            "a;b\n1;\"x\ny\"\n2;z\n"
        );
        assert_eq!(std::fs::read_to_string(out.join("notes.txt")).unwrap(), "hello");
        for bad in ["../t.csv", "/etc/passwd"] {
            let err = write_sample(&root, &[Path::new(bad)], &out, 1).unwrap_err();
            assert!(err.contains("not a relative path"), "{err}");
        }
    }

    #[test]
    fn a_described_csv_has_the_engines_types_and_first_rows() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("p.csv"),
            "name,age,when\nAnn,31,2024-03-01\nBo,40,2024-03-02\n",
        )
        .unwrap();
        let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
        let f = describe(&engine, dir.path(), Path::new("p.csv"), 1).unwrap();
        let cols: Vec<(&str, &str)> =
            f.columns.iter().map(|(n, t)| (n.as_str(), t.as_str())).collect();
        assert_eq!(cols[0].0, "name");
        assert_eq!(cols[2], ("when", "string"), "dates stay text: {cols:?}");
        assert_eq!(f.rows, vec![vec!["Ann".to_string(), "31".into(), "2024-03-01".into()]]);
        assert_eq!(schema_text(&[f]).lines().next().unwrap().split(':').next(), Some("p.csv"));
        let err = describe(&engine, dir.path(), Path::new("missing.csv"), 1).unwrap_err();
        assert!(err.contains("missing.csv"), "{err}");
    }
}
