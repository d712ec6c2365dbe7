//! ONNX import/export: import → export → import is the identity on every node-suite model
//! the importer accepts, partitions export and run, and malformed bytes never panic.

use xpu_ir::{Graph, text::print};

fn suite_models() -> Vec<(String, Vec<u8>)> {
    let dir = xpu_tests::conformance::cache_dir();
    let manifest = xpu_tests::conformance::load_manifest(&dir).unwrap_or_else(|e| panic!("{e}"));
    manifest
        .cases
        .iter()
        .map(|c| (c.name.clone(), std::fs::read(dir.join(&c.name).join("model.onnx")).unwrap()))
        .collect()
}

/// Equal texts, except the `opset` an opaque default-domain node records: an export has one
/// default-domain opset (the highest its nodes need), so such a node comes back at it.
fn same_but_opaque_opsets(a: &str, b: &str) -> bool {
    let mask = |t: &str| -> String {
        t.lines()
            .map(|l| match (l.contains("onnx_op("), l.find("opset = ")) {
                (true, Some(at)) => {
                    let rest = &l[at + "opset = ".len()..];
                    let digits = rest.chars().take_while(char::is_ascii_digit).count();
                    format!("{}opset = _{}", &l[..at], &rest[digits..])
                }
                _ => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    mask(a) == mask(b)
}

#[test]
fn import_export_import_round_trips() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, bytes) in suite_models() {
        let Ok(g) = xpu_onnx::import_model(&bytes) else { continue };
        let exported = xpu_onnx::export_model(&g);
        match xpu_onnx::import_model(&exported) {
            Ok(g2) if same_but_opaque_opsets(&print(&g2), &print(&g)) => checked += 1,
            Ok(g2) => failures.push(format!(
                "{name}: differs after round trip:\n{}\nvs\n{}",
                print(&g),
                print(&g2)
            )),
            Err(e) => failures.push(format!("{name}: exported model does not import: {e}")),
        }
    }
    assert!(failures.is_empty(), "{} failures, first: {}", failures.len(), failures[0]);
    assert!(checked > 1000, "only {checked} models round-tripped");
}

#[test]
fn exported_partitions_run_like_the_whole() {
    // Split a graph into two partitions, export each to ONNX, re-import, run them in
    // sequence through their boundary values: the result equals running the whole graph.
    let src = r#"graph "g" {
  %0: f32[2,3] = input "x"
  %1: f32[3] = constant {value = tensor<f32[3]> [0.5, -1.0, 2.0]}
  %2: f32[2,3] = mul(%0, %1)
  %3: f32[2,3] = exp(%2)
  %4: f32[3,2] = transpose(%3) {perm = [1, 0]}
  %5: f32[3,2] = relu(%4)
  %6: f32[2,3] = sigmoid(%2)
  return "y" = %5, "s" = %6
}"#;
    let g = xpu_ir::text::parse(src).unwrap();
    let first = g.partition(&[xpu_ir::NodeId(1), xpu_ir::NodeId(2), xpu_ir::NodeId(5)]);
    let second = g.partition(&[xpu_ir::NodeId(3), xpu_ir::NodeId(4)]);
    xpu_ir::verify(&first.graph).unwrap();
    xpu_ir::verify(&second.graph).unwrap();
    assert_eq!(first.inputs, vec![xpu_ir::ValueId(0)]);
    assert_eq!(
        first.outputs,
        vec![xpu_ir::ValueId(3), xpu_ir::ValueId(6)],
        "exp feeds the other partition; sigmoid is a graph output"
    );
    assert_eq!(second.inputs, vec![xpu_ir::ValueId(3)]);
    let reimport = |p: &Graph| xpu_onnx::import_model(&xpu_onnx::export_model(p)).unwrap();
    let (a, b) = (reimport(&first.graph), reimport(&second.graph));
    let x = xpu_ir::Tensor::from_vec(vec![2, 3], vec![-1.0f32, 0.5, 2.0, -3.0, 4.0, 0.0]).unwrap();
    let whole = xpu_engine_cpu::run_graph(&g, std::slice::from_ref(&x)).unwrap().outputs;
    let part1 = xpu_engine_cpu::run_graph(&a, &[x]).unwrap().outputs;
    let part2 = xpu_engine_cpu::run_graph(&b, &part1[..1]).unwrap().outputs;
    assert_eq!(part2[0], whole[0]);
    assert_eq!(part1[1], whole[1]);
}

#[test]
fn exported_models_pass_the_onnx_checker() {
    // Every model the importer accepts is exported and checked by onnx's own checker with full
    // shape inference (right opset for each op and dtype, valid attributes). An export may only
    // be rejected when onnx rejects the original model too.
    let dir = xpu_tests::conformance::cache_dir();
    let out = std::env::temp_dir().join(format!("xpu-export-check-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let mut pairs = String::new();
    for (name, bytes) in suite_models() {
        let Ok(g) = xpu_onnx::import_model(&bytes) else { continue };
        let path = out.join(format!("{name}.onnx"));
        std::fs::write(&path, xpu_onnx::export_model(&g)).unwrap();
        pairs.push_str(&format!(
            "{}\t{}\n",
            path.display(),
            dir.join(&name).join("model.onnx").display()
        ));
    }
    let list = out.join("pairs.tsv");
    std::fs::write(&list, &pairs).unwrap();
    let script = r#"
import sys, onnx
def ok(p):
    try:
        onnx.checker.check_model(onnx.load(p), full_check=True)
        return True
    except Exception as e:
        return str(e).splitlines()[0]
bad = []
n = 0
for line in open(sys.argv[1]):
    exported, original = line.rstrip("\n").split("\t")
    n += 1
    r = ok(exported)
    if r is not True and ok(original) is True:
        bad.append(f"{exported}: {r}")
print(n)
print("\n".join(bad))
sys.exit(1 if bad else 0)
"#;
    let python = xpu_tests::repo_root().join(".venv/bin/python");
    let res = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(&list)
        .output()
        .expect("the venv's python runs (make setup)");
    let stdout = String::from_utf8_lossy(&res.stdout);
    assert!(
        res.status.success(),
        "onnx.checker rejected exports whose originals it accepts:\n{stdout}{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let checked: usize = stdout.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
    assert!(checked > 1400, "only {checked} exports checked");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn malformed_models_are_errors_not_panics() {
    let models = suite_models();
    let (_, conv) = models.iter().find(|(n, _)| n == "test_conv_with_strides_padding").unwrap();
    // Every truncation.
    for end in 0..conv.len() {
        let _ = xpu_onnx::import_model(&conv[..end]);
    }
    // Corrupted bytes at every position with a few patterns.
    for i in 0..conv.len() {
        for b in [0x00, 0xFF, 0x08, 0x12, 0x7F] {
            let mut v = conv.clone();
            v[i] = b;
            if let Ok(g) = xpu_onnx::import_model(&v) {
                let _ = xpu_ir::verify(&g);
            }
        }
    }
    // Pseudo-random garbage.
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    for n in 0..3000 {
        let v: Vec<u8> = (0..(n % 300))
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        let _ = xpu_onnx::import_model(&v);
        let _ = xpu_onnx::read_tensor_proto(&v);
    }
    let err = xpu_onnx::import_model(b"\x0a\x05hello").unwrap_err().to_string();
    assert!(err.contains("no graph") || err.contains("not a valid ONNX"), "{err}");
}

#[test]
fn unknown_ops_import_opaque_or_name_op_node_opset_and_doc() {
    use prost::Message;
    let models = suite_models();
    let (_, bytes) =
        models.iter().find(|(n, _)| n == "test_tfidfvectorizer_tf_only_bigrams_skip0").unwrap();
    // The model declares the output's type: the node is kept whole for ONNX engines.
    let g = xpu_onnx::import_model(bytes).unwrap();
    assert_eq!(g.nodes[0].op, xpu_ir::Op::OnnxOp);
    assert_eq!(g.nodes[0].attrs.str("op_type", ""), "TfIdfVectorizer");
    xpu_ir::verify(&g).unwrap();
    // Without a declared output type nothing can type it: unsupported, with where and why.
    let mut m = xpu_onnx::proto::ModelProto::decode(bytes.as_slice()).unwrap();
    m.graph.as_mut().unwrap().output[0].r#type = None;
    let err = xpu_onnx::import_model(&m.encode_to_vec()).unwrap_err().to_string();
    assert!(
        err.contains("unsupported op `TfIdfVectorizer`")
            && err.contains("opset 9")
            && err.contains("docs/onnx-support.md"),
        "{err}"
    );
}

/// A model of one graph; `opset` for the default domain.
fn model_of(graph: xpu_onnx::proto::GraphProto, opset: i64) -> Vec<u8> {
    use prost::Message;
    xpu_onnx::proto::ModelProto {
        ir_version: Some(8),
        opset_import: vec![xpu_onnx::proto::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(opset),
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn malformed_subgraphs_are_named_errors_not_panics() {
    use prost::Message;
    use xpu_onnx::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, attribute_proto};
    let models = suite_models();
    let model = |name: &str| {
        let (_, b) = models.iter().find(|(n, _)| n == name).unwrap();
        ModelProto::decode(b.as_slice()).unwrap()
    };
    let import = |m: &ModelProto| xpu_onnx::import_model(&m.encode_to_vec());
    let branch = |m: &mut ModelProto, attr: &str| -> GraphProto {
        let a = m.graph.as_mut().unwrap().node[0]
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(attr));
        a.unwrap().g.clone().unwrap()
    };
    let set_branch = |m: &mut ModelProto, attr: &str, g: GraphProto| {
        let node = &mut m.graph.as_mut().unwrap().node[0];
        node.attribute.iter_mut().find(|a| a.name.as_deref() == Some(attr)).unwrap().g = Some(g);
    };

    // An outer value no enclosing graph defines.
    let mut m = model("test_if");
    let mut then = branch(&mut m, "then_branch");
    then.node[0].input = vec!["nowhere".into()];
    then.node[0].op_type = Some("Identity".into());
    then.node[0].attribute.clear();
    set_branch(&mut m, "then_branch", then);
    let e = import(&m).unwrap_err().to_string();
    assert!(e.contains("a subgraph uses `nowhere`, which no enclosing graph defines"), "{e}");

    // A loop body whose inputs do not match the loop.
    let mut m = model("test_loop11");
    let mut body = branch(&mut m, "body");
    let mut extra = body.input[2].clone();
    extra.name = Some("extra".into());
    body.input.push(extra);
    set_branch(&mut m, "body", body);
    let e = import(&m).unwrap_err().to_string();
    assert!(e.contains("declares 4 inputs; its node gives it 3"), "{e}");

    // A body with too few outputs for the loop.
    let mut m = model("test_loop11");
    let mut body = branch(&mut m, "body");
    body.output.truncate(1);
    set_branch(&mut m, "body", body);
    let e = import(&m).unwrap_err().to_string();
    assert!(e.contains("`body` gives 1 outputs"), "{e}");

    // Sequences inside a branch: refused by name.
    let e = import(&model("test_if_seq")).unwrap_err().to_string();
    assert!(e.contains("SequenceConstruct"), "{e}");

    // Ifs nested 40 deep: refused, no stack overflow.
    let constant = |out: &str, v: onnx_tensor::Value| NodeProto {
        op_type: Some("Constant".into()),
        output: vec![out.into()],
        attribute: vec![AttributeProto {
            name: Some("value".into()),
            r#type: Some(attribute_proto::AttributeType::Tensor as i32),
            t: Some(onnx_tensor::scalar(v)),
            ..Default::default()
        }],
        ..Default::default()
    };
    let output = |name: &str| xpu_onnx::proto::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(onnx_tensor::float_type()),
        ..Default::default()
    };
    let leaf = GraphProto {
        name: Some("leaf".into()),
        node: vec![constant("y0", onnx_tensor::Value::F(1.0))],
        output: vec![output("y0")],
        ..Default::default()
    };
    let mut g = leaf.clone();
    for k in 1..=40 {
        let graph_attr = |name: &str, g: GraphProto| AttributeProto {
            name: Some(name.into()),
            r#type: Some(attribute_proto::AttributeType::Graph as i32),
            g: Some(g),
            ..Default::default()
        };
        let mut inner_leaf = leaf.clone();
        inner_leaf.node[0].output = vec![format!("leaf{k}")];
        inner_leaf.output = vec![output(&format!("leaf{k}"))];
        g = GraphProto {
            name: Some(format!("level{k}")),
            node: vec![
                constant(&format!("c{k}"), onnx_tensor::Value::B(true)),
                NodeProto {
                    op_type: Some("If".into()),
                    input: vec![format!("c{k}")],
                    output: vec![format!("y{k}")],
                    attribute: vec![
                        graph_attr("then_branch", g),
                        graph_attr("else_branch", inner_leaf),
                    ],
                    ..Default::default()
                },
            ],
            output: vec![output(&format!("y{k}"))],
            ..Default::default()
        };
        let bytes = model_of(g.clone(), 21);
        match xpu_onnx::import_model(&bytes) {
            Ok(imported) if k <= 32 => xpu_ir::verify(&imported).unwrap(),
            Ok(_) => panic!("{k} deep imported"),
            // Past 32 levels protobuf's own decoder (its recursion limit) or the importer
            // refuses it.
            Err(e) => {
                let e = e.to_string();
                assert!(
                    k > 32
                        && (e.contains("nest more than 32 deep") || e.contains("recursion limit")),
                    "{k}: {e}"
                );
            }
        }
    }

    // Corrupted bytes of a loop model at every position: errors, never panics.
    let (_, bytes) = models.iter().find(|(n, _)| n == "test_loop11").unwrap();
    for i in 0..bytes.len() {
        for b in [0x00, 0xFF, 0x12, 0x3A] {
            let mut v = bytes.clone();
            v[i] = b;
            if let Ok(g) = xpu_onnx::import_model(&v) {
                let _ = xpu_ir::verify(&g);
            }
        }
    }
}

/// Small TensorProto builders for hand-made models.
mod onnx_tensor {
    use xpu_onnx::proto::{TensorProto, TypeProto, tensor_proto::DataType, type_proto};

    pub enum Value {
        F(f32),
        B(bool),
    }

    pub fn scalar(v: Value) -> TensorProto {
        match v {
            Value::F(f) => TensorProto {
                data_type: Some(DataType::Float as i32),
                float_data: vec![f],
                ..Default::default()
            },
            Value::B(b) => TensorProto {
                data_type: Some(DataType::Bool as i32),
                int32_data: vec![b as i32],
                ..Default::default()
            },
        }
    }

    pub fn float_type() -> TypeProto {
        TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(DataType::Float as i32),
                shape: None,
            })),
            denotation: None,
        }
    }
}
