//! Elementwise kernels: unary math, activations, broadcasting arithmetic, comparisons,
//! logic, bit operations, `where`, `clip`.

use ndarray::{ArrayD, IxDyn, Zip};
use xpu_ir::{Attrs, DType, Op, Tensor, TensorData};

use crate::scalar::Scalar;
use crate::util::{KResult, owned, req, tensor, view};
use crate::{any_dtype, float, numeric};

pub fn broadcast_shape(a: &[usize], b: &[usize]) -> KResult<Vec<usize>> {
    xpu_ir::infer::broadcast_shapes(a, b)
}

/// Broadcasts two tensors of element types A and B and maps pairs through `f`.
pub fn zip_map<A: xpu_ir::Element + Clone, B: xpu_ir::Element + Clone, O: Clone>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(&A, &B) -> O + Sync,
) -> KResult<ArrayD<O>> {
    let shape = broadcast_shape(a.shape(), b.shape())?;
    let av = view::<A>(a)?;
    let bv = view::<B>(b)?;
    let av = av.broadcast(IxDyn(&shape)).ok_or("broadcast failed")?;
    let bv = bv.broadcast(IxDyn(&shape)).ok_or("broadcast failed")?;
    Ok(Zip::from(&av).and(&bv).map_collect(f))
}

/// Fallible variant of [`zip_map`]: the first error wins.
fn try_zip_map<A: Scalar, O: Clone + Default>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(A, A) -> KResult<O> + Sync,
) -> KResult<ArrayD<O>> {
    let err = std::sync::Mutex::new(None);
    let out = zip_map::<A, A, O>(a, b, |&x, &y| match f(x, y) {
        Ok(v) => v,
        Err(e) => {
            err.lock().unwrap().get_or_insert(e);
            O::default()
        }
    })?;
    match err.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn unsupported(op: Op, d: DType) -> String {
    format!("{op} does not support dtype {d}")
}

/// Float-only unary ops, evaluated in the input's precision.
fn unary_float(op: Op, attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    macro_rules! go {
        ($T:ty) => {{
            let arr = view::<$T>(x)?;
            let alpha = attrs.float("alpha", f64::NAN) as $T;
            // Each op maps with its own closure, so the loop inlines and vectorises.
            let out = match op {
                Op::Exp => arr.mapv(|v: $T| v.exp()),
                Op::Log => arr.mapv(|v: $T| v.ln()),
                Op::Sqrt => arr.mapv(|v: $T| v.sqrt()),
                Op::Reciprocal => arr.mapv(|v: $T| 1.0 / v),
                Op::Sin => arr.mapv(|v: $T| v.sin()),
                Op::Cos => arr.mapv(|v: $T| v.cos()),
                Op::Tan => arr.mapv(|v: $T| v.tan()),
                Op::Asin => arr.mapv(|v: $T| v.asin()),
                Op::Acos => arr.mapv(|v: $T| v.acos()),
                Op::Atan => arr.mapv(|v: $T| v.atan()),
                Op::Sinh => arr.mapv(|v: $T| v.sinh()),
                Op::Cosh => arr.mapv(|v: $T| v.cosh()),
                Op::Asinh => arr.mapv(|v: $T| v.asinh()),
                Op::Acosh => arr.mapv(|v: $T| v.acosh()),
                Op::Atanh => arr.mapv(|v: $T| v.atanh()),
                Op::Erf => arr.mapv(|v: $T| erf(v as f64) as $T),
                Op::Tanh => arr.mapv(|v: $T| v.tanh()),
                Op::Sigmoid => arr.mapv(|v: $T| {
                    if v >= 0.0 { 1.0 / (1.0 + (-v).exp()) } else { v.exp() / (1.0 + v.exp()) }
                }),
                Op::Softplus => {
                    arr.mapv(|v: $T| if v > 0.0 { v + (-v).exp().ln_1p() } else { v.exp().ln_1p() })
                }
                Op::Softsign => arr.mapv(|v: $T| v / (1.0 + v.abs())),
                Op::Mish => arr.mapv(|v: $T| {
                    v * (if v > 0.0 { v + (-v).exp().ln_1p() } else { v.exp().ln_1p() }).tanh()
                }),
                Op::HardSwish => arr.mapv(|v: $T| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
                Op::LeakyRelu => {
                    let a = if alpha.is_nan() { 0.01 } else { alpha };
                    arr.mapv(move |v: $T| if v >= 0.0 { v } else { a * v })
                }
                Op::Elu => {
                    let a = if alpha.is_nan() { 1.0 } else { alpha };
                    arr.mapv(move |v: $T| if v >= 0.0 { v } else { a * (v.exp() - 1.0) })
                }
                Op::Celu => {
                    let a = if alpha.is_nan() { 1.0 } else { alpha };
                    arr.mapv(move |v: $T| v.max(0.0) + (a * ((v / a).exp() - 1.0)).min(0.0))
                }
                Op::Selu => {
                    let a = attrs.float("alpha", 1.673_263_192_176_818_8) as $T;
                    let g = attrs.float("gamma", 1.050_701_022_148_132_3) as $T;
                    arr.mapv(move |v: $T| if v > 0.0 { g * v } else { g * (a * v.exp() - a) })
                }
                Op::HardSigmoid => {
                    let a = if alpha.is_nan() { 0.2 } else { alpha };
                    let b = attrs.float("beta", 0.5) as $T;
                    arr.mapv(move |v: $T| (a * v + b).clamp(0.0, 1.0))
                }
                Op::ThresholdedRelu => {
                    let a = if alpha.is_nan() { 1.0 } else { alpha };
                    arr.mapv(move |v: $T| if v > a { v } else { 0.0 })
                }
                Op::Shrink => {
                    let bias = attrs.float("bias", 0.0) as $T;
                    let l = attrs.float("lambd", 0.5) as $T;
                    arr.mapv(move |v: $T| {
                        if v < -l {
                            v + bias
                        } else if v > l {
                            v - bias
                        } else {
                            0.0
                        }
                    })
                }
                Op::Gelu => {
                    if attrs.str("approximate", "none") == "tanh" {
                        arr.mapv(|v: $T| {
                            let x = v as f64;
                            (0.5 * x
                                * (1.0
                                    + ((2.0 / std::f64::consts::PI).sqrt()
                                        * (x + 0.044715 * x.powi(3)))
                                    .tanh())) as $T
                        })
                    } else {
                        arr.mapv(|v: $T| {
                            (0.5 * (v as f64) * (1.0 + erf(v as f64 / std::f64::consts::SQRT_2)))
                                as $T
                        })
                    }
                }
                Op::Swish => {
                    let a = if alpha.is_nan() { 1.0 } else { alpha };
                    arr.mapv(move |v: $T| v / (1.0 + (-a * v).exp()))
                }
                _ => return Err(format!("{op} is not a float unary op")),
            };
            Ok(tensor(out))
        }};
    }
    float!(x.dtype(), T => go!(T), Err(unsupported(op, x.dtype())))
}

/// Ops that accept ints too.
fn unary_numeric(op: Op, x: &Tensor) -> KResult<Tensor> {
    if op == Op::Identity {
        return Ok(x.clone());
    }
    numeric!(x.dtype(), T => {
        let a = view::<T>(x)?;
        Ok(tensor(match op {
            Op::Abs => a.mapv(Scalar::abs),
            Op::Neg => a.mapv(Scalar::neg),
            // NaN stays NaN, as numpy's maximum(x, 0).
            Op::Relu => a.mapv(|v| if v < T::zero() { T::zero() } else { v }),
            // NaN stays NaN (numpy's sign); ±0 gives 0.
            Op::Sign => a.mapv(|v| {
                if v > T::zero() {
                    T::one()
                } else if v < T::zero() {
                    T::one().neg()
                } else if v.is_nan() {
                    v
                } else {
                    T::zero()
                }
            }),
            Op::Floor => a.mapv(|v| T::from_f64(v.to_f64().floor())),
            Op::Ceil => a.mapv(|v| T::from_f64(v.to_f64().ceil())),
            Op::Round => a.mapv(|v| T::from_f64(v.to_f64().round_ties_even())),
            _ => return Err(format!("{op} is not a numeric unary op")),
        }))
    }, Err(unsupported(op, x.dtype())))
}

pub fn unary(op: Op, attrs: &Attrs, x: &Tensor) -> KResult<Tensor> {
    if matches!(op, Op::IsNaN | Op::IsInf) && crate::util::is_half(x.dtype()) {
        return unary(op, attrs, &crate::util::widen(x));
    }
    match op {
        Op::Identity
        | Op::Abs
        | Op::Neg
        | Op::Relu
        | Op::Sign
        | Op::Floor
        | Op::Ceil
        | Op::Round => unary_numeric(op, x),
        Op::Not => {
            let a = view::<bool>(x)?;
            Ok(tensor(a.mapv(|v| !v)))
        }
        Op::IsNaN => {
            float!(x.dtype(), T => Ok(tensor(view::<T>(x)?.mapv(|v| v.is_nan()))), Err(unsupported(op, x.dtype())))
        }
        Op::IsInf => {
            let (neg, pos) =
                (attrs.int("detect_negative", 1) != 0, attrs.int("detect_positive", 1) != 0);
            float!(x.dtype(), T => Ok(tensor(view::<T>(x)?.mapv(|v| v.is_infinite() && ((v > 0.0 && pos) || (v < 0.0 && neg))))), Err(unsupported(op, x.dtype())))
        }
        Op::BitwiseNot => bitwise_not(x),
        _ => unary_float(op, attrs, x),
    }
}

fn bitwise_not(x: &Tensor) -> KResult<Tensor> {
    macro_rules! go {
        ($($variant:ident),*) => {
            match x.data() {
                $(TensorData::$variant(v) => Tensor::new(x.shape().to_vec(), TensorData::$variant(v.iter().map(|&b| !b).collect())).map_err(|e| e.to_string()),)*
                _ => Err(unsupported(Op::BitwiseNot, x.dtype())),
            }
        };
    }
    go!(I8, I16, I32, I64, U8, U16, U32, U64)
}

pub fn binary(op: Op, attrs: &Attrs, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    if op == Op::Pow {
        return pow(a, b);
    }
    if a.dtype() != b.dtype() {
        return Err(format!("{op}: operand dtypes differ ({} and {})", a.dtype(), b.dtype()));
    }
    let fmod = attrs.int("fmod", 0) != 0;
    match op {
        Op::And | Op::Or | Op::Xor => {
            let f = match op {
                Op::And => |x: &bool, y: &bool| *x && *y,
                Op::Or => |x: &bool, y: &bool| *x || *y,
                _ => |x: &bool, y: &bool| *x != *y,
            };
            return Ok(tensor(zip_map::<bool, bool, bool>(a, b, f)?));
        }
        Op::BitShift | Op::BitwiseAnd | Op::BitwiseOr | Op::BitwiseXor => {
            return bitwise(op, attrs, a, b);
        }
        Op::Equal | Op::Less | Op::LessOrEqual | Op::Greater | Op::GreaterOrEqual => {
            return compare(op, a, b);
        }
        _ => {}
    }
    numeric!(a.dtype(), T => {
        let out = match op {
            Op::Add => zip_map::<T, T, T>(a, b, |x, y| x.add(*y))?,
            Op::Sub => zip_map::<T, T, T>(a, b, |x, y| x.sub(*y))?,
            Op::Mul => zip_map::<T, T, T>(a, b, |x, y| x.mul(*y))?,
            Op::Div => try_zip_map::<T, T>(a, b, |x, y| x.div(y))?,
            Op::Mod => try_zip_map::<T, T>(a, b, |x, y| x.rem(y, fmod))?,
            Op::Max => zip_map::<T, T, T>(a, b, |x, y| if x.is_nan() || *x >= *y { *x } else { *y })?,
            Op::Min => zip_map::<T, T, T>(a, b, |x, y| if x.is_nan() || *x <= *y { *x } else { *y })?,
            Op::Sum => zip_map::<T, T, T>(a, b, |x, y| x.add(*y))?,
            Op::PRelu => zip_map::<T, T, T>(a, b, |x, y| if *x < T::zero() { x.mul(*y) } else { *x })?,
            _ => return Err(format!("{op} is not a binary arithmetic op")),
        };
        Ok(tensor(out))
    }, Err(unsupported(op, a.dtype())))
}

fn pow(a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    let bf = crate::cast::cast(b, DType::F64)?;
    numeric!(a.dtype(), T => {
        Ok(tensor(zip_map::<T, f64, T>(a, &bf, |x, &y| {
            if T::IS_FLOAT { T::from_f64(x.to_f64().powf(y)) } else { T::from_f64((x.to_f64()).powf(y).trunc()) }
        })?))
    }, Err(unsupported(Op::Pow, a.dtype())))
}

fn compare(op: Op, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    fn cmp<T: PartialOrd + xpu_ir::Element>(op: Op, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
        let out = match op {
            Op::Equal => zip_map::<T, T, bool>(a, b, |x, y| x == y)?,
            Op::Less => zip_map::<T, T, bool>(a, b, |x, y| x < y)?,
            Op::LessOrEqual => zip_map::<T, T, bool>(a, b, |x, y| x <= y)?,
            Op::Greater => zip_map::<T, T, bool>(a, b, |x, y| x > y)?,
            _ => zip_map::<T, T, bool>(a, b, |x, y| x >= y)?,
        };
        Ok(tensor(out))
    }
    any_dtype!(a.dtype(), T => cmp::<T>(op, a, b))
}

fn bitwise(op: Op, attrs: &Attrs, a: &Tensor, b: &Tensor) -> KResult<Tensor> {
    let left = attrs.str("direction", "LEFT") == "LEFT";
    macro_rules! go {
        ($($t:ty => $variant:ident),*) => {
            match a.dtype() {
                $(DType::$variant => {
                    let bits = (std::mem::size_of::<$t>() * 8) as u32;
                    let out = zip_map::<$t, $t, $t>(a, b, |&x, &y| match op {
                        Op::BitwiseAnd => x & y,
                        Op::BitwiseOr => x | y,
                        Op::BitwiseXor => x ^ y,
                        _ => {
                            // Shift counts are taken as unsigned; counts ≥ the width shift every
                            // bit out (right shifts of signed values fill with the sign bit).
                            let s = (y as u64).min(bits as u64 - 1) as u32;
                            let all_out = (y as u64) >= bits as u64;
                            if left {
                                if all_out { 0 } else { x.wrapping_shl(s) }
                            } else if all_out {
                                x.wrapping_shr(bits - 1).wrapping_shr(1)
                            } else {
                                x.wrapping_shr(s)
                            }
                        }
                    })?;
                    Ok(tensor(out))
                })*
                d => Err(unsupported(op, d)),
            }
        };
    }
    go!(i8 => I8, i16 => I16, i32 => I32, i64 => I64, u8 => U8, u16 => U16, u32 => U32, u64 => U64)
}

/// Sum / Mean / Max / Min over any number of broadcast inputs.
pub fn variadic(op: Op, inputs: &[&Tensor]) -> KResult<Tensor> {
    let first = *inputs.first().ok_or_else(|| format!("{op} needs at least one input"))?;
    let base = if op == Op::Mean { Op::Sum } else { op };
    let mut acc = first.clone();
    for t in &inputs[1..] {
        acc = binary(base, &Attrs::new(), &acc, t)?;
    }
    if op == Op::Mean {
        let n = inputs.len() as f64;
        acc = float!(acc.dtype(), T => tensor(owned::<T>(&acc)?.mapv(|v| v / n as T)), return Err(unsupported(op, acc.dtype())));
    }
    Ok(acc)
}

pub fn where_(c: &Tensor, x: &Tensor, y: &Tensor) -> KResult<Tensor> {
    let shape = broadcast_shape(&broadcast_shape(c.shape(), x.shape())?, y.shape())?;
    let cv = view::<bool>(c)?;
    let cv = cv.broadcast(IxDyn(&shape)).ok_or("broadcast failed")?;
    any_dtype!(x.dtype(), T => {
        let xv = view::<T>(x)?;
        let yv = view::<T>(y)?;
        let xv = xv.broadcast(IxDyn(&shape)).ok_or("broadcast failed")?;
        let yv = yv.broadcast(IxDyn(&shape)).ok_or("broadcast failed")?;
        Ok(tensor(Zip::from(&cv).and(&xv).and(&yv).map_collect(|&c, a, b| if c { a.clone() } else { b.clone() })))
    })
}

pub fn clip(inputs: &[Option<&Tensor>]) -> KResult<Tensor> {
    let x = req(inputs, 0)?;
    numeric!(x.dtype(), T => {
        let lo = inputs.get(1).copied().flatten().map(|t| view::<T>(t).map(|v| v.iter().next().copied())).transpose()?.flatten();
        let hi = inputs.get(2).copied().flatten().map(|t| view::<T>(t).map(|v| v.iter().next().copied())).transpose()?.flatten();
        Ok(tensor(view::<T>(x)?.mapv(|v| {
            let v = match lo { Some(l) if v < l => l, _ => v };
            match hi { Some(h) if v > h => h, _ => v }
        })))
    }, Err(unsupported(Op::Clip, x.dtype())))
}

/// The Gauss error function.
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}
