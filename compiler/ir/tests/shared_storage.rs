//! Tensor storage is shared: cloning a graph, or cutting a partition out of it, never copies
//! a constant's elements; taking a tensor apart copies only when another holder remains.

use xpu_ir::text::parse;
use xpu_ir::{NodeId, Tensor};

const GRAPH: &str = r#"graph "t" {
  %0: f32[2,2] = input "x"
  %1: f32[2,2] = constant {value = tensor<f32[2,2]> [1.0, 2.0, 3.0, 4.0]}
  %2: f32[2,2] = matmul(%0, %1)
  %3: f32[2,2] = relu(%2)
  return "y" = %3
}"#;

fn weight(g: &xpu_ir::Graph) -> &Tensor {
    g.nodes.iter().find_map(|n| n.attrs.tensor("value")).expect("the constant")
}

#[test]
fn clones_and_partitions_share_constants() {
    let g = parse(GRAPH).unwrap();
    let copy = g.clone();
    assert!(weight(&g).shares_data_with(weight(&copy)));
    let part = g.partition(&[NodeId(1), NodeId(2)]);
    assert!(weight(&g).shares_data_with(weight(&part.graph)));
    // Equal contents parsed twice are two buffers: sharing is identity, not equality.
    let other = parse(GRAPH).unwrap();
    assert_eq!(weight(&g), weight(&other));
    assert!(!weight(&g).shares_data_with(weight(&other)));
}

#[test]
fn taking_a_tensor_apart_copies_only_when_shared() {
    let t = Tensor::from_vec(vec![3], vec![1.0f32, 2.0, 3.0]).unwrap();
    let reshaped = t.clone().reshaped(vec![1, 3]).unwrap();
    assert!(reshaped.shares_data_with(&t), "a reshape keeps the buffer");
    assert!(t.clone().reshaped(vec![2]).is_err());
    let (shape, data) = reshaped.into_parts();
    assert_eq!(shape, [1, 3]);
    assert_eq!(data, *t.data(), "a shared buffer is copied out, the original stays");
    let (_, data) = t.into_parts();
    assert_eq!(data.len(), 3);
}
