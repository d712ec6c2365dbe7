//! The table engine on its own: confinement to the data roots, reading workbooks, drawing
//! charts, and SQL that an attribute tries to smuggle in.

use std::path::Path;

use xpu_engine::{Assignment, Engine};
use xpu_engine_table::TableEngine;
use xpu_ir::{Attr, Attrs, DType, Graph, Literal, Op, RowExpr, RowFunc, Tensor};

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().parent().unwrap().to_path_buf()
}

/// A graph reading a CSV and keeping `then` applied to it as its output.
fn graph(read: Attrs, then: Option<(Op, Attrs)>) -> Graph {
    let mut g = Graph::new("t");
    let mut v = g.add_op(Op::ReadCsv, &[], read).unwrap();
    if let Some((op, attrs)) = then {
        v = g.add_op(op, &[v], attrs).unwrap();
    }
    g.add_output("out", v);
    g
}

fn run(engine: &TableEngine, g: &Graph) -> Result<Vec<Tensor>, String> {
    let mut exe = engine.prepare(g, &Assignment::new("table")).map_err(|e| e.to_string())?;
    exe.run(&[]).map(|e| e.outputs).map_err(|e| e.to_string())
}

fn csv_attrs(path: &Path) -> Attrs {
    Attrs::new().with("path", Attr::Str(path.display().to_string()))
}

#[test]
fn files_outside_the_roots_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("a.csv");
    std::fs::write(&inside, "x,y\n1,2\n3,4\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.csv");
    std::fs::write(&secret, "s\n42\n").unwrap();
    let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
    let out = run(&engine, &graph(csv_attrs(&inside), None)).unwrap();
    assert_eq!(out[0].data().as_table().unwrap().rows(), 2);
    let err = run(&engine, &graph(csv_attrs(&secret), None)).unwrap_err();
    assert!(
        err.contains("Permission") || err.contains("not allowed") || err.contains("disabled"),
        "{err}"
    );
    // The schema probe is confined the same way.
    assert!(engine.source_schema(Op::ReadCsv, &csv_attrs(&secret)).is_err());
    // A predicate is a typed row expression: hostile text in it is a quoted value, so it
    // neither runs a second statement nor loosens the configuration.
    let hostile = "true'); SET enable_external_access = true; SELECT ('1";
    let sneaky = Attrs::new().with(
        "predicate",
        Attr::Row(RowExpr::call(
            RowFunc::Eq,
            vec![
                RowExpr::cast(RowExpr::col("x"), DType::String),
                RowExpr::lit(Literal::Str(hostile.into())),
            ],
        )),
    );
    let out = run(&engine, &graph(csv_attrs(&inside), Some((Op::FilterRows, sneaky)))).unwrap();
    assert_eq!(out[0].data().as_table().unwrap().rows(), 0, "no row equals the text");
    assert!(engine.source_schema(Op::ReadCsv, &csv_attrs(&secret)).is_err(), "still confined");
    // SQL text where a row expression belongs never reaches the database.
    let text = Attrs::new().with(
        "predicate",
        Attr::Str(format!("x IN (SELECT s FROM read_csv('{}'))", secret.display())),
    );
    let mut g = Graph::new("t");
    let v = g.add_op(Op::ReadCsv, &[], csv_attrs(&inside)).unwrap();
    let err = g.add_op(Op::FilterRows, &[v], text).unwrap_err().to_string();
    assert!(err.contains("`predicate` must be a row expression"), "{err}");
}

#[test]
fn workbooks_stack_their_sheets() {
    let engine = TableEngine::new(vec![repo().join("examples")]);
    let path = repo().join("examples/sales.xlsx").display().to_string();
    let mut g = Graph::new("x");
    let attrs =
        Attrs::new().with("path", Attr::Str(path.clone())).with("sheet", Attr::Str("*".into()));
    let v = g.add_op(Op::ReadXlsx, &[], attrs.clone()).unwrap();
    g.add_output("out", v);
    let out = run(&engine, &g).unwrap();
    let t = out[0].data().as_table().unwrap();
    assert_eq!(t.rows(), 160, "four sheets of 40 rows");
    let names: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["store", "product", "units", "price"]);
    let schema = engine.source_schema(Op::ReadXlsx, &attrs).unwrap();
    let types: Vec<String> = schema.iter().map(|(_, d)| d.to_string()).collect();
    assert_eq!(types, ["string", "string", "i64", "f64"]);
    let missing = Attrs::new().with("path", Attr::Str(path)).with("sheet", Attr::Str("Q9".into()));
    let err = engine.source_schema(Op::ReadXlsx, &missing).unwrap_err();
    assert!(err.contains("no sheet named \"Q9\"") && err.contains("Q1"), "{err}");
    let garbage =
        tempfile::Builder::new().suffix(".xlsx").tempfile_in(repo().join("examples")).unwrap();
    std::fs::write(garbage.path(), b"PK\x03\x04 not really a zip").unwrap();
    let bad = Attrs::new().with("path", Attr::Str(garbage.path().display().to_string()));
    let err = engine.source_schema(Op::ReadXlsx, &bad).unwrap_err();
    assert!(err.contains("not a readable workbook"), "{err}");
}

#[test]
fn plots_are_drawn_and_not_blank() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("d.csv");
    std::fs::write(&csv, "x,y\n1,2.5\n2,3.5\n3,1.0\n4,7.25\n").unwrap();
    let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
    for (kind, file) in
        [("line", "a.png"), ("scatter", "b.png"), ("bar", "c.png"), ("hist", "d.svg")]
    {
        let out = dir.path().join(file);
        let attrs = Attrs::new()
            .with("kind", Attr::Str(kind.into()))
            .with("x", Attr::Str("x".into()))
            .with("y", Attr::Strs(vec!["y".into()]))
            .with("title", Attr::Str(format!("a {kind} chart")))
            .with("path", Attr::Str(out.display().to_string()));
        let drawn = run(&engine, &graph(csv_attrs(&csv), Some((Op::Plot, attrs)))).unwrap();
        assert_eq!(drawn[0].data().get_f64(0), 4.0, "rows drawn");
        if file.ends_with(".png") {
            let decoder =
                png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&out).unwrap()));
            let mut reader = decoder.read_info().unwrap();
            let mut buf = vec![0; reader.output_buffer_size()];
            let info = reader.next_frame(&mut buf).unwrap();
            assert_eq!((info.width, info.height), (800, 600));
            let px = info.line_size / info.width as usize;
            let first = &buf[..px];
            let differing = buf[..info.buffer_size()].chunks(px).filter(|p| p != &first).count();
            assert!(
                differing > 2_000,
                "{kind}: only {differing} pixels differ from the background"
            );
        } else {
            let svg = std::fs::read_to_string(&out).unwrap();
            assert!(svg.starts_with("<svg") && svg.matches("<rect").count() >= 10, "{svg}");
        }
    }
}

/// `describe` over a CSV file, on the kernel named (`None`: the engine's default).
fn describe_file(
    engine: &TableEngine,
    path: &Path,
    columns: Option<&[&str]>,
    kernel: Option<&str>,
) -> Result<xpu_ir::Table, String> {
    let mut attrs = Attrs::new();
    if let Some(c) = columns {
        attrs = attrs.with("columns", Attr::Strs(c.iter().map(|s| s.to_string()).collect()));
    }
    let g = graph(csv_attrs(path), Some((Op::Describe, attrs)));
    let mut assignment = Assignment::new("table");
    if let Some(k) = kernel {
        assignment.kernels.insert(xpu_ir::NodeId(1), k.to_string());
    }
    let mut exe = engine.prepare(&g, &assignment).map_err(|e| e.to_string())?;
    let out = exe.run(&[]).map_err(|e| e.to_string())?;
    Ok(out.outputs[0].data().as_table().unwrap().clone())
}

#[test]
fn native_describe_agrees_with_sql_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
    // Big enough (> 1 MiB) to be cut into chunks; a second copy with one quoted field is
    // read whole. Both must give what DuckDB's SQL gives.
    let mut plain = String::from("k,x,y,name\n");
    for i in 0..60_000u64 {
        let x = if i % 17 == 0 {
            String::new()
        } else {
            format!("{}", (i * 7919 % 10_007) as f64 / 7.0)
        };
        let y = if i % 101 == 0 { "NA".to_string() } else { format!("{}", (i as f64).sqrt()) };
        plain.push_str(&format!("{i},{x},{y},n{}\n", i % 13));
    }
    let quoted = plain.replacen("n0\n", "\"n,0\"\n", 1);
    for (name, text) in [("plain.csv", &plain), ("quoted.csv", &quoted)] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let native = describe_file(&engine, &path, None, None).unwrap();
        let sql = describe_file(&engine, &path, None, Some("table.duckdb")).unwrap();
        let names =
            |t: &xpu_ir::Table| t.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&native), ["statistic", "k", "x", "y"], "{name}");
        assert_eq!(names(&native), names(&sql), "{name}");
        for (a, b) in native.columns.iter().zip(&sql.columns).skip(1) {
            for r in 0..native.rows() {
                let (x, y) = (a.data.get_f64(r), b.data.get_f64(r));
                assert!(
                    (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
                    "{name} {} row {r}: native {x}, sql {y}",
                    a.name
                );
            }
        }
    }
}

#[test]
fn native_describe_reports_bad_rows_with_their_line() {
    let dir = tempfile::tempdir().unwrap();
    let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    // A column the program was checked against as numbers holds a word on line 4.
    let word = write("word.csv", "a,b\n1,2\n3,4\n5,oops\n");
    let err = describe_file(&engine, &word, Some(&["a", "b"]), None).unwrap_err();
    assert!(err.contains("word.csv") && err.contains("line 4") && err.contains("oops"), "{err}");
    // Without the compile-time columns a word makes the column non-numeric, as in pandas.
    let t = describe_file(&engine, &word, None, None).unwrap();
    assert_eq!(t.columns.len(), 2, "only `a` is numeric");
    let ragged = write("ragged.csv", "a,b\n1,2\n\n3,4,5\n");
    let err = describe_file(&engine, &ragged, None, None).unwrap_err();
    assert!(err.contains("ragged.csv") && err.contains("line 4") && err.contains("3"), "{err}");
    let latin1 = write("latin1.csv", "a,b\n1,2\n3,caf\u{e9}\n");
    let mut bytes = std::fs::read(&latin1).unwrap();
    bytes.retain(|&b| b != 0xc3);
    bytes.iter_mut().filter(|b| **b == 0xa9).for_each(|b| *b = 0xe9);
    std::fs::write(&latin1, bytes).unwrap();
    let err = describe_file(&engine, &latin1, None, None).unwrap_err();
    assert!(err.contains("latin1.csv") && err.contains("line 3") && err.contains("UTF-8"), "{err}");
    let err = describe_file(&engine, &word, Some(&["nope"]), None).unwrap_err();
    assert!(err.contains("no column named \"nope\""), "{err}");
    // The native scan is confined to the data roots like DuckDB is.
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.csv");
    std::fs::write(&secret, "s\n42\n").unwrap();
    let err = describe_file(&engine, &secret, None, None).unwrap_err();
    assert!(err.contains("outside the data roots") && !err.contains("42.0"), "{err}");
}

/// The compile-time schema of a plainly numeric CSV is read without DuckDB; wherever that
/// reader answers, it must answer what DuckDB's sniffer does, and it must leave every other
/// file to DuckDB.
#[test]
fn numeric_schemas_match_duckdbs_sniffer() {
    let dir = tempfile::tempdir().unwrap();
    let roots = [dir.path().canonicalize().unwrap()];
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let sniffed = |path: &Path| -> Vec<(String, String)> {
        let q = format!(
            "DESCRIBE SELECT * FROM {}",
            xpu_engine_table::sql::read_csv(&path.display().to_string(), ",", true, &[])
        );
        let mut stmt = conn.prepare(&q).unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
    };
    let body = |f: &dyn Fn(usize) -> String| (0..30_000).map(f).collect::<String>();
    let cases: Vec<(&str, String, bool)> = vec![
        ("ints", format!("a,b\n{}", body(&|i| format!("{i},-{}\n", i * 7))), true),
        ("floats", format!("x,y\n{}", body(&|i| format!("{}.25,{}\n", i, i as f64 / 3.0))), true),
        (
            "holes",
            format!(
                "a,b\n{}",
                body(&|i| if i % 9 == 0 { ",NA\n".into() } else { format!("{i},{i}.5\n") })
            ),
            true,
        ),
        ("crlf", format!("a,b\r\n{}", body(&|i| format!("{i},{}.5\r\n", i % 10))), true),
        ("words", format!("a,b\n{}", body(&|i| format!("{i},w{i}\n"))), false),
        ("zeros", format!("a,b\n{}", body(&|i| format!("00{i},{i}\n"))), false),
        ("exponents", format!("a,b\n{}", body(&|i| format!("{i}e3,{i}\n"))), true),
        // As pandas' `round(6).to_csv` writes them: mostly plain, a few tiny values.
        (
            "pandas_floats",
            format!(
                "a,b,c\n{}",
                body(&|i| match i % 1000 {
                    7 => format!("{i},1e-06,-2.5E+10\n"),
                    _ => format!("{i},0.{:06},{}.5\n", i % 999_983, i),
                })
            ),
            true,
        ),
        ("quoted", format!("a,b\n{}", body(&|i| format!("\"{i}\",{i}\n"))), false),
        ("empty_column", format!("a,b\n{}", body(&|i| format!("{i},\n"))), false),
    ];
    for (name, text, native) in cases {
        let path = dir.path().join(format!("{name}.csv"));
        std::fs::write(&path, text).unwrap();
        let ours = xpu_engine_table::native::numeric_schema(
            &path.display().to_string(),
            b',',
            &[],
            &roots,
        );
        assert_eq!(ours.is_some(), native, "{name}: {ours:?}");
        if let Some(ours) = ours {
            let theirs: Vec<(String, xpu_ir::DType)> = sniffed(&path)
                .into_iter()
                .map(|(n, t)| (n, xpu_engine_table::sql::dtype_of_sql(&t)))
                .collect();
            assert_eq!(ours, theirs, "{name}");
        }
    }
}

/// A CSV of `rows` rows under `dir`, all with key 1, and a graph joining it with itself on
/// the key: `rows²` rows, the size of the work chosen by the caller.
fn self_join(dir: &Path, rows: usize) -> (Graph, xpu_ir::ValueId) {
    let body: String = (0..rows).map(|i| format!("1,{i}\n")).collect();
    std::fs::write(dir.join("k.csv"), format!("k,v\n{body}")).unwrap();
    let mut g = Graph::new("t");
    let a = g.add_op(Op::ReadCsv, &[], csv_attrs(&dir.join("k.csv"))).unwrap();
    let b = g.add_op(Op::ReadCsv, &[], csv_attrs(&dir.join("k.csv"))).unwrap();
    let on = Attrs::new()
        .with("on", Attr::Strs(vec!["k".into()]))
        .with("how", Attr::Str("inner".into()));
    let joined = g.add_op(Op::Join, &[a, b], on).unwrap();
    (g, joined)
}

/// A cancel reaches a query DuckDB is in the middle of: the join below makes 144 million
/// rows in pandas' order (several seconds), and the run ends within moments of the cancel.
#[test]
fn a_cancel_interrupts_a_running_query() {
    let dir = tempfile::tempdir().unwrap();
    let (mut g, joined) = self_join(dir.path(), 12_000);
    let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
    let strs = |s: &str| Attr::Strs(vec![s.into()]);
    let count = Attrs::new()
        .with("keys", strs("k"))
        .with("columns", strs("v_x"))
        .with("funcs", strs("count"))
        .with("names", strs("n"));
    let counts = g.add_op(Op::GroupAgg, &[joined], count).unwrap();
    g.add_output("out", counts);
    let mut exe = engine.prepare(&g, &Assignment::new("table")).unwrap();
    let stop = xpu_engine::StopToken::new();
    let canceller = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            stop.cancel();
        })
    };
    let start = std::time::Instant::now();
    let err = exe.run_until(&[], &stop).map(|_| ()).unwrap_err();
    let took = start.elapsed();
    canceller.join().unwrap();
    assert!(
        matches!(
            &err,
            xpu_engine::EngineError::Stopped { reason: xpu_engine::StopReason::Cancelled, .. }
        ),
        "{err}"
    );
    assert!(
        took < std::time::Duration::from_secs(5),
        "the query ran on for {took:?} after the cancel"
    );
}

/// The policy's memory.limit bounds the job's DuckDB: a query needing more fails with an
/// error that says so; the same query runs without it.
#[test]
fn memory_limit_bounds_duckdb() {
    let dir = tempfile::tempdir().unwrap();
    let (mut g, joined) = self_join(dir.path(), 1_500);
    let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
    g.add_output("out", joined);
    let unbounded = run(&TableEngine::new(vec![dir.path().to_path_buf()]), &g).unwrap();
    assert_eq!(unbounded[0].data().as_table().unwrap().rows(), 1_500 * 1_500);
    let mut assignment = Assignment::new("table");
    assignment.options.memory_limit = Some(4 << 20);
    let mut exe = engine.prepare(&g, &assignment).unwrap();
    let err = exe.run(&[]).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("Out of Memory") && err.contains("memory.limit"), "{err}");
}

/// DuckDB is DuckDB's own prebuilt library, the release the `duckdb` crate's bindings were
/// generated for (tools/fetch_duckdb.py), with the extensions table jobs need built in —
/// nothing may be downloaded or loaded at run time.
#[test]
fn duckdb_is_the_pinned_library_with_its_extensions_built_in() {
    let engine = TableEngine::new(vec![]);
    assert_eq!(engine.version(), "duckdb v1.5.6", "the library matches the crate's bindings");
    let conn = duckdb::Connection::open_in_memory().unwrap();
    let mut stmt = conn
        .prepare("SELECT extension_name FROM duckdb_extensions() WHERE loaded AND install_mode = 'STATICALLY_LINKED' ORDER BY 1")
        .unwrap();
    let built_in: Vec<String> =
        stmt.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    for ext in ["icu", "json", "parquet"] {
        assert!(built_in.iter().any(|e| e == ext), "{ext} is not built in: {built_in:?}");
    }
}

/// `execution.timeout` bounds a single long table query: the deadline interrupts DuckDB
/// mid-query instead of waiting for the node to end.
#[test]
fn a_deadline_interrupts_a_running_query() {
    let dir = tempfile::tempdir().unwrap();
    // 6,000 rows with one key: the self-join makes 36 million rows to sort.
    let mut csv = String::from("k,v\n");
    for i in 0..6000 {
        csv.push_str(&format!("1,{i}\n"));
    }
    let path = dir.path().join("one_key.csv");
    std::fs::write(&path, csv).unwrap();
    let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
    let mut g = Graph::new("t");
    let a = g.add_op(Op::ReadCsv, &[], csv_attrs(&path)).unwrap();
    let join = Attrs::new()
        .with("on", Attr::Strs(vec!["k".into()]))
        .with("how", Attr::Str("inner".into()));
    let j = g.add_op(Op::Join, &[a, a], join).unwrap();
    g.add_output("out", j);
    let mut exe = engine.prepare(&g, &Assignment::new("table")).unwrap();
    let stop = xpu_engine::StopToken::new();
    stop.set_deadline(std::time::Duration::from_millis(200));
    let started = std::time::Instant::now();
    let err = exe.run_until(&[], &stop).unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(
            err,
            xpu_engine::EngineError::Stopped { reason: xpu_engine::StopReason::DeadlinePassed, .. }
        ),
        "{err}"
    );
    // Generous: the point is that it does not run the whole join (tens of seconds here).
    assert!(took < std::time::Duration::from_secs(10), "stopped after {took:?}");
}

/// A CSV is sniffed once per read and its view pinned to what the sniffer found: every
/// file reads with the names, types and rows an auto-detecting read gives (the schema the
/// program was compiled against), odd ones included — one line without a line ending,
/// quoted separators, day-first dates, CRLF, a semicolon separator, holes, and a path with
/// a quote and a comma in its name.
#[test]
fn a_pinned_csv_reads_as_an_auto_detecting_read_does() {
    let dir = tempfile::tempdir().unwrap();
    let engine = TableEngine::new(vec![dir.path().to_path_buf()]);
    let cases: Vec<(&str, &str, &str, usize)> = vec![
        ("header_only", "a,b,c", ",", 0),
        ("one_row_no_newline", "a,b\n1,2.5", ",", 1),
        ("quoted", "name,n\n\"x, y\",1\n\"say \"\"hi\"\"\",2\n", ",", 2),
        ("dates", "when,v\n03/04/2021,1\n25/12/2022,2\n", ",", 2),
        ("crlf", "a,b\r\n1,x\r\n2,y\r\n", ",", 2),
        ("semicolons", "a;b\n1;2\n3;4\n", ";", 2),
        ("holes", "a,b\n1,\nNA,2\n3,4\n", ",", 3),
        ("it's, odd", "k,v\n1,2\n", ",", 1),
        // Plainly numeric files take the native sampler's schema instead of DuckDB's sniff.
        ("numeric_crlf", "a,b\r\n1,2.5\r\n3,4\r\n", ",", 2),
        ("numeric_exponents", "x,y\n1,1e-06\n2,2.5\n", ",", 2),
        ("numeric_no_newline", "x,y\n1,2", ",", 1),
    ];
    for (name, text, sep, rows) in cases {
        let path = dir.path().join(format!("{name}.csv"));
        std::fs::write(&path, text).unwrap();
        let attrs = csv_attrs(&path).with("sep", Attr::Str(sep.into()));
        let schema =
            engine.source_schema(Op::ReadCsv, &attrs).unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = run(&engine, &graph(attrs, None)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let t = out[0].data().as_table().unwrap();
        let got: Vec<(String, DType)> =
            t.columns.iter().map(|c| (c.name.clone(), c.data.dtype())).collect();
        assert_eq!(got, schema, "{name}");
        assert_eq!(t.rows(), rows, "{name}");
    }
}
