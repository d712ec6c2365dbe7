//! Cast between every pair of dtypes with numpy's `astype` semantics (ints wrap, floats
//! truncate toward zero into ints, bool is `!= 0`, strings parse and print), and to and
//! from the low-precision types as ONNX's `Cast` defines it (`xpu_ir::lowp`: 8-bit floats
//! rounded to nearest even, saturating unless `saturate = 0`; `f8e8m0` by `round_mode`;
//! 4- and 2-bit integers truncated and wrapped).

use half::{bf16, f16};
use xpu_ir::lowp::{Lowp, RoundMode};
use xpu_ir::{Attrs, DType, Tensor, TensorData};

use crate::util::KResult;

/// Source values in a lossless intermediate form.
enum Wide {
    F(Vec<f64>),
    I(Vec<i128>),
    B(Vec<bool>),
    S(Vec<String>),
}

fn widen(d: &TensorData) -> Wide {
    match d {
        TensorData::F32(v) => Wide::F(v.iter().map(|&x| x as f64).collect()),
        TensorData::F64(v) => Wide::F(v.clone()),
        TensorData::F16(v) => Wide::F(v.iter().map(|x| x.to_f64()).collect()),
        TensorData::BF16(v) => Wide::F(v.iter().map(|x| x.to_f64()).collect()),
        TensorData::I8(v) => Wide::I(v.iter().map(|&x| x as i128).collect()),
        TensorData::I16(v) => Wide::I(v.iter().map(|&x| x as i128).collect()),
        TensorData::I32(v) => Wide::I(v.iter().map(|&x| x as i128).collect()),
        TensorData::I64(v) => Wide::I(v.iter().map(|&x| x as i128).collect()),
        TensorData::U8(v) => Wide::I(v.iter().map(|&x| x as i128).collect()),
        TensorData::U16(v) => Wide::I(v.iter().map(|&x| x as i128).collect()),
        TensorData::U32(v) => Wide::I(v.iter().map(|&x| x as i128).collect()),
        TensorData::U64(v) => Wide::I(v.iter().map(|&x| x as i128).collect()),
        TensorData::Bool(v) => Wide::B(v.clone()),
        TensorData::String(v) => Wide::S(v.clone()),
        // `cast` refuses tables before widening.
        TensorData::Table(_) => Wide::S(Vec::new()),
        TensorData::Lowp(l, v) if l.is_int() => {
            Wide::I(v.iter().map(|&c| l.to_f64(c) as i128).collect())
        }
        TensorData::Lowp(l, v) => Wide::F(v.iter().map(|&c| l.to_f64(c)).collect()),
    }
}

fn float_to_int(x: f64) -> i128 {
    if x.is_nan() { i64::MIN as i128 } else { x as i128 }
}

fn parse_number(s: &str) -> KResult<f64> {
    let t = s.trim();
    t.parse::<f64>().map_err(|_| format!("cannot cast string {s:?} to a number"))
}

fn format_float(x: f64, single: bool) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "INF".into() } else { "-INF".into() };
    }
    if single { format!("{:?}", x as f32) } else { format!("{x:?}") }
}

/// A `cast` / `cast_like` node: its `saturate` (default 1) and `round_mode` (default
/// `up`) apply to the low-precision float targets.
pub fn cast_node(a: &Attrs, t: &Tensor, to: DType) -> KResult<Tensor> {
    let saturate = a.int("saturate", 1) != 0;
    let mode = a.str("round_mode", "up");
    let mode = RoundMode::parse(mode)
        .ok_or_else(|| format!("round_mode {mode:?}: expected up, down or nearest"))?;
    cast_with(t, to, saturate, mode)
}

pub fn cast(t: &Tensor, to: DType) -> KResult<Tensor> {
    cast_with(t, to, true, RoundMode::Up)
}

fn cast_with(t: &Tensor, to: DType, saturate: bool, mode: RoundMode) -> KResult<Tensor> {
    if t.dtype() == to {
        return Ok(t.clone());
    }
    if t.dtype() == DType::Table || to == DType::Table {
        return Err(format!("cannot cast {} to {to}: tables are not tensors", t.dtype()));
    }
    let src = widen(t.data());
    macro_rules! ints {
        ($ty:ty, $variant:ident) => {
            TensorData::$variant(match &src {
                Wide::F(v) => v.iter().map(|&x| float_to_int(x) as $ty).collect(),
                Wide::I(v) => v.iter().map(|&x| x as $ty).collect(),
                Wide::B(v) => v.iter().map(|&x| x as u8 as $ty).collect(),
                Wide::S(v) => v
                    .iter()
                    .map(|s| parse_number(s).map(|x| float_to_int(x) as $ty))
                    .collect::<KResult<_>>()?,
            })
        };
    }
    macro_rules! floats {
        ($ty:ty, $variant:ident, $from_f64:expr) => {
            TensorData::$variant(match &src {
                Wide::F(v) => v.iter().map(|&x| $from_f64(x)).collect(),
                Wide::I(v) => v.iter().map(|&x| $from_f64(x as f64)).collect(),
                Wide::B(v) => v.iter().map(|&x| $from_f64(x as u8 as f64)).collect(),
                Wide::S(v) => {
                    v.iter().map(|s| parse_number(s).map($from_f64)).collect::<KResult<_>>()?
                }
            })
        };
    }
    if let Some(l) = to.lowp() {
        let data = TensorData::Lowp(l, to_lowp(l, &src, t.dtype(), saturate, mode)?);
        return Tensor::new(t.shape().to_vec(), data).map_err(|e| e.to_string());
    }
    let data = match to {
        DType::Table => unreachable!("refused above"),
        DType::F32 => TensorData::F32(match &src {
            Wide::I(v) => v.iter().map(|&x| x as f32).collect(),
            Wide::F(v) => v.iter().map(|&x| x as f32).collect(),
            Wide::B(v) => v.iter().map(|&x| x as u8 as f32).collect(),
            Wide::S(v) => v
                .iter()
                .map(|s| {
                    s.trim()
                        .parse::<f32>()
                        .map_err(|_| format!("cannot cast string {s:?} to a number"))
                })
                .collect::<KResult<_>>()?,
        }),
        DType::F64 => floats!(f64, F64, |x: f64| x),
        DType::F16 => floats!(f16, F16, f16::from_f64),
        DType::BF16 => match &src {
            // bf16 from f32 data rounds once from the f32 value, as numpy/ml_dtypes do.
            Wide::F(v) if t.dtype() == DType::F32 => {
                TensorData::BF16(v.iter().map(|&x| bf16::from_f32(x as f32)).collect())
            }
            _ => floats!(bf16, BF16, bf16::from_f64),
        },
        DType::I8 => ints!(i8, I8),
        DType::I16 => ints!(i16, I16),
        DType::I32 => ints!(i32, I32),
        DType::I64 => ints!(i64, I64),
        DType::U8 => ints!(u8, U8),
        DType::U16 => ints!(u16, U16),
        DType::U32 => ints!(u32, U32),
        DType::U64 => ints!(u64, U64),
        DType::Bool => TensorData::Bool(match &src {
            Wide::F(v) => v.iter().map(|&x| x != 0.0).collect(),
            Wide::I(v) => v.iter().map(|&x| x != 0).collect(),
            Wide::B(v) => v.clone(),
            Wide::S(v) => {
                v.iter().map(|s| parse_number(s).map(|x| x != 0.0)).collect::<KResult<_>>()?
            }
        }),
        DType::String => TensorData::String(match &src {
            Wide::F(v) => v.iter().map(|&x| format_float(x, t.dtype() != DType::F64)).collect(),
            Wide::I(v) => v.iter().map(|x| x.to_string()).collect(),
            Wide::B(v) => {
                v.iter().map(|&x| if x { "True".into() } else { "False".into() }).collect()
            }
            Wide::S(v) => v.clone(),
        }),
        d => unreachable!("cast to {d} (low precision) returned above"),
    };
    Tensor::new(t.shape().to_vec(), data).map_err(|e| e.to_string())
}

/// The source's elements as codes of `l`. Floats are rounded from their f32 value (f16 and
/// bf16 widen exactly; f64 rounds once to f32 first, as ONNX's reference does).
fn to_lowp(l: Lowp, src: &Wide, from: DType, saturate: bool, mode: RoundMode) -> KResult<Vec<u8>> {
    Ok(match src {
        // Integers truncate the value itself (an f64 rounded to f32 first could cross a
        // whole number); floats round once from f32, as ONNX's reference does.
        Wide::F(v) => match l.sub_byte() {
            Some(i) => v.iter().map(|&x| i.from_f64(x)).collect(),
            None => v.iter().map(|&x| l.from_f32(x as f32, saturate, mode)).collect(),
        },
        // A low-precision float source is Wide::F above; integers (sub-byte ones too) wrap.
        Wide::I(v) => v.iter().map(|&x| l.from_i128(x, saturate, mode)).collect(),
        Wide::B(v) => v.iter().map(|&x| l.from_i128(i128::from(x), saturate, mode)).collect(),
        Wide::S(v) => v
            .iter()
            .map(|s| parse_number(s).map(|x| l.from_f32(x as f32, saturate, mode)))
            .collect::<KResult<_>>()
            .map_err(|e| format!("cast from {from}: {e}"))?,
    })
}

/// `bit_cast`: each element's bits read as `to` (inference checked the widths agree).
pub fn bit_cast(t: &Tensor, to: DType) -> KResult<Tensor> {
    let data = TensorData::from_le_bytes(to, &t.data().to_le_bytes())?;
    if data.len() != t.numel() {
        return Err(format!("cannot reinterpret {} as {to}: not the same width", t.dtype()));
    }
    Tensor::new(t.shape().to_vec(), data).map_err(|e| e.to_string())
}
