//! The prompt: a MiniLang reference rendered from the builtin table the checker uses (so a
//! new builtin reaches the model with no other edit), the data the question is about
//! (schemas from the engines' own readers and at most `send_rows` rows), and worked
//! examples. Its digest identifies the prompt an attempt was made with.

use sha2::{Digest, Sha256};
use xpu_minilang::builtins::{BUILTINS, Family};

/// A data file the question is about, as the model sees it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct DataFile {
    /// The path the program must name (relative to where it runs).
    pub path: String,
    /// `table` (CSV, XLSX, Parquet) or a tensor's type (`f32[3,224,224]`).
    pub kind: String,
    /// Columns and their types, for a table.
    pub columns: Vec<(String, String)>,
    /// The first rows as text (at most `send_rows`).
    pub rows: Vec<Vec<String>>,
    /// An Excel workbook's sheets, in order (the columns are the first sheet's).
    #[serde(default)]
    pub sheets: Vec<String>,
}

/// A question and its accepted program, shown to the model as an example.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Example {
    pub question: String,
    pub program: String,
}

const SYNTAX: &str = "\
MiniLang is a small data-flow language; every program is one job that runs once.
Statements, one per line:
  let name = expr            (bindings are immutable; `let mut` for ones you reassign)
  name = expr                (only to a `let mut` binding)
  print expr                 (shows a table, tensor or value)
  fn f(a, b = 1) { … }       (inlined at each call; no recursion)
  for i in 0..3 { … }        (a compile-time list or range)
Expressions: numbers, \"strings\", true/false/null, [lists], + - * / % ** @, == != < <= > >=,
and or not, `if c { a } else { b }` (c known at compile time), `x |> f(y)` meaning f(x, y),
t.column or t[\"column\"], t[0:5, 1] slices. Named arguments come after positional ones:
f(x, axis=1); parameters after `*` in a signature are taken by name only. Inside filter(…) / with_column(…) / agg(…) bare names are the table's columns:
  load_csv(\"people.csv\") |> filter(age >= 18 and city == \"Oslo\")
A comment starts with #. Keywords are followed by a space (`print x`, `not x`).";

/// The language reference the model gets, rendered from the builtin table.
pub fn language_reference() -> String {
    let mut out = String::from(SYNTAX);
    for family in
        [Family::Table, Family::ColumnScoped, Family::Aggregate, Family::Row, Family::Tensor]
    {
        out.push_str(&format!("\n\nFunctions — {}:", family.title()));
        for b in BUILTINS.iter().filter(|b| b.family == family) {
            out.push_str(&format!("\n- {}: {}", b.signature(), b.summary));
            out.push_str(&format!("\n  e.g. {}", b.example.replace('\n', "; ")));
        }
    }
    out
}

fn describe_data(files: &[DataFile]) -> String {
    if files.is_empty() {
        return "No data files are given: use literals, ranges, randn or input(…).".into();
    }
    let mut out = String::from("Data (name these files exactly as written):");
    for f in files {
        if f.columns.is_empty() {
            out.push_str(&format!("\n- {} ({})", quote(&f.path), f.kind));
            continue;
        }
        let cols: Vec<String> = f.columns.iter().map(|(n, t)| format!("{n}: {t}")).collect();
        let sheets = if f.sheets.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = f.sheets.iter().map(|s| quote(s)).collect();
            format!(
                "; sheets {}, load_xlsx reads the first unless sheet= names one",
                names.join(", ")
            )
        };
        out.push_str(&format!(
            "\n- {} ({}{sheets}) columns: {}",
            quote(&f.path),
            f.kind,
            cols.join(", ")
        ));
        if !f.rows.is_empty() {
            out.push_str("\n  first rows:");
            for row in &f.rows {
                out.push_str(&format!("\n  {}", row.join(" | ")));
            }
        }
    }
    out
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// The system message: the reference, the data and the examples.
pub fn system_prompt(files: &[DataFile], examples: &[Example]) -> String {
    let mut out = String::from(
        "You write MiniLang programs for xpu. Answer with the program only: no prose, no \
         markdown fences. Print what the question asks for.\n\n",
    );
    out.push_str(&language_reference());
    out.push_str("\n\n");
    out.push_str(&describe_data(files));
    for e in examples {
        out.push_str(&format!(
            "\n\nExample question: {}\nExample answer:\n{}",
            e.question, e.program
        ));
    }
    out
}

/// A short, stable digest of a prompt (hex, 16 characters).
pub fn digest(text: &str) -> String {
    let d = Sha256::digest(text.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}
