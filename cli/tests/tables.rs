//! Table parity: MiniLang table jobs run by `xpuctl run` (DuckDB underneath) against pandas
//! on the same generated CSVs. Every case writes its result with `write_csv`; pandas
//! (tests/tables/pandas_oracle.py, from the venv `make setup` builds) computes the same
//! thing; cells must match — numbers within 1e-9 relative, text exactly, missing as missing.

mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use common::repo;

/// A small deterministic generator (64-bit LCG), so the data is the same on every machine.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 53) as f64
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

fn write_data(dir: &Path) {
    let mut rng = Lcg(7);
    let cities = ["Oslo", "Lima", "Pune", "Kyiv", "Quito"];
    let mut people = String::from("id,name,city,grade,age,score,n,flag\n");
    for id in 0..2000 {
        let name = match id % 7 {
            0 => format!("\"Doe, J{id}\""),
            1 => format!("\"say \"\"hi\"\" {id}\""),
            _ => format!("p{id}"),
        };
        let city = if rng.unit() < 0.05 { "" } else { rng.pick(&cities) };
        let grade = rng.pick(&["A", "B", "C"]);
        let age =
            if rng.unit() < 0.1 { String::new() } else { format!("{}", 18 + rng.next() % 60) };
        let score = format!("{:.6}", rng.unit() * 100.0 - 20.0);
        let n = rng.next() % 50;
        let flag = if rng.unit() < 0.5 { "True" } else { "False" };
        writeln!(people, "{id},{name},{city},{grade},{age},{score},{n},{flag}").unwrap();
    }
    std::fs::write(dir.join("people.csv"), people).unwrap();
    let mut orders = String::from("id,amount,item\n");
    for _ in 0..3000 {
        let id = rng.next() % 2500; // some orders have no person, some people no order
        let amount = format!("{:.2}", rng.unit() * 500.0);
        let item = rng.pick(&["pen", "ink", "pad", "cap"]);
        writeln!(orders, "{id},{amount},{item}").unwrap();
    }
    std::fs::write(dir.join("orders.csv"), orders).unwrap();
    let mut extra = String::from("id,name,score,bonus\n");
    for id in 5000..5100 {
        writeln!(extra, "{id},x{id},{:.3},{}", rng.unit(), id % 3).unwrap();
    }
    std::fs::write(dir.join("extra.csv"), extra).unwrap();
    // The same people, read straight into `stats`: the native kernel scans the file itself
    // (quoted fields with commas and quotes: the one-thread path).
    std::fs::copy(dir.join("people.csv"), dir.join("people_copy.csv")).unwrap();
    // Over a megabyte without quotes, CRLF line ends, pandas' missing-value markers and an
    // integer column with a marker: the native scan cuts it into one chunk per thread.
    let mut measures = String::from("i,a,b,c,label\r\n");
    for i in 0..40_000 {
        let a = if rng.unit() < 0.05 { String::new() } else { format!("{:.5}", rng.unit() * 1e4) };
        let b = match rng.next() % 40 {
            0 => "NA".to_string(),
            1 => "nan".to_string(),
            2 => "NaN".to_string(),
            _ => format!("{:.8e}", (rng.unit() - 0.5) * 1e-3),
        };
        let c = if rng.unit() < 0.01 { "n/a".to_string() } else { (rng.next() % 1000).to_string() };
        let label = rng.pick(&["north", "south", "east"]);
        write!(measures, "{i},{a},{b},{c},{label}\r\n").unwrap();
    }
    std::fs::write(dir.join("measures.csv"), measures).unwrap();
    // Plainly numeric and over a megabyte: `group_by |> agg` on it runs on table.native
    // (missing keys, missing values in float and integer columns, a float key).
    let mut grid = String::from("k,j,f,x,n\n");
    for _ in 0..40_000 {
        let k = if rng.unit() < 0.02 { String::new() } else { (rng.next() % 40).to_string() };
        let j = rng.next() % 3;
        let f = rng.pick(&["-1.5", "0.25", "2.0", "1e-3"]);
        let x = match rng.next() % 30 {
            0 => String::new(),
            1 => "NA".to_string(),
            _ => format!("{:.6}", (rng.unit() - 0.3) * 1e3),
        };
        let n = if rng.unit() < 0.03 { String::new() } else { (rng.next() % 100_000).to_string() };
        writeln!(grid, "{k},{j},{f},{x},{n}").unwrap();
    }
    std::fs::write(dir.join("grid.csv"), grid).unwrap();
}

/// (case, MiniLang expression over `people`/`orders`/`extra`, pandas expression, rows in
/// a defined order?)
const CASES: &[(&str, &str, &str, bool)] = &[
    (
        "stats",
        "stats(people)",
        "people.describe().reset_index().rename(columns={'index': 'statistic'})",
        true,
    ),
    (
        "stats_some",
        "stats(people, [\"mean\", \"std\", \"50%\"])",
        "people.describe().loc[['mean', 'std', '50%']].reset_index().rename(columns={'index': 'statistic'})",
        true,
    ),
    (
        "stats_file",
        "stats(load_csv(\"people_copy.csv\"))",
        "people_copy.describe().reset_index().rename(columns={'index': 'statistic'})",
        true,
    ),
    (
        "stats_measures",
        "stats(load_csv(\"measures.csv\"))",
        "measures.describe().reset_index().rename(columns={'index': 'statistic'})",
        true,
    ),
    (
        "stats_percentiles",
        "stats(load_csv(\"measures.csv\"), [\"count\", \"10%\", \"99.9%\", \"max\"])",
        "measures.describe(percentiles=[.1, .999]).loc[['count', '10%', '99.9%', 'max']].reset_index().rename(columns={'index': 'statistic'})",
        true,
    ),
    (
        "group_agg",
        "people |> group_by(\"city\", \"grade\") |> agg(n = count(), age = mean(age), s = std(score), v = var(score), lo = min(score), hi = max(score), med = median(age), total = sum(n), first_age = first(age), names = nunique(name), ages = count(age))",
        "people.groupby(['city', 'grade']).agg(n=('id', 'size'), age=('age', 'mean'), s=('score', 'std'), v=('score', 'var'), lo=('score', 'min'), hi=('score', 'max'), med=('age', 'median'), total=('n', 'sum'), first_age=('age', 'first'), names=('name', 'nunique'), ages=('age', 'count')).reset_index()",
        true,
    ),
    (
        "group_native",
        "load_csv(\"grid.csv\") |> group_by(\"k\") |> agg(n = count(), c = count(x), s = sum(x), m = mean(x), sd = std(x), v = var(x), lo = min(n), hi = max(x), t = sum(n))",
        "grid.groupby('k').agg(n=('x', 'size'), c=('x', 'count'), s=('x', 'sum'), m=('x', 'mean'), sd=('x', 'std'), v=('x', 'var'), lo=('n', 'min'), hi=('x', 'max'), t=('n', 'sum')).reset_index()",
        true,
    ),
    (
        "group_native_keys",
        "load_csv(\"grid.csv\") |> group_by(\"j\", \"f\") |> agg(m = mean(x), hi = max(n), c = count(n))",
        "grid.groupby(['j', 'f']).agg(m=('x', 'mean'), hi=('n', 'max'), c=('n', 'count')).reset_index()",
        true,
    ),
    (
        "filter",
        "people |> filter(age >= 30 and city == \"Oslo\" or score < -19.5)",
        "people[((people.age >= 30) & (people.city == 'Oslo')) | (people.score < -19.5)]",
        true,
    ),
    (
        "filter_null",
        "filter(people, is_null(age) and not flag)",
        "people[people.age.isna() & ~people.flag]",
        true,
    ),
    (
        "with_column",
        "people |> with_column(x = score * 2 + n - age / 4, big = score > 50)",
        "people.assign(x=people.score * 2 + people.n - people.age / 4, big=people.score > 50)",
        true,
    ),
    (
        "pivot",
        "pivot(people, index=\"city\", columns=\"grade\", values=\"score\", agg=\"mean\")",
        "pd.pivot_table(people, index='city', columns='grade', values='score', aggfunc='mean').reset_index()",
        true,
    ),
    (
        "pivot_sum",
        "pivot(people, index=\"grade\", columns=\"city\", values=\"n\", agg=\"sum\")",
        "pd.pivot_table(people, index='grade', columns='city', values='n', aggfunc='sum').reset_index()",
        true,
    ),
    (
        "join_inner",
        "join(people, orders, on=\"id\")",
        "people.merge(orders, on='id', how='inner')",
        true,
    ),
    (
        "join_left",
        "join(people, orders, on=\"id\", how=\"left\")",
        "people.merge(orders, on='id', how='left')",
        true,
    ),
    (
        "join_outer",
        "join(people, orders, on=\"id\", how=\"outer\")",
        "people.merge(orders, on='id', how='outer')",
        true,
    ),
    (
        "join_suffix",
        "join(people, extra, on=\"id\", how=\"outer\")",
        "people.merge(extra, on='id', how='outer')",
        true,
    ),
    ("concat", "concat([people, extra])", "pd.concat([people, extra], ignore_index=True)", true),
    (
        "sort",
        "sort(people, [\"age\", \"score\"], desc=true)",
        "people.sort_values(['age', 'score'], ascending=False, kind='stable', na_position='last')",
        true,
    ),
    ("head", "head(people, 7)", "people.head(7)", true),
    (
        "distinct",
        "distinct(people[[\"city\", \"grade\"]])",
        "people[['city', 'grade']].drop_duplicates()",
        true,
    ),
    ("value_counts", "value_counts(orders, \"item\")", "orders['item'].value_counts()", false),
    ("select", "select(people, [\"score\", \"name\"])", "people[['score', 'name']]", true),
];

type Rows = Vec<Vec<String>>;

fn read_csv(path: &Path) -> (Vec<String>, Rows) {
    let mut r = csv::Reader::from_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let header = r.headers().unwrap().iter().map(str::to_string).collect();
    let rows = r.records().map(|rec| rec.unwrap().iter().map(str::to_string).collect()).collect();
    (header, rows)
}

/// Equal cells: numbers within 1e-9 relative, booleans in any case, text exactly.
fn same_cell(a: &str, b: &str) -> bool {
    if a == b
        || a.eq_ignore_ascii_case(b) && matches!(a.to_ascii_lowercase().as_str(), "true" | "false")
    {
        return true;
    }
    match (a.parse::<f64>(), b.parse::<f64>()) {
        (Ok(x), Ok(y)) => x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-300),
        _ => false,
    }
}

/// Runs every case as one job writing `{prefix}{case}.csv`, under `policy` if given.
fn run_cases(dir: &Path, prefix: &str, policy: Option<&str>) {
    let mut program = String::from(
        "let people = load_csv(\"people.csv\")\nlet orders = load_csv(\"orders.csv\")\nlet extra = load_csv(\"extra.csv\")\n",
    );
    for (name, ml, _, _) in CASES {
        writeln!(program, "write_csv({ml}, \"{prefix}{name}.csv\")").unwrap();
    }
    let job = format!("{prefix}job.ml");
    std::fs::write(dir.join(&job), &program).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xpuctl"));
    cmd.args(["run", &job, "--out", "out"]).current_dir(dir);
    if let Some(p) = policy {
        cmd.args(["--policy", p]);
    }
    let run = cmd.output().unwrap();
    assert!(
        run.status.success(),
        "xpuctl run ({prefix}) failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn tables_match_pandas() {
    let python = repo().join(".venv/bin/python");
    assert!(python.exists(), "the test venv is missing: run `make setup`");
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path());
    let mut cases = serde_json::Map::new();
    for (name, _, pandas, _) in CASES {
        cases.insert(name.to_string(), serde_json::Value::String(pandas.to_string()));
    }
    std::fs::write(dir.path().join("cases.json"), serde_json::to_string(&cases).unwrap()).unwrap();
    let out = Command::new(&python)
        .arg(repo().join("tests/tables/pandas_oracle.py"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "pandas oracle failed: {}", String::from_utf8_lossy(&out.stderr));
    // Every case twice: as planned by default (`describe` and `group_agg` on table.native)
    // and with both pinned to DuckDB's SQL, so both kernels answer to pandas.
    run_cases(dir.path(), "got_", None);
    std::fs::write(
        dir.path().join("sql.toml"),
        "[policy]\nname = \"sql-describe\"\n\n[kernels]\ndescribe = \"table.duckdb\"\ngroup_agg = \"table.duckdb\"\n",
    )
    .unwrap();
    run_cases(dir.path(), "sql_", Some("sql.toml"));
    let mut failures = Vec::new();
    let mut compared = 0usize;
    for prefix in ["got_", "sql_"] {
        for (name, _, _, ordered) in CASES {
            let (gh, mut got) = read_csv(&dir.path().join(format!("{prefix}{name}.csv")));
            let (eh, mut expected) = read_csv(&dir.path().join(format!("expected_{name}.csv")));
            if gh != eh {
                failures.push(format!("{prefix}{name}: columns {gh:?}, pandas has {eh:?}"));
                continue;
            }
            if got.len() != expected.len() {
                failures.push(format!(
                    "{prefix}{name}: {} rows, pandas has {}",
                    got.len(),
                    expected.len()
                ));
                continue;
            }
            if !ordered {
                got.sort();
                expected.sort();
            }
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                for (c, (a, b)) in g.iter().zip(e).enumerate() {
                    compared += 1;
                    if !same_cell(a, b) {
                        failures.push(format!(
                            "{prefix}{name}: row {i}, column {}: xpu {a:?}, pandas {b:?}",
                            gh[c]
                        ));
                        break;
                    }
                }
                if failures.len() > 20 {
                    break;
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatch(es):\n{}", failures.len(), failures.join("\n"));
    eprintln!("{} cases under 2 policies, {compared} cells match pandas", CASES.len());
}

/// Malformed table files: `xpuctl run` exits 1 with an error naming the file (and the line,
/// where the reader knows it) — never a panic, never a made-up table.
#[test]
fn malformed_table_files_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Lcg(11);
    let noise: Vec<u8> = (0..4000).map(|_| rng.next() as u8).collect();
    std::fs::write(dir.path().join("noise.csv"), &noise).unwrap();
    std::fs::write(dir.path().join("noise.xlsx"), &noise).unwrap();
    std::fs::write(dir.path().join("ragged.csv"), "a,b\n1,2\n3,4,5,6\n\"open,7\n").unwrap();
    std::fs::write(dir.path().join("latin1.csv"), b"a,b\n1,caf\xe9\n").unwrap();
    std::fs::write(dir.path().join("empty.csv"), "").unwrap();
    // A bad row far past what the reader samples to learn the columns: found while running.
    let mut late = String::from("a,b\n");
    for i in 0..60_000 {
        writeln!(late, "{i},{}", i * 2).unwrap();
    }
    late.push_str("oops,1,2,3\n");
    std::fs::write(dir.path().join("late.csv"), late).unwrap();
    let cases = [
        ("load_csv(\"noise.csv\")", "noise.csv", ""),
        ("load_xlsx(\"noise.xlsx\")", "noise.xlsx", "not a readable workbook"),
        ("load_csv(\"ragged.csv\")", "ragged.csv", ""),
        ("load_csv(\"latin1.csv\")", "latin1.csv", "utf-8"),
        ("load_csv(\"empty.csv\")", "empty.csv", "empty"),
        ("load_csv(\"missing.csv\")", "missing.csv", "does not exist"),
        ("load_csv(\"late.csv\")", "late.csv", "60002"),
    ];
    // `stats` of every file; a group-by of the files with an `a` column too (the late bad
    // row is met by table.native's scan: the file's sample was plainly numeric).
    let grouped =
        cases.iter().filter(|(_, file, _)| ["ragged.csv", "late.csv"].contains(file)).map(
            |&(call, file, detail)| (call, file, detail, "group_by(t, \"a\") |> agg(n = count())"),
        );
    let mut failures = Vec::new();
    for (call, file, detail, then) in
        cases.iter().map(|&(c, f, d)| (c, f, d, "stats(t)")).chain(grouped)
    {
        std::fs::write(dir.path().join("job.ml"), format!("let t = {call}\nprint {then}\n"))
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
            .args(["run", "job.ml", "--out", "out"])
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.code() != Some(1)
            || !stderr.contains(file)
            || !stderr.contains(detail)
            || stderr.contains("internal error")
        {
            failures.push(format!("{call} |> {then}: exit {:?}\n{stderr}", out.status.code()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `group_by |> agg` runs on table.native over a plainly numeric file, and where the native
/// kernel declines (text columns, an aggregate it lacks) DuckDB's statement runs and the
/// explanation says why; the timings name the kernel that ran.
#[test]
fn group_by_kernel_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path());
    let cases = [
        (
            "load_csv(\"grid.csv\") |> group_by(\"k\") |> agg(m = mean(x))",
            "table.native",
            "in 40 groups",
        ),
        (
            "load_csv(\"people.csv\") |> group_by(\"grade\") |> agg(m = mean(age))",
            "table.duckdb",
            "table.native declined (the file is not plainly numeric",
        ),
        (
            "load_csv(\"grid.csv\") |> group_by(\"k\") |> agg(m = median(x))",
            "table.duckdb",
            "table.native declined (aggregate `median` is DuckDB's only)",
        ),
    ];
    for (expr, kernel, fact) in cases {
        std::fs::write(dir.path().join("job.ml"), format!("print {expr}\n")).unwrap();
        let run = |format: &str| {
            let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
                .args(["run", "job.ml", "--out", "out", "--explain", "--format", format])
                .current_dir(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "{expr}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap()
        };
        let text = run("text");
        assert!(text.contains(fact), "{expr}: no {fact:?} in\n{text}");
        let json: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
        let ran: Vec<&str> = json["timings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["op"] == "group_agg")
            .map(|t| t["kernel"].as_str().unwrap())
            .collect();
        assert_eq!(ran, [kernel], "{expr}");
    }
}

/// Dates and times in a CSV file are strings, at compile time and when the SQL runs alike
/// (MiniLang has no date type; pandas' read_csv keeps them as text too): a string function
/// on a date column checks and runs.
#[test]
fn date_columns_are_strings_when_they_run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("orders.csv"),
        "id,date,at,amount\n1,2024-03-01,2024-03-01 10:00:00,10.5\n2,2024-03-15,2024-03-15 11:30:00,3.0\n3,2024-04-02,2024-04-02 09:15:00,7.25\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("job.ml"),
        "let t = load_csv(\"orders.csv\")\nprint t |> filter(starts_with(date, \"2024-03\") and contains(at, \"10:00\")) |> select([\"id\", \"date\"])\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xpuctl"))
        .args(["run", "job.ml", "--out", "out"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let printed = std::fs::read_to_string(dir.path().join("out/print_0.csv")).unwrap();
    assert_eq!(printed.lines().collect::<Vec<_>>(), ["id,date", "1,2024-03-01"], "{printed}");
}
