//! The numeric element trait kernels are generic over.

use num_traits::{Bounded, NumCast, ToPrimitive};

/// Arithmetic every numeric dtype (ints and f32/f64) supports, with ONNX's rules.
pub trait Scalar:
    Copy
    + PartialOrd
    + Send
    + Sync
    + NumCast
    + ToPrimitive
    + Bounded
    + std::fmt::Debug
    + xpu_ir::Element
    + 'static
{
    const IS_FLOAT: bool;
    fn zero() -> Self;
    fn one() -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// Integer division truncates; division by zero is an error for ints.
    fn div(self, o: Self) -> Result<Self, String>;
    /// Remainder with the divisor's sign (`fmod = false`) or the dividend's (`fmod = true`).
    fn rem(self, o: Self, fmod: bool) -> Result<Self, String>;
    fn neg(self) -> Self;
    fn abs(self) -> Self;
    fn to_f64(self) -> f64;
    /// Converts with C-like semantics for out-of-range values (wrap for ints, saturate
    /// float→int the way numpy's `astype` does on x86: via i64).
    fn from_f64(v: f64) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const IS_FLOAT: bool = false;
            fn zero() -> Self { 0 }
            fn one() -> Self { 1 }
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn sub(self, o: Self) -> Self { self.wrapping_sub(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn div(self, o: Self) -> Result<Self, String> {
                if o == 0 { Err("integer division by zero".into()) } else { Ok(self.wrapping_div(o)) }
            }
            fn rem(self, o: Self, fmod: bool) -> Result<Self, String> {
                if o == 0 { return Err("integer modulo by zero".into()); }
                let r = self.wrapping_rem(o);
                #[allow(unused_comparisons)]
                let differ = (r < 0) != (o < 0);
                Ok(if !fmod && r != 0 && differ { r.wrapping_add(o) } else { r })
            }
            #[allow(clippy::unnecessary_cast)]
            fn neg(self) -> Self { (0 as $t).wrapping_sub(self) }
            #[allow(unused_comparisons)]
            fn abs(self) -> Self { if self < 0 { self.neg() } else { self } }
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self {
                if v.is_nan() { 0 } else { (v as i128) as $t }
            }
            fn is_nan(self) -> bool { false }
        }
    )*};
}
int_scalar!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            const IS_FLOAT: bool = true;
            fn zero() -> Self { 0.0 }
            fn one() -> Self { 1.0 }
            fn add(self, o: Self) -> Self { self + o }
            fn sub(self, o: Self) -> Self { self - o }
            fn mul(self, o: Self) -> Self { self * o }
            fn div(self, o: Self) -> Result<Self, String> { Ok(self / o) }
            fn rem(self, o: Self, fmod: bool) -> Result<Self, String> {
                let r = self % o;
                Ok(if !fmod && r != 0.0 && (r < 0.0) != (o < 0.0) { r + o } else { r })
            }
            fn neg(self) -> Self { -self }
            fn abs(self) -> Self { <$t>::abs(self) }
            fn to_f64(self) -> f64 { self as f64 }
            fn from_f64(v: f64) -> Self { v as $t }
            fn is_nan(self) -> bool { <$t>::is_nan(self) }
        }
    )*};
}
float_scalar!(f32, f64);
