//! The cpu engine runs `if`, `loop` and `scan`: branches, loop-carried values, scan outputs
//! (also after zero iterations), directions and axes; unbounded loops stop with an error,
//! and a cancelled run stops a loop between iterations.

use std::time::{Duration, Instant};

use xpu_engine::{Assignment, Engine, StopToken};
use xpu_engine_cpu::CpuEngine;
use xpu_ir::Tensor;
use xpu_ir::text::parse;

fn run(src: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
    let g = parse(src).unwrap_or_else(|e| panic!("{e}"));
    xpu_ir::verify(&g).unwrap_or_else(|e| panic!("{e:?}"));
    let mut exe =
        CpuEngine::new().prepare(&g, &Assignment::new("cpu")).map_err(|e| e.to_string())?;
    exe.run(inputs).map(|r| r.outputs).map_err(|e| e.to_string())
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.as_slice::<f32>().expect("f32").to_vec()
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

#[test]
fn if_runs_the_branch_its_condition_names() {
    let x = Tensor::from_vec(vec![2], vec![-1.0f32, 2.0]).unwrap();
    let y = run(IF, &[Tensor::scalar(true), x.clone()]).unwrap();
    assert_eq!(f32s(&y[0]), [0.0, 2.0]);
    let y = run(IF, &[Tensor::scalar(false), x]).unwrap();
    assert_eq!(f32s(&y[0]), [1.0, -2.0]);
}

/// acc += step while i < n (and while acc[0] < limit), every partial sum stacked.
const LOOP: &str = r#"graph "g" {
  %0: i64[] = input "n"
  %1: bool[] = input "go"
  %2: f32[3] = input "x"
  %3: f32[3] = input "step"
  %4: f32[] = input "limit"
  %5: f32[3], %6: f32[?,3] = loop(%0, %1, %2, %3, %4) {body = graph "body" {
    %0: i64[] = input "i"
    %1: bool[] = input "cond"
    %2: f32[3] = input "acc"
    %3: f32[3] = input "capture0"
    %4: f32[] = input "capture1"
    %5: f32[3] = add(%2, %3)
    %6: i64[1] = constant {value = tensor<i64[1]> [0]}
    %7: f32[1] = gather(%5, %6) {axis = 0}
    %8: f32[] = reduce_sum(%7) {keepdims = 0}
    %9: bool[] = less(%8, %4)
    return "cond_out" = %9, "acc_out" = %5, "scan" = %5
  }, captures = 2}
  return "sum" = %5, "partials" = %6
}"#;

#[test]
fn loop_carries_values_and_stacks_scan_outputs() {
    let x = Tensor::from_vec(vec![3], vec![0.0f32, 10.0, 20.0]).unwrap();
    let step = Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let args = |n: i64, go: bool, limit: f32| {
        vec![Tensor::scalar(n), Tensor::scalar(go), x.clone(), step.clone(), Tensor::scalar(limit)]
    };
    // The trip count stops it: 4 iterations.
    let y = run(LOOP, &args(4, true, 100.0)).unwrap();
    assert_eq!(f32s(&y[0]), [4.0, 18.0, 32.0]);
    assert_eq!(y[1].shape(), [4, 3]);
    assert_eq!(f32s(&y[1])[..3], [1.0, 12.0, 23.0]);
    // The condition stops it: after the iteration where acc[0] reaches 2.
    let y = run(LOOP, &args(100, true, 2.0)).unwrap();
    assert_eq!(f32s(&y[0]), [2.0, 14.0, 26.0]);
    assert_eq!(y[1].shape(), [2, 3]);
    // A false condition at the start: no iteration, the values pass through, and the scan
    // output is empty with the slice's shape.
    let y = run(LOOP, &args(100, false, 2.0)).unwrap();
    assert_eq!(f32s(&y[0]), [0.0, 10.0, 20.0]);
    assert_eq!(y[1].shape(), [0, 3]);
}

#[test]
fn an_unbounded_loop_stops_with_an_error() {
    // Trip count 2^62 and a condition that stays true.
    let x = Tensor::from_vec(vec![3], vec![0.0f32; 3]).unwrap();
    let zero = Tensor::from_vec(vec![3], vec![0.0f32; 3]).unwrap();
    let start = Instant::now();
    let e = run(
        LOOP,
        &[Tensor::scalar(1i64 << 62), Tensor::scalar(true), x, zero, Tensor::scalar(1.0f32)],
    )
    .unwrap_err();
    assert!(e.contains("ran 1000000 iterations without stopping"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(120), "took {:?}", start.elapsed());
}

#[test]
fn a_cancelled_run_stops_a_loop_between_iterations() {
    let g = parse(LOOP).unwrap();
    let mut exe = CpuEngine::new().prepare(&g, &Assignment::new("cpu")).unwrap();
    let x = Tensor::from_vec(vec![3], vec![0.0f32; 3]).unwrap();
    let inputs =
        [Tensor::scalar(1i64 << 62), Tensor::scalar(true), x.clone(), x, Tensor::scalar(1.0f32)];
    let stop = StopToken::new();
    stop.set_deadline(Duration::from_millis(50));
    let start = Instant::now();
    let e = exe.run_until(&inputs, &stop).unwrap_err().to_string();
    // Stopped inside the loop: between its iterations or between its body's nodes.
    assert!(e.contains("past its deadline") && e.contains("(loop)"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
}

#[test]
fn scan_runs_slices_forward_and_backward_along_any_axis() {
    // Running sums of the rows of xs, read in reverse, written along the last axis.
    let src = r#"graph "g" {
  %0: f32[2] = input "init"
  %1: f32[3,2] = input "xs"
  %2: f32[2], %3: f32[2,3] = scan(%0, %1) {body = graph "body" {
    %0: f32[2] = input "s"
    %1: f32[2] = input "x"
    %2: f32[2] = add(%0, %1)
    return "s_out" = %2, "y" = %2
  }, num_scan_inputs = 1, scan_input_directions = [1], scan_output_axes = [-1]}
  return "final" = %2, "all" = %3
}"#;
    let init = Tensor::from_vec(vec![2], vec![0.0f32, 100.0]).unwrap();
    let xs = Tensor::from_vec(vec![3, 2], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let y = run(src, &[init.clone(), xs.clone()]).unwrap();
    assert_eq!(f32s(&y[0]), [9.0, 112.0]);
    // Rows read 5,6 then 3,4 then 1,2: sums (5,106) (8,110) (9,112), stacked on axis 1.
    assert_eq!(y[1].shape(), [2, 3]);
    assert_eq!(f32s(&y[1]), [5.0, 8.0, 9.0, 106.0, 110.0, 112.0]);
    // Reverse output order too.
    let rev = src.replace(
        "scan_output_axes = [-1]",
        "scan_output_axes = [-1], scan_output_directions = [1]",
    );
    let y = run(&rev, &[init, xs]).unwrap();
    assert_eq!(f32s(&y[1]), [9.0, 8.0, 5.0, 112.0, 110.0, 106.0]);
}

#[test]
fn a_failing_subgraph_names_the_node_and_subgraph() {
    // The branch divides integers by zero at run time.
    let src = r#"graph "g" {
  %0: bool[] = input "c"
  %1: i64[2] = input "x"
  %2: i64[2] = if(%0, %1) {else_branch = graph "else" {
    %0: i64[2] = input "capture0"
    return "y" = %0
  }, then_branch = graph "then" {
    %0: i64[2] = input "capture0"
    %1: i64[2] = constant {value = tensor<i64[2]> [0, 0]}
    %2: i64[2] = div(%0, %1)
    return "y" = %2
  }} @name("pick")
  return "y" = %2
}"#;
    let x = Tensor::from_vec(vec![2], vec![1i64, 2]).unwrap();
    let e = run(src, &[Tensor::scalar(true), x]).unwrap_err();
    assert!(e.contains("pick") && e.contains("`then_branch`") && e.contains("div"), "{e}");
}
