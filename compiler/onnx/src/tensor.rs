//! TensorProto <-> Tensor and ONNX element types <-> DType.

use half::{bf16, f16};
use prost::Message;
use xpu_ir::lowp::Lowp;
use xpu_ir::{DType, Tensor, TensorData};

use crate::proto::{TensorProto, tensor_proto::DataType};
use crate::{OnnxError, invalid};

/// The DType of an ONNX element type code, or `None` for types SGR-ML lacks.
pub fn dtype_from_onnx(code: i32) -> Option<DType> {
    Some(match DataType::try_from(code).ok()? {
        DataType::Float => DType::F32,
        DataType::Double => DType::F64,
        DataType::Float16 => DType::F16,
        DataType::Bfloat16 => DType::BF16,
        DataType::Int8 => DType::I8,
        DataType::Int16 => DType::I16,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Uint8 => DType::U8,
        DataType::Uint16 => DType::U16,
        DataType::Uint32 => DType::U32,
        DataType::Uint64 => DType::U64,
        DataType::Bool => DType::Bool,
        DataType::String => DType::String,
        DataType::Float8e4m3fn => DType::F8E4M3FN,
        DataType::Float8e4m3fnuz => DType::F8E4M3FNUZ,
        DataType::Float8e5m2 => DType::F8E5M2,
        DataType::Float8e5m2fnuz => DType::F8E5M2FNUZ,
        DataType::Float8e8m0 => DType::F8E8M0,
        DataType::Float4e2m1 => DType::F4E2M1,
        DataType::Int4 => DType::I4,
        DataType::Uint4 => DType::U4,
        DataType::Int2 => DType::I2,
        DataType::Uint2 => DType::U2,
        _ => return None,
    })
}

pub fn dtype_to_onnx(d: DType) -> i32 {
    (match d {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I8 => DataType::Int8,
        DType::I16 => DataType::Int16,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::U8 => DataType::Uint8,
        DType::U16 => DataType::Uint16,
        DType::U32 => DataType::Uint32,
        DType::U64 => DataType::Uint64,
        DType::Bool => DataType::Bool,
        DType::String => DataType::String,
        // Tables have no ONNX element type; graphs with table ops are not exported.
        DType::Table => DataType::Undefined,
        DType::F8E4M3FN => DataType::Float8e4m3fn,
        DType::F8E4M3FNUZ => DataType::Float8e4m3fnuz,
        DType::F8E5M2 => DataType::Float8e5m2,
        DType::F8E5M2FNUZ => DataType::Float8e5m2fnuz,
        DType::F8E8M0 => DataType::Float8e8m0,
        DType::F4E2M1 => DataType::Float4e2m1,
        DType::I4 => DataType::Int4,
        DType::U4 => DataType::Uint4,
        DType::I2 => DataType::Int2,
        DType::U2 => DataType::Uint2,
    }) as i32
}

/// ONNX's name of an element type code (`FLOAT8E4M3FN`, …) for error messages.
pub fn onnx_type_name(code: i32) -> String {
    match DataType::try_from(code) {
        Ok(d) => d.as_str_name().to_string(),
        Err(_) => format!("type code {code}"),
    }
}

/// Decodes a serialized TensorProto (`.pb` input files) into a tensor and its name.
pub fn read_tensor_proto(bytes: &[u8]) -> Result<(Option<String>, Tensor), OnnxError> {
    let p = TensorProto::decode(bytes)?;
    let t = tensor_from_proto(&p, "tensor")?;
    Ok((p.name.clone().filter(|n| !n.is_empty()), t))
}

/// Converts a TensorProto (raw_data or typed fields) into a tensor.
pub fn tensor_from_proto(p: &TensorProto, context: &str) -> Result<Tensor, OnnxError> {
    let code = p.data_type.unwrap_or(0);
    let dtype = dtype_from_onnx(code).ok_or_else(|| OnnxError::UnsupportedDType {
        context: context.to_string(),
        name: onnx_type_name(code),
    })?;
    if !p.external_data.is_empty() || p.data_location == Some(1) {
        return Err(invalid(context, "tensors stored in external files are not supported"));
    }
    let mut shape = Vec::with_capacity(p.dims.len());
    for &d in &p.dims {
        shape.push(usize::try_from(d).map_err(|_| invalid(context, format!("negative dim {d}")))?);
    }
    let n = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| invalid(context, "element count overflows"))?;
    let data = if let Some(l) = dtype.lowp() {
        // Packed where narrower than a byte: raw bytes, or int32_data entries holding one
        // byte's worth each (ONNX's TensorProto rules).
        let bytes: Vec<u8> = match p.raw_data.as_ref() {
            Some(raw) => raw.clone(),
            None => p.int32_data.iter().map(|&x| x as u8).collect(),
        };
        TensorData::Lowp(l, unpack(l, &bytes, n).map_err(|e| invalid(context, e))?)
    } else if let Some(raw) = p.raw_data.as_ref().filter(|_| dtype != DType::String) {
        TensorData::from_le_bytes(dtype, raw).map_err(|e| invalid(context, e))?
    } else {
        let ints = |what: &str| -> Result<&Vec<i32>, OnnxError> {
            if p.int32_data.len() == n {
                Ok(&p.int32_data)
            } else {
                Err(invalid(
                    context,
                    format!("{what} data has {} values, shape needs {n}", p.int32_data.len()),
                ))
            }
        };
        match dtype {
            DType::F32 => TensorData::F32(p.float_data.clone()),
            DType::F64 => TensorData::F64(p.double_data.clone()),
            DType::I64 => TensorData::I64(p.int64_data.clone()),
            DType::U64 => TensorData::U64(p.uint64_data.clone()),
            DType::U32 => TensorData::U32(p.uint64_data.iter().map(|&x| x as u32).collect()),
            DType::I32 => TensorData::I32(p.int32_data.clone()),
            DType::I16 => TensorData::I16(ints("int16")?.iter().map(|&x| x as i16).collect()),
            DType::I8 => TensorData::I8(ints("int8")?.iter().map(|&x| x as i8).collect()),
            DType::U16 => TensorData::U16(ints("uint16")?.iter().map(|&x| x as u16).collect()),
            DType::U8 => TensorData::U8(ints("uint8")?.iter().map(|&x| x as u8).collect()),
            DType::Bool => TensorData::Bool(ints("bool")?.iter().map(|&x| x != 0).collect()),
            DType::F16 => TensorData::F16(
                ints("float16")?.iter().map(|&x| f16::from_bits(x as u16)).collect(),
            ),
            DType::BF16 => TensorData::BF16(
                ints("bfloat16")?.iter().map(|&x| bf16::from_bits(x as u16)).collect(),
            ),
            DType::String => TensorData::String(
                p.string_data.iter().map(|s| String::from_utf8_lossy(s).into_owned()).collect(),
            ),
            DType::Table => return Err(invalid(context, "tables have no ONNX form")),
            _ => unreachable!("low-precision types are read above"),
        }
    };
    Tensor::new(shape, data).map_err(|e| invalid(context, e.to_string()))
}

/// Converts a tensor into a TensorProto (raw little-endian data; strings in string_data).
pub fn tensor_to_proto(t: &Tensor, name: &str) -> TensorProto {
    let mut p = TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(dtype_to_onnx(t.dtype())),
        name: Some(name.to_string()),
        ..Default::default()
    };
    match t.data() {
        TensorData::String(v) => p.string_data = v.iter().map(|s| s.as_bytes().to_vec()).collect(),
        TensorData::Lowp(l, codes) => p.raw_data = Some(pack(*l, codes)),
        d => p.raw_data = Some(d.to_le_bytes()),
    }
    p
}

/// `n` elements of `l` from ONNX's packed bytes: 8-bit types one a byte, 4-bit two (low
/// nibble first), 2-bit four (lowest bits first).
fn unpack(l: Lowp, bytes: &[u8], n: usize) -> Result<Vec<u8>, String> {
    let per_byte = (8 / l.bits()) as usize;
    let need = n.div_ceil(per_byte);
    if bytes.len() != need {
        return Err(format!(
            "{} elements of {} take {need} bytes, found {}",
            n,
            l.dtype(),
            bytes.len()
        ));
    }
    let mask = ((1u16 << l.bits()) - 1) as u8;
    Ok((0..n).map(|i| (bytes[i / per_byte] >> ((i % per_byte) as u32 * l.bits())) & mask).collect())
}

/// The inverse of [`unpack`].
fn pack(l: Lowp, codes: &[u8]) -> Vec<u8> {
    let per_byte = (8 / l.bits()) as usize;
    let mask = ((1u16 << l.bits()) - 1) as u8;
    let mut out = vec![0u8; codes.len().div_ceil(per_byte)];
    for (i, &c) in codes.iter().enumerate() {
        out[i / per_byte] |= (c & mask) << ((i % per_byte) as u32 * l.bits());
    }
    out
}
