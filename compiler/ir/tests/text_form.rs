//! Text form: printer/parser round trips, located parse errors, garbage input.

use xpu_ir::text::{parse, print};
use xpu_ir::{Attr, Attrs, DType, Dim, Graph, Op, Tensor, TensorType, verify};

/// Parses `src`, verifies it, prints it and compares with `expect` (or `src` when empty);
/// then checks that the printed form parses back to the same graph.
fn check(src: &str, expect: &str) {
    let g = parse(src).unwrap_or_else(|e| panic!("parse failed: {e}\n{src}"));
    verify(&g).unwrap_or_else(|e| panic!("verify failed: {e:?}"));
    let printed = print(&g);
    let want = if expect.is_empty() { src } else { expect };
    assert_eq!(printed.trim(), want.trim(), "printed form differs");
    let again = parse(&printed).expect("printed form parses");
    assert_eq!(again, g, "round trip changed the graph");
    let json = xpu_ir::to_json(&g);
    assert_eq!(
        xpu_ir::from_json(&json).expect("JSON parses"),
        g,
        "JSON round trip changed the graph"
    );
}

fn check_err(src: &str, line: usize, col: usize, contains: &str) {
    let e = parse(src).expect_err("should not parse");
    assert_eq!((e.line, e.col), (line, col), "error location for {e}");
    assert!(e.message.contains(contains), "message {:?} lacks {contains:?}", e.message);
}

#[test]
fn round_trips() {
    check(
        r#"graph "mlp" {
  %0: f32[N,4] = input "x"
  %1: f32[4,3] = constant {value = tensor<f32[4,3]> [0.5, -1.0, 2.0, 0.0, 1e-7, 3.25, -0.125, 8.0, 1.0, 2.0, 3.0, 4.0]}
  %2: f32[N,3] = matmul(%0, %1) @name("fc")
  %3: f32[N,3] = relu(%2) @group(0)
  %4: f32[N,3] = softmax(%3) {axis = -1}
  return "y" = %4, "logits" = %2
}"#,
        "",
    );
    check(
        r#"graph "multi" {
  %0: f32[2,6] = input "x"
  %1: i64[2] = constant {value = tensor<i64[2]> [2, 4]}
  %2: f32[2,2], %3: f32[2,4] = split(%0, %1) {axis = 1}
  %4: i64[1] = constant {value = tensor<i64[1]> [2]}
  %5: f32[2,2], %6: i64[2,2] = top_k(%3, %4) {axis = -1, largest = 1}
  return "a" = %2, "v" = %5, "i" = %6
}"#,
        "",
    )
}

#[test]
fn omitted_inputs_strings_and_special_floats() {
    check(
        r#"graph "g" {
  %0: f32[?,3] = input "x"
  %1: f32[] = constant {value = tensor<f32[]> [inf]}
  %2: f32[?,3] = clip(%0, _, %1)
  %3: string[2] = constant {value = tensor<string[2]> ["a \"quoted\"\n", "ünï"]}
  %4: f32[*] = input_free_identity_placeholder(%2)
  return "y" = %2
}"#
        .replace("  %4: f32[*] = input_free_identity_placeholder(%2)\n", "")
        .as_str(),
        "",
    );
}

#[test]
fn large_tensors_use_base64() {
    let mut g = Graph::new("big");
    let x = g.add_input("x", TensorType::new(DType::F32, vec![Dim::Known(32)]));
    let c =
        g.add_const(Tensor::from_vec(vec![32], (0..32).map(|i| i as f32 * 0.1).collect()).unwrap());
    let y = g.add_op(Op::Add, &[x, c], Attrs::new()).unwrap();
    g.add_output("y", y);
    let text = print(&g);
    assert!(text.contains("b64\""), "{text}");
    assert_eq!(parse(&text).unwrap(), g);
}

#[test]
fn located_errors() {
    check_err(
        "graph \"g\" {\n  %0: f32[2] = input \"x\"\n  %1: f32[2] = frobnicate(%0)\n}",
        3,
        16,
        "unknown op `frobnicate`",
    );
    check_err(
        "graph \"g\" {\n  %1: f32[2] = relu(%0)\n}",
        2,
        21,
        "%0 is used before it is defined",
    );
    check_err(
        "graph \"g\" {\n  %0: f32[2] = input \"x\"\n  %0: f32[2] = relu(%0)\n}",
        3,
        3,
        "defined twice",
    );
    check_err("graph \"g\" {\n  %0: f33[2] = input \"x\"\n}", 2, 7, "unknown dtype `f33`");
    check_err("graph \"g\" {\n  %0: f32[2] = input \"x\n", 3, 1, "unterminated string");
    check_err(
        "graph \"g\" {\n  %0: f32[2] = input \"x\"\n  %1: f32[2] = relu(%0) {alpha = [1, \"a\"]}\n}",
        3,
        34,
        "a list attribute holds only",
    );
}

#[test]
fn verifier_names_node_and_rule() {
    let g = parse("graph \"g\" {\n  %0: f32[2,3] = input \"a\"\n  %1: f32[4,5] = input \"b\"\n  %2: f32[2,5] = matmul(%0, %1) @name(\"fc\")\n  return \"y\" = %2\n}").unwrap();
    let errs = verify(&g).unwrap_err();
    let msg = errs[0].to_string();
    assert!(
        msg.contains("n0 (matmul \"fc\")")
            && msg.contains("[types]")
            && msg.contains("inner dims 3 and 4 differ"),
        "{msg}"
    );

    let g = parse("graph \"g\" {\n  %0: f32[2] = input \"a\"\n  %1: f32[2] = relu(%0) {alpha = 1.0}\n  return \"y\" = %1\n}").unwrap();
    let msg = verify(&g).unwrap_err()[0].to_string();
    assert!(msg.contains("[attribute]") && msg.contains("relu has no attribute `alpha`"), "{msg}");

    let g = parse("graph \"g\" {\n  %0: f32[2] = input \"a\"\n  %1: i64[2] = relu(%0)\n  return \"y\" = %1\n}").unwrap();
    let msg = verify(&g).unwrap_err()[0].to_string();
    assert!(msg.contains("declared i64[2] but the op produces f32[2]"), "{msg}");

    let g = parse(
        "graph \"g\" {\n  %0: f32[2] = input \"a\"\n  %1: f32[2] = add(%0)\n  return \"y\" = %1\n}",
    )
    .unwrap();
    let msg = verify(&g).unwrap_err()[0].to_string();
    assert!(msg.contains("n0 (add): [arity] has 1 inputs; add takes 2..=2"), "{msg}");
}

#[test]
fn verifier_catches_cycles_and_bad_arena() {
    let mut g = parse("graph \"g\" {\n  %0: f32[2] = input \"a\"\n  %1: f32[2] = relu(%0)\n  %2: f32[2] = relu(%1)\n  return \"y\" = %2\n}").unwrap();
    // Make n0 read n1's output: a cycle / use before definition.
    g.nodes[0].inputs[0] = Some(xpu_ir::ValueId(2));
    let msg = verify(&g).unwrap_err()[0].to_string();
    assert!(msg.contains("[defined-before-use]") && msg.starts_with("n0 (relu)"), "{msg}");
    let mut g2 = parse("graph \"g\" {\n  %0: f32[2] = input \"a\"\n  %1: f32[2] = relu(%0)\n  return \"y\" = %1\n}").unwrap();
    g2.nodes[0].outputs[0] = xpu_ir::ValueId(0);
    assert!(verify(&g2).unwrap_err().iter().any(|e| e.rule == xpu_ir::Rule::SingleAssignment));
}

#[test]
fn garbage_never_panics() {
    let valid = r#"graph "g" {
  %0: f32[N,4] = input "x"
  %1: f32[4] = constant {value = tensor<f32[4]> [1.0, 2.0, 3.0, 4.0]}
  %2: f32[N,4] = add(%0, %1) {} @name("a") @group(1)
  %3: f32[N,1] = reduce_sum(%2, %4) {keepdims = 1}
  return "y" = %2
}"#;
    // Every prefix, and every single-byte corruption, returns Ok or Err without panicking.
    for end in 0..valid.len() {
        if valid.is_char_boundary(end) {
            let _ = parse(&valid[..end]);
        }
    }
    let bytes = valid.as_bytes();
    for i in 0..bytes.len() {
        for b in [b'%', b'"', b'[', b'{', b'\\', b'0', b'-', 0xFF] {
            let mut v = bytes.to_vec();
            v[i] = b;
            if let Ok(s) = String::from_utf8(v)
                && let Ok(g) = parse(&s)
            {
                let _ = verify(&g);
            }
        }
    }
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..2000 {
        let len = (seed % 200) as usize;
        let s: String = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                b"graph{}()[]<>%0123456789:=,@\"_abcxyz f32i64 \n-.e"[(seed % 48) as usize] as char
            })
            .collect();
        let _ = parse(&s);
    }
}

#[test]
fn json_garbage_is_an_error() {
    assert!(xpu_ir::from_json("{").is_err());
    assert!(xpu_ir::from_json("{\"name\": 3}").is_err());
    assert!(
        xpu_ir::from_json(
            "{\"name\":\"g\",\"values\":[],\"nodes\":[],\"inputs\":[],\"outputs\":[],\"extra\":1}"
        )
        .is_err()
    );
    let bad_tensor = r#"{"name":"g","values":[{"ty":{"dtype":"f32","dims":[2]},"def":{"node":{"node":0,"index":0}}}],"nodes":[{"op":"constant","inputs":[],"outputs":[0],"attrs":{"value":{"kind":"tensor","value":{"dtype":"f32","shape":[2],"data_b64":"AAAAAA=="}}}}],"inputs":[],"outputs":[]}"#;
    let err = xpu_ir::from_json(bad_tensor).unwrap_err().to_string();
    assert!(err.contains("tensor data has 1 elements but shape [2] needs 2"), "{err}");
}

#[test]
fn attrs_fit_their_schema() {
    assert!(Attr::Int(1).fits(xpu_ir::AttrKind::Float));
    assert!(!Attr::Str("x".into()).fits(xpu_ir::AttrKind::Int));
    let a = Attrs::new().with("axis", Attr::Int(-1));
    assert_eq!(a.int("axis", 0), -1);
    assert_eq!(a.int("missing", 7), 7);
}

#[test]
fn low_precision_constants_round_trip_code_for_code() {
    // Both NaN codes of f8e4m3fn (0x7f, 0xff), −0 (0x80) and a number (0x38 = 1.0): written
    // as base64 so every code survives; i4 codes hold −8 and 7.
    check(
        r#"graph "lowp" {
  %0: f8e4m3fn[4] = constant {value = tensor<f8e4m3fn[4]> b64"f/+AOA=="}
  %1: f32[4] = cast(%0) {to = dtype<f32>}
  %2: i4[2] = constant {value = tensor<i4[2]> b64"CAc="}
  %3: i8[2] = cast(%2) {to = dtype<i8>}
  %4: f8e5m2[4] = cast(%1) {round_mode = "up", saturate = 0, to = dtype<f8e5m2>}
  return "y" = %1, "z" = %3, "w" = %4
}"#,
        "",
    );
    // Written by hand: numbers in range, others refused with their value.
    let g = parse("graph \"g\" {\n  %0: i4[2] = constant {value = tensor<i4[2]> [-8, 7]}\n  return \"y\" = %0\n}").unwrap();
    assert_eq!(g.ty(g.outputs[0].value).dtype, DType::I4);
    check_err(
        "graph \"g\" {\n  %0: i4[1] = constant {value = tensor<i4[1]> [8]}\n  return \"y\" = %0\n}",
        2,
        50,
        "8 does not fit i4",
    );
    check_err(
        "graph \"g\" {\n  %0: f8e4m3fn[1] = constant {value = tensor<f8e4m3fn[1]> [500.0]}\n  return \"y\" = %0\n}",
        2,
        66,
        "500 does not fit f8e4m3fn",
    );
}

#[test]
fn low_precision_values_only_flow_through_casts_quantization_and_reshapes() {
    let refused = |body: &str, contains: &str| {
        let src = format!("graph \"g\" {{\n  %0: f32[2] = input \"a\"\n{body}\n}}");
        let g = parse(&src).unwrap();
        let msg = verify(&g).unwrap_err()[0].to_string();
        assert!(msg.contains(contains), "{msg}");
    };
    refused(
        "  %1: f8e4m3fn[2] = cast(%0) {to = dtype<f8e4m3fn>}\n  %2: f8e4m3fn[2] = add(%1, %1)\n  return \"y\" = %2",
        "takes no f8e4m3fn input",
    );
    refused(
        "  %1: i64[1] = constant {value = tensor<i64[1]> [2]}\n  %2: i4[2] = constant_of_shape(%1) {value = tensor<i4[1]> [1]}\n  return \"y\" = %2",
        "cannot make i4 values",
    );
    refused(
        "  %1: f32[2] = bit_cast(%0) {to = dtype<u4>}\n  return \"y\" = %1",
        "cannot reinterpret f32 as u4",
    );
}
