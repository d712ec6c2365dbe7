//! `unique`: the distinct elements of a tensor, or its distinct slices along an axis, with
//! the index of each one's first occurrence, every element's (slice's) index into them and
//! their counts — numpy's `unique` (ONNX `Unique`), sorted or in order of first occurrence.

use std::cmp::Ordering;
use std::collections::HashMap;

use xpu_ir::{Attrs, DType, Tensor, TensorData};

use crate::util::{KResult, norm_axis};

/// One element as a key: integers exactly, floats by value (−0 equal to 0, every NaN one
/// value, as numpy's `unique` treats them), strings by text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    Int(i128),
    Float(u64),
    Text(String),
}

impl Key {
    fn of(data: &TensorData, i: usize) -> Key {
        match data {
            TensorData::String(v) => Key::Text(v[i].clone()),
            TensorData::I8(v) => Key::Int(v[i].into()),
            TensorData::I16(v) => Key::Int(v[i].into()),
            TensorData::I32(v) => Key::Int(v[i].into()),
            TensorData::I64(v) => Key::Int(v[i].into()),
            TensorData::U8(v) => Key::Int(v[i].into()),
            TensorData::U16(v) => Key::Int(v[i].into()),
            TensorData::U32(v) => Key::Int(v[i].into()),
            TensorData::U64(v) => Key::Int(v[i].into()),
            TensorData::Bool(v) => Key::Int(v[i].into()),
            d => {
                let x = d.get_f64(i);
                Key::Float(if x == 0.0 {
                    0
                } else if x.is_nan() {
                    f64::NAN.to_bits()
                } else {
                    x.to_bits()
                })
            }
        }
    }

    fn cmp(&self, other: &Key) -> Ordering {
        match (self, other) {
            (Key::Int(a), Key::Int(b)) => a.cmp(b),
            (Key::Float(a), Key::Float(b)) => f64::from_bits(*a).total_cmp(&f64::from_bits(*b)),
            (Key::Text(a), Key::Text(b)) => a.cmp(b),
            // One tensor holds one kind of key.
            _ => Ordering::Equal,
        }
    }
}

pub fn unique(attrs: &Attrs, x: &Tensor, n_outputs: usize) -> KResult<Vec<Tensor>> {
    if x.dtype() == DType::Table || x.dtype().is_low_precision() {
        return Err(format!("unique does not take {} values", x.dtype()));
    }
    let sorted = attrs.int("sorted", 1) != 0;
    let (x, axis) = match attrs.opt_int("axis") {
        Some(a) => (x.clone(), norm_axis(a, x.rank())?),
        None => (x.clone().reshaped(vec![x.numel()]).map_err(|e| e.to_string())?, 0),
    };
    let n = x.shape()[axis];
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    // Slice i along the axis, element by element in row-major order.
    let slice = |i: usize| -> Vec<Key> {
        (0..outer)
            .flat_map(|o| (0..inner).map(move |k| (o * n + i) * inner + k))
            .map(|flat| Key::of(x.data(), flat))
            .collect()
    };
    let mut ids: HashMap<Vec<Key>, usize> = HashMap::new();
    let mut distinct: Vec<(Vec<Key>, usize)> = Vec::new(); // (slice, first index)
    let mut inverse = Vec::with_capacity(n);
    let mut counts: Vec<i64> = Vec::new();
    for i in 0..n {
        let key = slice(i);
        let id = *ids.entry(key.clone()).or_insert_with(|| {
            distinct.push((key, i));
            counts.push(0);
            distinct.len() - 1
        });
        counts[id] += 1;
        inverse.push(id);
    }
    // Sorted: slices compared element by element; ids renumbered in that order.
    let mut order: Vec<usize> = (0..distinct.len()).collect();
    if sorted {
        order.sort_by(|&a, &b| {
            let (ka, kb) = (&distinct[a].0, &distinct[b].0);
            ka.iter().zip(kb).map(|(p, q)| p.cmp(q)).find(|o| o.is_ne()).unwrap_or(Ordering::Equal)
        });
    }
    let mut rank = vec![0; order.len()];
    for (r, &id) in order.iter().enumerate() {
        rank[id] = r;
    }
    let first: Vec<i64> = order.iter().map(|&id| distinct[id].1 as i64).collect();
    let index = Tensor::from_vec(vec![first.len()], first.clone()).map_err(|e| e.to_string())?;
    let y = crate::gather::gather(
        &Attrs::new().with("axis", xpu_ir::Attr::Int(axis as i64)),
        &x,
        &index,
    )?;
    let inverse: Vec<i64> = inverse.iter().map(|&id| rank[id] as i64).collect();
    let counts: Vec<i64> = order.iter().map(|&id| counts[id]).collect();
    let vector = |v: Vec<i64>| Tensor::from_vec(vec![v.len()], v).map_err(|e| e.to_string());
    let all = [Ok(y), Ok(index), vector(inverse), vector(counts)];
    all.into_iter().take(n_outputs).collect()
}
