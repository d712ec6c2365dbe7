//! Every parser a user's bytes reach is linear in its input with bounded nesting: fed
//! 100,000-deep nesting and multi-megabyte input, each answers promptly with an error (or a
//! result), never a hang, a stack overflow or a panic. Each case runs on a thread with a
//! 2 MiB stack (what tokio's threads in xpud get) under a generous hang detector.

use std::sync::mpsc;
use std::time::Duration;

use prost::Message;

const DEEP: usize = 100_000;
const LONG: usize = 4 << 20;

/// Runs `parse` on a 2 MiB stack; fails if it panics, overflows or takes over 60 s, and
/// returns its verdict (`Err` text, or `Ok` text for inputs that are valid).
fn check(
    name: &str,
    parse: impl FnOnce() -> Result<String, String> + Send + 'static,
) -> Result<String, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let _ = tx.send(parse());
        })
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{name}: no answer within 60 s"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{name}: the parser panicked"),
    }
}

fn expect_err(
    name: &str,
    want: &str,
    parse: impl FnOnce() -> Result<String, String> + Send + 'static,
) {
    match check(name, parse) {
        Err(e) => assert!(
            e.contains(want),
            "{name}: the error lacks {want:?}: {}",
            &e[..e.len().min(400)]
        ),
        Ok(v) => panic!("{name}: accepted: {}", &v[..v.len().min(200)]),
    }
}

#[test]
fn sgr_text() {
    let nested = format!(
        "graph \"g\" {{\n  %0: table[] = read_csv {{path = \"a.csv\"}}\n  %1: table[] = filter_rows(%0) {{predicate = row({}col(\"a\"){})}}\n  return \"o\" = %1\n}}\n",
        "not(".repeat(DEEP),
        ")".repeat(DEEP)
    );
    expect_err("sgr nested row expression", "at most 64 levels", move || {
        xpu_ir::text::parse(&nested).map(|g| g.name).map_err(|e| e.to_string())
    });
    let brackets =
        format!("graph \"g\" {{\n  %0: f32[2] = constant {{value = {}}}\n}}", "[".repeat(DEEP));
    expect_err("sgr nested lists", "", move || {
        xpu_ir::text::parse(&brackets).map(|g| g.name).map_err(|e| e.to_string())
    });
    // A long but valid graph: 40,000 nodes parse, linearly.
    let mut long = String::from("graph \"g\" {\n  %0: f32[4] = input \"x\"\n");
    for i in 1..40_000 {
        long.push_str(&format!("  %{i}: f32[4] = relu(%{})\n", i - 1));
    }
    long.push_str("  return \"y\" = %39999\n}\n");
    let ok = check("sgr long graph", move || {
        xpu_ir::text::parse(&long).map(|g| g.nodes.len().to_string()).map_err(|e| e.to_string())
    });
    assert_eq!(ok, Ok("39999".to_string()));
    let garbage: String = (0..LONG).map(|i| ["%", "{", "\"", "graph", "(", "="][i % 6]).collect();
    expect_err("sgr garbage", "", move || {
        xpu_ir::text::parse(&garbage).map(|g| g.name).map_err(|e| e.to_string())
    });
}

#[test]
fn sgr_json() {
    // A graph is an object: deep arrays are refused at the first character.
    let nested = format!("{}{}", "[".repeat(DEEP), "]".repeat(DEEP));
    expect_err("json nested arrays", "", move || {
        xpu_ir::from_json(&nested).map(|g| g.name).map_err(|e| e.to_string())
    });
    let deep_expr = format!(
        "{{\"name\": \"g\", \"values\": [], \"nodes\": [{{\"op\": \"filter_rows\", \"inputs\": [], \"outputs\": [], \"attrs\": {{\"predicate\": {{\"kind\": \"row\", \"value\": {}\"col\"{}}}}}}}], \"inputs\": [], \"outputs\": []}}",
        "{\"kind\": \"call\", \"func\": \"not\", \"args\": [".repeat(DEEP / 10),
        "]}".repeat(DEEP / 10)
    );
    expect_err("json nested row expression", "recursion limit", move || {
        xpu_ir::from_json(&deep_expr).map(|g| g.name).map_err(|e| e.to_string())
    });
    let long = format!("{{\"name\": \"{}\"", "x".repeat(LONG));
    expect_err("json long", "EOF", move || {
        xpu_ir::from_json(&long).map(|g| g.name).map_err(|e| e.to_string())
    });
}

#[test]
fn minilang() {
    for (name, src) in [
        ("parens", format!("let x = {}1{}", "(".repeat(DEEP), ")".repeat(DEEP))),
        ("lists", format!("let x = {}1{}", "[".repeat(DEEP), "]".repeat(DEEP))),
        ("blocks", format!("fn f() {{{}}}", "if true {".repeat(DEEP))),
        ("unary", format!("let x = {}1", "-".repeat(DEEP))),
        ("long line", format!("let x = {}1", "1 + ".repeat(LONG / 4))),
        // The worst the two bounds allow together: 98 levels of parentheses, each holding a
        // chain of 10 operators (990 in the statement).
        (
            "nested chains",
            format!(
                "let x = {}1{}",
                "(1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + 1 + ".repeat(98),
                ")".repeat(98)
            ),
        ),
    ] {
        let verdict = check(name, move || {
            let (_, diags) = xpu_minilang::analyze(&src);
            let errors: Vec<String> =
                diags.iter().filter(|d| d.is_error()).map(|d| d.message.clone()).collect();
            if errors.is_empty() { Ok(String::new()) } else { Err(errors.join("; ")) }
        });
        match name {
            // Within both bounds: it checks, on a 2 MiB stack.
            "nested chains" => assert_eq!(verdict, Ok(String::new()), "{name}"),
            "long line" => {
                let e = verdict.expect_err(name);
                assert!(
                    e.contains("operators in one statement"),
                    "{name}: {}",
                    &e[..e.len().min(300)]
                );
            }
            _ => {
                let e = verdict.expect_err(name);
                assert!(e.contains("nest"), "{name}: {}", &e[..e.len().min(300)]);
            }
        }
    }
}

#[test]
fn onnx_models_and_tensor_protos() {
    use xpu_onnx::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto};
    // A model whose If nodes nest subgraphs 10,000 deep.
    let mut g = GraphProto { name: Some("leaf".into()), ..Default::default() };
    for _ in 0..10_000 {
        let node = NodeProto {
            op_type: Some("If".into()),
            attribute: vec![AttributeProto {
                name: Some("then_branch".into()),
                g: Some(g),
                ..Default::default()
            }],
            ..Default::default()
        };
        g = GraphProto { node: vec![node], ..Default::default() };
    }
    let model = ModelProto { graph: Some(g), ..Default::default() };
    let mut bytes = Vec::new();
    // Encoding recurses too: do it on a big stack, as a producer of such a file would.
    std::thread::Builder::new()
        .stack_size(512 << 20)
        .spawn(move || {
            model.encode(&mut bytes).unwrap();
            // Dropping the nested structure recurses as well.
            std::mem::forget(model);
            bytes
        })
        .unwrap()
        .join()
        .map(|b| {
            expect_err("onnx nested subgraphs", "", move || {
                xpu_onnx::import_model(&b).map(|g| g.name).map_err(|e| e.to_string())
            })
        })
        .unwrap();
    let garbage: Vec<u8> = (0..LONG).map(|i| (i * 7 % 251) as u8).collect();
    expect_err("onnx garbage", "", move || {
        xpu_onnx::import_model(&garbage).map(|g| g.name).map_err(|e| e.to_string())
    });
    // A TensorProto with a million dims, and one whose dims overflow.
    let many = TensorProto { dims: vec![1; 1_000_000], data_type: Some(1), ..Default::default() };
    let b = many.encode_to_vec();
    expect_err("pb many dims", "", move || {
        xpu_onnx::read_tensor_proto(&b)
            .map(|(n, _)| n.unwrap_or_default())
            .map_err(|e| e.to_string())
    });
    let huge =
        TensorProto { dims: vec![1 << 40, 1 << 40], data_type: Some(1), ..Default::default() };
    let b = huge.encode_to_vec();
    expect_err("pb huge dims", "", move || {
        xpu_onnx::read_tensor_proto(&b)
            .map(|(n, _)| n.unwrap_or_default())
            .map_err(|e| e.to_string())
    });
}

#[test]
fn policy_and_inventory_toml() {
    let nested = format!("[policy]\nname = \"p\"\nx = {}1{}\n", "[".repeat(DEEP), "]".repeat(DEEP));
    let inline =
        format!("[policy]\nname = \"p\"\nx = {}1{}\n", "{a = ".repeat(DEEP), "}".repeat(DEEP));
    let long = format!("[policy]\nname = \"{}\"\n", "x".repeat(LONG));
    // A 4 MB name is valid TOML: it loads (linearly), it does not hang.
    let loaded = check("policy long", move || {
        xpu_policy::Loader::new()
            .load_text("p.toml", None, &long)
            .map(|p| p.name().len().to_string())
            .map_err(|d| d.to_string())
    });
    assert_eq!(loaded, Ok(LONG.to_string()));
    for (name, text) in [("nested arrays", nested.clone()), ("nested tables", inline.clone())] {
        expect_err(&format!("policy {name}"), "", move || {
            xpu_policy::Loader::new()
                .load_text("p.toml", None, &text)
                .map(|p| p.name().to_string())
                .map_err(|d| d.to_string())
        });
    }
    for (name, text) in [("nested arrays", nested), ("nested tables", inline)] {
        expect_err(&format!("inventory {name}"), "", move || {
            xpu_engine::Inventory::from_toml(&text)
                .map(|_| String::new())
                .map_err(|e| e.to_string())
        });
    }
}

#[test]
fn assistant_config_toml() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "nested arrays",
            format!("[assistant]\nmodel = {}1{}\n", "[".repeat(DEEP), "]".repeat(DEEP)),
            "",
        ),
        (
            "nested tables",
            format!("[assistant]\nmodel = {}1{}\n", "{a = ".repeat(DEEP), "}".repeat(DEEP)),
            "",
        ),
        ("long key", format!("[assistant]\n{} = 1\n", "k".repeat(LONG)), "unknown field"),
        ("garbage", (0..LONG).map(|i| ["[", "=", "\"", "assistant", "\n"][i % 5]).collect(), ""),
    ];
    for (name, text, want) in cases {
        let path = dir.path().join(format!("{}.toml", name.replace(' ', "_")));
        std::fs::write(&path, text).unwrap();
        expect_err(&format!("assistant config {name}"), want, move || {
            xpu_assistant::AssistantConfig::from_toml_file(&path)
                .map(|c| format!("{c:?}"))
                .map_err(|e| e.to_string())
        });
    }
    // A 4 MB model name is valid: it loads, linearly.
    let path = dir.path().join("long.toml");
    std::fs::write(&path, format!("[assistant]\nmodel = \"{}\"\n", "m".repeat(LONG))).unwrap();
    let loaded = check("assistant config long value", move || {
        xpu_assistant::AssistantConfig::from_toml_file(&path)
            .map(|c| c.model.unwrap_or_default().len().to_string())
            .map_err(|e| e.to_string())
    });
    assert_eq!(loaded, Ok(LONG.to_string()));
}
