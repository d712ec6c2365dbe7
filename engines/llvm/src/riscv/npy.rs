//! The `.npy` files exchanged with a riscv64 device: written for its inputs, read back from
//! what its runtime (`runtime.c`) writes. Version 1.0, C order, little-endian; the dtypes a
//! build takes.

use xpu_ir::{DType, Tensor, TensorData};

use super::descr;

pub fn encode(t: &Tensor) -> Result<Vec<u8>, String> {
    let d = descr(t.dtype()).ok_or_else(|| format!("dtype {} has no .npy form here", t.dtype()))?;
    let dims: Vec<String> = t.shape().iter().map(|n| n.to_string()).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{d}', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend_from_slice(&t.le_bytes());
    Ok(out)
}

/// Reads a file the device wrote, which must hold `dtype` of `shape`.
pub fn decode(bytes: &[u8], dtype: DType, shape: &[usize]) -> Result<Tensor, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" || bytes[6] != 1 {
        return Err("not a version 1 .npy file".into());
    }
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = bytes.get(10..10 + hlen).ok_or("a truncated header")?;
    let header = std::str::from_utf8(header).map_err(|_| "a header that is not text")?;
    let want = descr(dtype).ok_or_else(|| format!("dtype {dtype}"))?;
    if !header.contains(&format!("'descr': '{want}'")) {
        return Err(format!("expected dtype {want}, header {header:?}"));
    }
    let n: usize = shape.iter().product();
    let payload = &bytes[10 + hlen..];
    if payload.len() != n * dtype.size_bytes() {
        return Err(format!(
            "{} bytes of data, expected {}",
            payload.len(),
            n * dtype.size_bytes()
        ));
    }
    let data = TensorData::from_le_bytes(dtype, payload)?;
    Tensor::new(shape.to_vec(), data).map_err(|e| e.to_string())
}
