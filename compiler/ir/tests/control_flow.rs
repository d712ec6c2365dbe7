//! Control flow in the IR: `if`, `loop` and `scan` with subgraphs round-trip through the
//! text and JSON forms, their output types are inferred from the subgraphs, and malformed
//! subgraphs are verifier errors that name the node, the subgraph and what is wrong.

use xpu_ir::text::{parse, print};
use xpu_ir::verify;

/// Parses, verifies, prints (equal to `src`) and parses back (equal graph); JSON too.
fn check(src: &str) {
    let g = parse(src).unwrap_or_else(|e| panic!("parse failed: {e}\n{src}"));
    verify(&g).unwrap_or_else(|e| panic!("verify failed: {e:?}\n{src}"));
    let printed = print(&g);
    assert_eq!(printed.trim(), src.trim(), "printed form differs");
    assert_eq!(parse(&printed).expect("printed form parses"), g, "text round trip");
    let json = xpu_ir::to_json(&g);
    assert_eq!(xpu_ir::from_json(&json).expect("JSON parses"), g, "JSON round trip");
}

/// Parses `src` and expects the verifier to report a problem containing `want`.
fn check_invalid(src: &str, want: &str) {
    let g = parse(src).unwrap_or_else(|e| panic!("parse failed: {e}\n{src}"));
    let errs = verify(&g).expect_err("should not verify");
    let all: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert!(all.iter().any(|m| m.contains(want)), "no error contains {want:?}: {all:#?}");
}

const IF: &str = r#"graph "g" {
  %0: bool[] = input "c"
  %1: f32[2] = input "x"
  %2: f32[2] = if(%0, %1) {else_branch = graph "else" {
    %0: f32[2] = input "capture0"
    %1: f32[2] = neg(%0)
    return "y" = %1
  }, then_branch = graph "then" {
    %0: f32[2] = input "capture0"
    %1: f32[2] = relu(%0)
    return "y" = %1
  }}
  return "y" = %2
}"#;

const LOOP: &str = r#"graph "g" {
  %0: i64[] = input "n"
  %1: f32[3] = input "x"
  %2: f32[3] = input "step"
  %3: f32[3], %4: f32[?,3] = loop(%0, _, %1, %2) {body = graph "body" {
    %0: i64[] = input "i"
    %1: bool[] = input "cond"
    %2: f32[3] = input "acc"
    %3: f32[3] = input "capture0"
    %4: f32[3] = add(%2, %3)
    %5: bool[] = identity(%1)
    return "cond_out" = %5, "acc_out" = %4, "scan" = %4
  }, captures = 1}
  return "sum" = %3, "partials" = %4
}"#;

const SCAN: &str = r#"graph "g" {
  %0: f32[2] = input "init"
  %1: f32[5,2] = input "xs"
  %2: f32[2], %3: f32[2,5] = scan(%0, %1) {body = graph "body" {
    %0: f32[2] = input "s"
    %1: f32[2] = input "x"
    %2: f32[2] = add(%0, %1)
    return "s_out" = %2, "y" = %2
  }, num_scan_inputs = 1, scan_input_directions = [1], scan_output_axes = [-1]}
  return "final" = %2, "all" = %3
}"#;

#[test]
fn control_flow_round_trips_with_inferred_types() {
    check(IF);
    check(LOOP);
    check(SCAN);
    // Nested: a loop whose body holds an if that reads the loop's capture.
    check(
        r#"graph "g" {
  %0: i64[] = input "n"
  %1: f32[] = input "x"
  %2: f32[] = input "k"
  %3: f32[] = loop(%0, _, %1, %2) {body = graph "body" {
    %0: i64[] = input "i"
    %1: bool[] = input "cond"
    %2: f32[] = input "acc"
    %3: f32[] = input "capture0"
    %4: f32[] = constant {value = tensor<f32[]> [0.0]}
    %5: bool[] = greater(%2, %4)
    %6: f32[] = if(%5, %2, %3) {else_branch = graph "else" {
      %0: f32[] = input "capture0"
      %1: f32[] = input "capture1"
      %2: f32[] = add(%0, %1)
      return "y" = %2
    }, then_branch = graph "then" {
      %0: f32[] = input "capture0"
      %1: f32[] = input "capture1"
      %2: f32[] = sub(%0, %1)
      return "y" = %2
    }}
    return "c" = %1, "acc_out" = %6
  }, captures = 1}
  return "y" = %3
}"#,
    );
}

#[test]
fn malformed_subgraphs_are_named_errors() {
    let cases: &[(&str, &str, &str)] = &[
        // (what to replace in IF, with what, the error)
        (r#"%0: bool[] = input "c""#, r#"%0: f32[] = input "c""#, "the condition must be bool"),
        (r#"%0: bool[] = input "c""#, r#"%0: bool[3] = input "c""#, "must have one element"),
        (
            "%1: f32[2] = neg(%0)\n    return \"y\" = %1",
            "%1: f32[2] = neg(%0)\n    return \"y\" = %1, \"z\" = %0",
            "`else_branch` gives 2 outputs for 1",
        ),
        (
            "%0: f32[2] = input \"capture0\"\n    %1: f32[2] = relu",
            "%0: f32[3] = input \"capture0\"\n    %1: f32[3] = relu",
            "`then_branch` input 0 is declared f32[3] but is given f32[2]",
        ),
        (
            "%1: f32[2] = relu(%0)",
            "%1: f32[2] = relu(%0) {alpha = 1.0}",
            "in `then_branch`: n0 (relu): [attribute]",
        ),
        (
            "%2: f32[2] = if(%0, %1)",
            "%2: i64[2] = if(%0, %1)",
            "declared i64[2] but the op produces f32[2]",
        ),
    ];
    for (from, to, want) in cases {
        assert!(IF.contains(from), "{from}");
        check_invalid(&IF.replace(from, to), want);
    }
    let loops: &[(&str, &str, &str)] = &[
        ("captures = 1", "captures = 5", "`captures` = 5, but only 2 inputs can be captures"),
        // Without the capture, `step` is a second loop-carried value and the scan output
        // becomes its final value.
        ("captures = 1", "captures = 0", "%4 is declared f32[?,3] but the op produces f32[3]"),
        (
            r#"%5: bool[] = identity(%1)"#,
            r#"%5: f32[3] = identity(%4)"#,
            "output 0 (the condition) is f32[3], not bool",
        ),
        (r#"%0: i64[] = input "n""#, r#"%0: f32[] = input "n""#, "the trip count M must be i64"),
        (
            r#"%0: i64[] = input "i""#,
            r#"%0: f32[] = input "i""#,
            "`body` input 0 is declared f32[] but is given i64[]",
        ),
    ];
    for (from, to, want) in loops {
        assert!(LOOP.contains(from), "{from}");
        check_invalid(&LOOP.replace(from, to), want);
    }
    let scans: &[(&str, &str, &str)] = &[
        ("num_scan_inputs = 1", "num_scan_inputs = 3", "`num_scan_inputs` = 3: must be 1 to 2"),
        (
            "scan_input_directions = [1]",
            "scan_input_directions = [2]",
            "each is 0 (forward) or 1 (reverse)",
        ),
        ("scan_output_axes = [-1]", "scan_output_axes = [2]", "scan output 0: axis 2 for rank 2"),
        (
            "scan_input_directions = [1]",
            "scan_input_directions = [1, 0]",
            "has 2 entries for 1 values",
        ),
    ];
    for (from, to, want) in scans {
        assert!(SCAN.contains(from), "{from}");
        check_invalid(&SCAN.replace(from, to), want);
    }
    // A missing subgraph.
    check_invalid(
        "graph \"g\" {\n  %0: bool[] = input \"c\"\n  %1: f32[] = if(%0)\n  return \"y\" = %1\n}",
        "attribute `then_branch` (a graph) is required",
    );
}

/// `depth` ifs nested in each other's then-branch, innermost returning a constant.
fn nested_ifs(depth: usize) -> String {
    let mut body = "graph \"leaf\" {\n  %0: f32[] = constant {value = tensor<f32[]> [1.0]}\n  return \"y\" = %0\n}".to_string();
    for _ in 0..depth {
        body = format!(
            "graph \"b\" {{\n  %0: bool[] = constant {{value = tensor<bool[]> [true]}}\n  %1: f32[] = if(%0) {{else_branch = {body}, then_branch = {body}}}\n  return \"y\" = %1\n}}"
        );
        if body.len() > 1 << 22 {
            break;
        }
    }
    body
}

#[test]
fn nesting_is_bounded() {
    // 10 deep (each level doubles the text: both branches) parses and verifies.
    let ok = parse(&nested_ifs(10)).expect("10 deep parses");
    verify(&ok).expect("10 deep verifies");
    // Past the limit: a parse error, not a stack overflow. One branch deep, so the text
    // stays small.
    let mut deep = "graph \"leaf\" {\n  %0: f32[] = constant {value = tensor<f32[]> [1.0]}\n  return \"y\" = %0\n}".to_string();
    let leaf = deep.clone();
    for _ in 0..200 {
        deep = format!(
            "graph \"b\" {{\n  %0: bool[] = constant {{value = tensor<bool[]> [true]}}\n  %1: f32[] = if(%0) {{else_branch = {leaf}, then_branch = {deep}}}\n  return \"y\" = %1\n}}"
        );
    }
    let e = parse(&deep).expect_err("200 deep is refused");
    assert!(e.message.contains("nested more than 32 deep"), "{e}");
}
