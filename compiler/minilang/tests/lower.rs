//! Lowering: programs become SGR-ML graphs whose outputs (one per tensor `print`) the CPU
//! engine computes; compile-time values fold; errors name their span and code.

use xpu_engine::{Assignment, Engine};
use xpu_minilang::lower::{PrintItem, lower};

/// Lowers and runs `src`; returns what its prints show (tensors as flat f64 lists).
fn run(src: &str) -> Vec<String> {
    let (program, diags) = xpu_minilang::analyze(src);
    assert!(diags.is_empty(), "{}", xpu_minilang::render("t.ml", src, &diags));
    let lowered = lower(&program, "t", None)
        .unwrap_or_else(|d| panic!("{}", xpu_minilang::render("t.ml", src, &d)));
    xpu_ir::verify(&lowered.graph).expect("lowered graph verifies");
    let mut exe =
        xpu_engine_cpu::CpuEngine::new().prepare(&lowered.graph, &Assignment::new("cpu")).unwrap();
    let outputs = exe.run(&[]).unwrap().outputs;
    lowered
        .prints
        .iter()
        .map(|p| match p {
            PrintItem::Text(t) => t.clone(),
            PrintItem::Output(name) => {
                let i = lowered.graph.outputs.iter().position(|o| &o.name == name).unwrap();
                let t = &outputs[i];
                format!("{:?} {:?}", t.shape(), t.to_f64_vec())
            }
        })
        .collect()
}

fn error(src: &str) -> String {
    let (program, diags) = xpu_minilang::analyze(src);
    assert!(diags.is_empty(), "{}", xpu_minilang::render("t.ml", src, &diags));
    let d = lower(&program, "t", None).expect_err("lowering must fail");
    let (l, c) = d[0].line_col(src);
    format!("{l}:{c} {} {}", d[0].code, d[0].message)
}

#[test]
fn compile_time_values_fold() {
    assert_eq!(
        run(
            "print 1 + 2 * 3\nprint 7 / 2\nprint 2 ** 10\nprint \"a\" + \"b\"\nprint [1, 2] \nprint len(\"héllo\")"
        ),
        vec!["7", "3.5", "1024", "ab", "[1, 2]", "5"]
    );
    assert_eq!(run("let mut n = 0\nfor i in 0..5 { n = n + i }\nprint n"), vec!["10"]);
    assert_eq!(
        run(
            "fn f(a, b=10) { a * b }\nprint f(2)\nprint f(2, b=3)\nprint if f(1) > 5 { \"big\" } else { \"small\" }"
        ),
        vec!["20", "6", "big"]
    );
    assert_eq!(run("let xs = [3, 4]\nprint xs[1] + xs[-2]"), vec!["7"]);
}

#[test]
fn tensors_lower_to_graph_ops() {
    assert_eq!(
        run("let x = [[1.0, 2.0], [3.0, 4.0]]\nprint x @ x"),
        vec!["[2, 2] [7.0, 10.0, 15.0, 22.0]"]
    );
    assert_eq!(
        run("let x = [[1, 2], [3, 4]]\nprint x * 2 - 1"),
        vec!["[2, 2] [1.0, 3.0, 5.0, 7.0]"]
    );
    assert_eq!(run("print sum([[1.0, 2.0], [3.0, 4.0]], axis=0)"), vec!["[2] [4.0, 6.0]"]);
    assert_eq!(run("print mean([[1.0, 2.0], [3.0, 4.0]])"), vec!["[] [2.5]"]);
    assert_eq!(run("print relu([-1.0, 2.0]) + abs([-3.0, 1.0])"), vec!["[2] [3.0, 3.0]"]);
    assert_eq!(run("print reshape(arange(6), [2, 3])[1, 1:]"), vec!["[2] [4.0, 5.0]"]);
    assert_eq!(
        run("print transpose(reshape(arange(6), [2, 3]))[:, 0]"),
        vec!["[3] [0.0, 1.0, 2.0]"]
    );
    assert_eq!(
        run("print concat([ones([1, 2]), zeros([1, 2])], axis=0)"),
        vec!["[2, 2] [1.0, 1.0, 0.0, 0.0]"]
    );
    assert_eq!(
        run("let x = [1.0, -2.0, 3.0]\nprint where(x > 0, x, 0)"),
        vec!["[3] [1.0, 0.0, 3.0]"]
    );
    assert_eq!(run("print cast([1.7, 2.2], \"i64\")"), vec!["[2] [1.0, 2.0]"]);
    let soft = run("print softmax([1.0, 1.0])");
    assert_eq!(soft, vec!["[2] [0.5, 0.5]"]);
    assert_eq!(run("print full([2], 7) |> sum"), vec!["[] [14.0]"]);
}

#[test]
fn randn_is_seeded() {
    let a = run("print randn([4], seed=1)");
    assert_eq!(a, run("print randn([4], seed=1)"));
    assert_ne!(a, run("print randn([4], seed=2)"));
    let m = run("print mean(randn([20000], seed=7))");
    let v: f64 = m[0].split('[').nth(2).unwrap().trim_end_matches(']').parse().unwrap();
    assert!(v.abs() < 0.03, "mean of N(0,1) samples {v}");
}

#[test]
fn lowering_errors_are_located() {
    assert_eq!(
        error("let x = 1\nprint if [1.0] > 0 { 1 }"),
        "2:10 E0203 `if` needs a condition known at compile time, not a tensor"
    );
    assert_eq!(
        error("print [[1, 2], [3]] * 2"),
        "1:7 E0201 ragged list: a row has 1 items where 2 are expected"
    );
    assert_eq!(error("fn f(a) { a }\nprint f()"), "2:7 E0206 `f` needs argument `a`");
    assert_eq!(error("fn f(a) { a }\nprint f(b=1)"), "2:9 E0206 `f` has no parameter `b`");
    assert_eq!(
        error("print [1.0, 2.0] @ [[1.0, 2.0, 3.0]]"),
        "1:7 E0205 matmul: inner dims 2 and 1 differ"
    );
    // Without a table engine to read files, tables are refused at the call.
    assert!(error("let d = load_csv(\"x.csv\")").contains("E0301"), "no data roots: no files");
    assert_eq!(
        error("for i in 5 { print i }"),
        "1:10 E0202 `for` needs a list or a range known at compile time, not an integer"
    );
    assert_eq!(
        error("print 1 / 0 + 1"),
        "1:7 E0201 `/` on 1 and 0: overflow, division by zero or not defined for integers"
    );
}

#[test]
fn inputs_take_their_type_from_the_given_files_or_a_declaration() {
    use xpu_ir::{DType, TensorType};
    use xpu_minilang::lower::{Inputs, lower_with};
    let src = "let w = [[1.0], [2.0]]\nlet x = input(\"x\")\nprint x @ w\nprint sum(input(\"x\"))";
    let (program, _) = xpu_minilang::analyze(src);
    let mut inputs = Inputs::default();
    inputs.types.insert("x".into(), TensorType::of_shape(DType::F64, &[3, 2]));
    let l = lower_with(&program, "t", None, &inputs).unwrap();
    xpu_ir::verify(&l.graph).expect("inputs are numbered first even when declared late");
    assert_eq!(l.graph.inputs.len(), 1, "input(\"x\") twice is one input");
    let x = xpu_ir::Tensor::from_vec(vec![3, 2], vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let mut exe =
        xpu_engine_cpu::CpuEngine::new().prepare(&l.graph, &Assignment::new("cpu")).unwrap();
    let out = exe.run(&[x]).unwrap().outputs;
    assert_eq!(out[0].to_f64_vec(), vec![5.0, 11.0, 17.0]);
    assert_eq!(out[1].to_f64_vec(), vec![21.0]);
    // Not given and not declared: an error that says how to give it.
    let e = lower_with(&program, "t", None, &Inputs::default()).unwrap_err();
    assert_eq!((e[0].code, e[0].line_col(src)), ("E0302", (2, 15)));
    assert!(e[0].help.as_deref().unwrap().contains("--input x=FILE.npy"));
    // Declared: symbolic dims allowed; a file that contradicts the declaration is refused.
    let src = "let x = input(\"x\", dtype=\"f64\", shape=[\"N\", 2])\nprint x @ [[1.0], [2.0]]";
    let (program, _) = xpu_minilang::analyze(src);
    let l = lower_with(&program, "t", None, &Inputs::default()).unwrap();
    assert_eq!(l.graph.ty(l.graph.inputs[0]).to_string(), "f64[N,2]");
    let mut wrong = Inputs::default();
    wrong.types.insert("x".into(), TensorType::of_shape(DType::F64, &[3, 5]));
    assert_eq!(lower_with(&program, "t", None, &wrong).unwrap_err()[0].code, "E0302");
}

#[test]
fn models_are_inlined_as_subgraphs() {
    use std::sync::Arc;
    use xpu_minilang::lower::{Inputs, lower_with};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("net.sgr"),
        "graph \"net\" {\n  %0: f64[N,2] = input \"x\"\n  %1: f64[N,2] = relu(%0) @name(\"act\")\n  %2: f64[N,2] = add(%1, %1) @name(\"double\")\n  return \"y\" = %2\n}\n",
    )
    .unwrap();
    let roots = xpu_minilang::paths::DataRoots::new([dir.path().to_path_buf()]);
    let loader: xpu_minilang::lower::ModelLoader = Arc::new(|p: &std::path::Path| {
        xpu_ir::text::parse(&std::fs::read_to_string(p).unwrap()).map_err(|e| e.to_string())
    });
    let inputs = Inputs { models: Some(loader), ..Default::default() };
    let src = "let m = model(\"net.sgr\")\nprint m([[1.0, -2.0], [3.0, -4.0], [0.5, 0.5]])";
    let (program, _) = xpu_minilang::analyze(src);
    let l = lower_with(&program, "t", Some(&roots), &inputs).unwrap();
    let names: Vec<String> = l.graph.nodes.iter().filter_map(|n| n.name.clone()).collect();
    assert!(
        names.contains(&"net/act".to_string()) && names.contains(&"net/double".to_string()),
        "{names:?}"
    );
    let out = xpu_engine_cpu::CpuEngine::new()
        .prepare(&l.graph, &Assignment::new("cpu"))
        .unwrap()
        .run(&[])
        .unwrap()
        .outputs;
    assert_eq!(out[0].shape(), &[3, 2], "re-typed for the argument's shape");
    assert_eq!(out[0].to_f64_vec(), vec![2.0, 0.0, 6.0, 0.0, 1.0, 1.0]);
    // Wrong arity and wrong dtype are located errors; a missing file too.
    let bad = |src: &str| {
        let (program, _) = xpu_minilang::analyze(src);
        let e = lower_with(&program, "t", Some(&roots), &inputs).unwrap_err();
        format!("{} {}", e[0].code, e[0].message)
    };
    assert!(
        bad("let m = model(\"net.sgr\")\nprint m(1.0, 2.0)")
            .starts_with("E0206 model `net` takes 1 input(s) (x), got 2")
    );
    assert!(
        bad("let m = model(\"net.sgr\")\nprint m([[1, 2]])")
            .starts_with("E0205 model input `x` is f64, this is i64")
    );
    assert!(bad("let m = model(\"nope.sgr\")").starts_with("E0301"));
}

/// Lowers a table program against a fake reader: every file has the columns Name (string),
/// Sex (string), Age (f64) and Pclass (i64).
fn lower_tables(src: &str) -> Result<xpu_ir::Graph, String> {
    use xpu_ir::DType;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.csv"), "unused").unwrap();
    let roots = xpu_minilang::paths::DataRoots::new([dir.path().to_path_buf()]);
    let inputs = xpu_minilang::lower::Inputs {
        tables: Some(std::sync::Arc::new(|_, _| {
            Ok(vec![
                ("Name".into(), DType::String),
                ("Sex".into(), DType::String),
                ("Age".into(), DType::F64),
                ("Pclass".into(), DType::I64),
            ])
        })),
        ..Default::default()
    };
    let (program, diags) = xpu_minilang::analyze(src);
    assert!(diags.is_empty(), "{}", xpu_minilang::render("t.ml", src, &diags));
    xpu_minilang::lower::lower_with(&program, "t", Some(&roots), &inputs).map(|l| l.graph).map_err(
        |d| {
            d.iter()
                .map(|d| {
                    let (l, c) = d.line_col(src);
                    format!(
                        "{l}:{c} {} {} | {}",
                        d.code,
                        d.message,
                        d.help.clone().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join("\n")
        },
    )
}

#[test]
fn table_programs_lower_to_table_nodes() {
    let g = lower_tables(
        "let min = 18\nlet t = load_csv(\"t.csv\")\nprint t |> filter(Age >= min and Sex == \"female\" or t.Pclass == 1)\nprint t |> group_by(\"Sex\") |> agg(n = count(), a = mean(Age))",
    )
    .unwrap();
    let ops: Vec<&str> = g.nodes.iter().map(|n| n.op.name()).collect();
    assert_eq!(ops, ["read_csv", "filter_rows", "group_agg"]);
    let filter = &g.nodes[1];
    assert_eq!(
        filter.attrs.row("predicate").map(|e| e.to_string()).as_deref(),
        Some(r#"or(and(ge(col("Age"), 18), eq(col("Sex"), "female")), eq(col("Pclass"), 1))"#),
        "a typed row expression, not query text"
    );
    // A piped call spans the whole pipeline, so the node is named after its head (`t`).
    assert_eq!(filter.name.as_deref(), Some("t:3:7"), "named after the source position");
    assert_eq!(g.nodes[2].attrs.strs("funcs").unwrap(), ["count", "mean"]);
    xpu_ir::verify(&g).expect("verifies");
}

#[test]
fn lists_of_column_names_slice_and_join() {
    let g = lower_tables(
        "let t = load_csv(\"t.csv\")\nlet cols = columns(t)\nprint select(t, cols[1:3] + [cols[0]])\nprint select(t, cols[-1:])",
    )
    .unwrap();
    let selects: Vec<Vec<String>> = g
        .nodes
        .iter()
        .filter(|n| n.op.name() == "select_columns")
        .map(|n| n.attrs.strs("columns").unwrap().to_vec())
        .collect();
    assert_eq!(selects, [vec!["Sex", "Age", "Name"], vec!["Pclass"]]);
    // Numeric lists stay tensors: `+` adds them elementwise.
    let (program, _) = xpu_minilang::analyze("print [1, 2] + [3, 4]");
    let l = xpu_minilang::lower::lower_with(&program, "t", None, &Default::default()).unwrap();
    assert!(l.graph.nodes.iter().any(|n| n.op.name() == "add"));
}

#[test]
fn table_errors_are_located() {
    let e = lower_tables("let t = load_csv(\"t.csv\")\nprint filter(t, age > 3)").unwrap_err();
    assert_eq!(e, "2:17 E0208 unknown column `age` | did you mean `Age`?");
    let e = lower_tables("let t = load_csv(\"t.csv\")\nprint filter(t, Name > 3)").unwrap_err();
    assert!(e.starts_with("2:17 E0201 `>` compares values of different kinds"), "{e}");
    let e = lower_tables(
        "let t = load_csv(\"t.csv\")\nprint t |> group_by(\"Sex\") |> agg(m = mean(Name))",
    )
    .unwrap_err();
    assert!(e.contains("E0201 `mean` needs a numeric column; `Name` is string"), "{e}");
    let e = lower_tables("let t = load_csv(\"t.csv\")\nprint stats(t, [\"mean\", \"p99\"])")
        .unwrap_err();
    assert!(e.contains("E0201 unknown statistic `p99`"), "{e}");
    let e = lower_tables("print load_csv(\"../x.csv\")").unwrap_err();
    assert!(e.contains("E0301"), "{e}");
    let e = lower_tables("let t = load_csv(\"t.csv\")\nprint t + 1").unwrap_err();
    assert!(e.contains("E0201"), "{e}");
    let e = lower_tables("let t = load_csv(\"t.csv\")\nprint select(t, [\"Nme\"])").unwrap_err();
    assert!(e.contains("E0208 unknown column `Nme`") && e.contains("did you mean `Name`?"), "{e}");
}

#[test]
fn every_write_is_its_own_output_and_listed() {
    use std::collections::BTreeSet;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("t.csv"), "unused").unwrap();
    let roots = xpu_minilang::paths::DataRoots::new([dir.path().to_path_buf()]);
    let inputs = xpu_minilang::lower::Inputs {
        tables: Some(std::sync::Arc::new(|_, _| Ok(vec![("Age".into(), xpu_ir::DType::F64)]))),
        ..Default::default()
    };
    // A table write, a plot and tensor writes (one in a loop): the tensor write used to be
    // numbered apart from the others, so `write_csv` then `write_npy` were both `write_0`.
    let src = "let t = load_csv(\"t.csv\")\nwrite_csv(t, \"b.csv\")\nwrite_npy([1.0], \"a.npy\")\n\
               plot(t, x=\"Age\", out=\"p.png\")\nfor i in 0..2 {\n  write_npy([2.0], \"c.npy\")\n}\n\
               write_parquet(t, \"d.parquet\")";
    let (program, diags) = xpu_minilang::analyze(src);
    assert!(diags.is_empty(), "{}", xpu_minilang::render("t.ml", src, &diags));
    let lowered = xpu_minilang::lower::lower_with(&program, "t", Some(&roots), &inputs)
        .unwrap_or_else(|d| panic!("{}", xpu_minilang::render("t.ml", src, &d)));
    let names: Vec<String> = lowered.graph.outputs.iter().map(|o| o.name.clone()).collect();
    let unique: BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    let written: Vec<String> = lowered
        .written_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(written, ["a.npy", "b.csv", "c.npy", "d.parquet", "p.png"]);
}
