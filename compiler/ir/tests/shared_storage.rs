//! Tensor storage is shared: cloning a graph, or cutting a partition out of it, never copies
//! a constant's elements; taking a tensor apart copies only when another holder remains.

use xpu_ir::text::parse;
use xpu_ir::{DType, NodeId, Tensor};

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

/// Elements lent by another owner (as the Python package lends a numpy array's buffer):
/// read where they lie, never written, copied only for code that matches on `data()`.
#[test]
fn lent_elements_are_read_where_they_lie() {
    let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5).collect();
    let owned = Tensor::from_vec(vec![3, 4], values.clone()).unwrap();
    let buffer = Box::new(values);
    let ptr = buffer.as_ptr().cast::<u8>();
    // SAFETY: `buffer` holds 12 aligned f32s and is moved into the tensor as its owner,
    // unchanged while it lives.
    let lent = unsafe { Tensor::lend(vec![3, 4], DType::F32, ptr, buffer) }.unwrap();
    assert!(lent.is_lent() && !owned.is_lent());
    assert_eq!(lent.as_slice::<f32>().unwrap().as_ptr().cast::<u8>(), ptr, "no copy");
    assert_eq!(lent.element_bytes().unwrap().as_ptr(), ptr);
    assert!(lent.as_slice::<f64>().is_none());
    assert_eq!((lent.dtype(), lent.shape(), lent.numel()), (DType::F32, &[3, 4][..], 12));
    assert_eq!(lent, owned);
    assert_eq!(lent.content_hash(), owned.content_hash());
    assert_eq!(serde_json::to_string(&lent).unwrap(), serde_json::to_string(&owned).unwrap());
    // A clone shares the lent storage; writing or taking it over copies instead.
    let mut clone = lent.clone();
    assert!(clone.shares_data_with(&lent) && clone.data_mut().is_none());
    let back = clone.try_into_parts().unwrap_err();
    assert!(back.shares_data_with(&lent));
    assert_eq!(lent.data(), owned.data(), "matching on data() sees a copy");
    assert_eq!(
        lent.clone().reshaped(vec![12]).unwrap().as_slice::<f32>().unwrap().as_ptr().cast(),
        ptr
    );
    assert_eq!(lent.to_f64_vec()[3], 1.5);
}

#[test]
fn lending_refuses_what_cannot_be_read_in_place() {
    let bytes: Box<[u64]> = vec![0u64; 4].into_boxed_slice();
    let base = bytes.as_ptr().cast::<u8>();
    let lend = |dtype, offset: usize| {
        // SAFETY: the 32 bytes behind `base` outlive the call (the tensor is dropped at
        // once); each case reads at most 8 elements within them.
        unsafe { Tensor::lend(vec![2], dtype, base.add(offset), Box::new(())) }
    };
    assert!(lend(DType::F32, 1).is_none(), "misaligned");
    assert!(lend(DType::Bool, 0).is_none(), "bool bytes may not be 0 or 1");
    assert!(lend(DType::String, 0).is_none());
    assert!(lend(DType::F32, 4).is_some() && lend(DType::U8, 3).is_some());
    // SAFETY: a null pointer is refused before anything is read.
    assert!(unsafe { Tensor::lend(vec![0], DType::F32, std::ptr::null(), Box::new(())) }.is_none());
    drop(bytes);
}

/// A lent tensor's owner lives exactly as long as the last tensor sharing its elements, and
/// equality is element-wise whatever the storage (NaN unequal, -0.0 equal to 0.0).
#[test]
fn lent_owner_lives_as_long_as_the_last_sharer() {
    struct Owner(Vec<f32>, std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let owner = Box::new(Owner(vec![f32::NAN, -0.0, 1.0], dropped.clone()));
    let ptr = owner.0.as_ptr().cast::<u8>();
    // SAFETY: the owner's vector (3 aligned f32s) moves with the box into the tensor and is
    // never changed.
    let lent = unsafe { Tensor::lend(vec![3], DType::F32, ptr, owner) }.unwrap();
    let clone = lent.clone().reshaped(vec![1, 3]).unwrap();
    drop(lent);
    assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst), "a clone still shares it");
    let nan_free = Tensor::from_vec(vec![1, 3], vec![f32::NAN, 0.0, 1.0]).unwrap();
    assert_ne!(clone, nan_free, "NaN is unequal to NaN, as for owned tensors");
    let (_, data) = clone.into_parts();
    assert!(dropped.load(std::sync::atomic::Ordering::SeqCst), "taken apart: the owner went");
    assert_eq!(data.len(), 3);
    let a = Tensor::from_vec(vec![2], vec![-0.0f32, 1.0]).unwrap();
    let keep = Box::new(vec![0.0f32, 1.0]);
    let p = keep.as_ptr().cast::<u8>();
    // SAFETY: `keep` moves into the tensor as its owner, unchanged.
    let b = unsafe { Tensor::lend(vec![2], DType::F32, p, keep) }.unwrap();
    assert_eq!(a, b, "-0.0 equals 0.0 element-wise");
}
