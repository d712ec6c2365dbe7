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

#[test]
fn import_export_import_round_trips() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, bytes) in suite_models() {
        let Ok(g) = xpu_onnx::import_model(&bytes) else { continue };
        let exported = xpu_onnx::export_model(&g);
        match xpu_onnx::import_model(&exported) {
            Ok(g2) if print(&g2) == print(&g) => checked += 1,
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
fn exported_partition_runs_like_the_whole() {
    // Cut the middle of a graph out as its own graph, export it, re-import and run it: the
    // result equals running the same nodes inside the full graph.
    let src = r#"graph "g" {
  %0: f32[2,3] = input "x"
  %1: f32[2,3] = exp(%0)
  %2: f32[3,2] = transpose(%1) {perm = [1, 0]}
  %3: f32[3,2] = relu(%2)
  %4: f32[3,2] = neg(%3)
  return "y" = %4
}"#;
    let g = xpu_ir::text::parse(src).unwrap();
    let mut part = Graph::new("part");
    let x = part.add_input("t", g.ty(xpu_ir::ValueId(1)).clone());
    let t = part.add_op(xpu_ir::Op::Transpose, &[x], g.nodes[1].attrs.clone()).unwrap();
    let r = part.add_op(xpu_ir::Op::Relu, &[t], Default::default()).unwrap();
    part.add_output("r", r);
    let back = xpu_onnx::import_model(&xpu_onnx::export_model(&part)).unwrap();
    let input =
        xpu_ir::Tensor::from_vec(vec![2, 3], vec![-1.0f32, 0.5, 2.0, -3.0, 4.0, 0.0]).unwrap();
    let exp_in = xpu_engine_cpu::run_graph(&xpu_ir::text::parse("graph \"e\" {\n  %0: f32[2,3] = input \"x\"\n  %1: f32[2,3] = exp(%0)\n  return \"e\" = %1\n}").unwrap(), std::slice::from_ref(&input)).unwrap().outputs.remove(0);
    let via_part = xpu_engine_cpu::run_graph(&back, &[exp_in]).unwrap().outputs.remove(0);
    let whole = xpu_engine_cpu::run_graph(&g, &[input]).unwrap().outputs.remove(0);
    let neg: Vec<f32> = via_part.as_slice::<f32>().unwrap().iter().map(|v| -v).collect();
    assert_eq!(neg, whole.as_slice::<f32>().unwrap());
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
fn unsupported_op_error_names_op_node_opset_and_doc() {
    let models = suite_models();
    let (_, bytes) =
        models.iter().find(|(n, _)| n == "test_nonmaxsuppression_center_point_box_format").unwrap();
    let err = xpu_onnx::import_model(bytes).unwrap_err().to_string();
    assert!(
        err.contains("unsupported op `NonMaxSuppression`")
            && err.contains("opset 11")
            && err.contains("docs/onnx-support.md"),
        "{err}"
    );
}
