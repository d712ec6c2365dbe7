//! Low-precision element types: the 8-bit floats (`f8e4m3fn`, `f8e4m3fnuz`, `f8e5m2`,
//! `f8e5m2fnuz`, `f8e8m0`), the 4-bit float `f4e2m1` and the sub-byte integers (`i4`, `u4`,
//! `i2`, `u2`), each held one element per byte, and their conversions from and to `f32`
//! exactly as ONNX defines them: round to nearest even, with or without saturation
//! (`Cast`'s `saturate`), and for `f8e8m0` the rounding mode `Cast` names. Tested bit for
//! bit against `ml_dtypes` and ONNX's reference (`python/tests`, `tests/conformance`).

/// How a minifloat spends its top codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Special {
    /// IEEE-like: the top exponent holds ±inf (mantissa 0) and NaNs (`f8e5m2`).
    Ieee,
    /// No infinities; the all-ones code (either sign) is NaN (`f8e4m3fn`).
    FiniteNan,
    /// No infinities, no negative zero; `0x80` is the only NaN (`…fnuz`).
    UnsignedZero,
    /// Every code is a number (`f4e2m1`): NaN and infinities cannot be held.
    AllFinite,
}

/// A sign-exponent-mantissa float of at most 8 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Minifloat {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    special: Special,
}

pub const F8E4M3FN: Minifloat =
    Minifloat { exp_bits: 4, man_bits: 3, bias: 7, special: Special::FiniteNan };
pub const F8E4M3FNUZ: Minifloat =
    Minifloat { exp_bits: 4, man_bits: 3, bias: 8, special: Special::UnsignedZero };
pub const F8E5M2: Minifloat =
    Minifloat { exp_bits: 5, man_bits: 2, bias: 15, special: Special::Ieee };
pub const F8E5M2FNUZ: Minifloat =
    Minifloat { exp_bits: 5, man_bits: 2, bias: 16, special: Special::UnsignedZero };
pub const F4E2M1: Minifloat =
    Minifloat { exp_bits: 2, man_bits: 1, bias: 1, special: Special::AllFinite };

impl Minifloat {
    fn width(self) -> u32 {
        1 + self.exp_bits + self.man_bits
    }

    fn sign_bit(self) -> u8 {
        1 << (self.width() - 1)
    }

    /// The code of the largest finite magnitude.
    fn max_code(self) -> u8 {
        let all = (1u8 << (self.width() - 1)) - 1; // every bit but the sign
        match self.special {
            // The top exponent is inf/NaN: the largest finite has the exponent below it.
            Special::Ieee => all - (1 << self.man_bits),
            Special::FiniteNan => all - 1,
            Special::UnsignedZero | Special::AllFinite => all,
        }
    }

    fn nan(self, negative: bool) -> u8 {
        match self.special {
            Special::Ieee => 0x7e | if negative { 0x80 } else { 0 },
            Special::FiniteNan => 0x7f | if negative { 0x80 } else { 0 },
            Special::UnsignedZero => 0x80,
            // Cannot be held: ml_dtypes writes a NaN as a zero of the other sign.
            Special::AllFinite => {
                if negative {
                    0
                } else {
                    self.sign_bit()
                }
            }
        }
    }

    /// The value of `code`.
    pub fn decode(self, code: u8) -> f32 {
        let code = code & ((1u16 << self.width()) - 1) as u8;
        let negative = code & self.sign_bit() != 0;
        let magnitude = code & !self.sign_bit();
        let exp_field = u32::from(magnitude >> self.man_bits);
        let man = u32::from(magnitude) & ((1 << self.man_bits) - 1);
        let top = (1 << self.exp_bits) - 1;
        match self.special {
            Special::Ieee if exp_field == top => {
                let v = if man == 0 { f32::INFINITY } else { f32::NAN };
                return if negative { -v } else { v };
            }
            // As ml_dtypes decodes them: the NaN keeps its code's sign; fnuz's one NaN
            // (the negative-zero pattern) is negative.
            Special::FiniteNan if magnitude == (1 << (self.width() - 1)) - 1 => {
                return if negative { -f32::NAN } else { f32::NAN };
            }
            Special::UnsignedZero if code == 0x80 => return -f32::NAN,
            _ => {}
        }
        let value = if exp_field == 0 {
            man as f32 * (2f32).powi(1 - self.bias - self.man_bits as i32)
        } else {
            (1.0 + man as f32 / (1 << self.man_bits) as f32)
                * (2f32).powi(exp_field as i32 - self.bias)
        };
        if negative { -value } else { value }
    }

    /// `x` rounded to nearest even. Out of range: the largest finite value of the sign when
    /// `saturate`, else infinity (`f8e5m2`) or NaN. Infinities saturate the same way.
    pub fn encode(self, x: f32, saturate: bool) -> u8 {
        let negative = x.is_sign_negative();
        if x.is_nan() {
            return self.nan(negative);
        }
        let sign = if negative { self.sign_bit() } else { 0 };
        let overflow = || {
            if saturate || self.special == Special::AllFinite {
                self.max_code() | sign
            } else if self.special == Special::Ieee {
                // Infinity: the top exponent, mantissa 0.
                (((1u8 << self.exp_bits) - 1) << self.man_bits) | sign
            } else {
                self.nan(negative)
            }
        };
        if x.is_infinite() {
            return overflow();
        }
        let a = f64::from(x.abs());
        let man_bits = self.man_bits as i32;
        let emin = 1 - self.bias;
        let code = if a < (2f64).powi(emin) {
            // Subnormal: a whole number of the smallest steps (2^emin may round up into it).
            round_half_even(a / (2f64).powi(emin - man_bits)) as u32
        } else {
            let (_, mut e) = frexp(a);
            e -= 1; // a = m · 2^e with m in [1, 2)
            let mut k = round_half_even(a / (2f64).powi(e - man_bits)) as u32;
            if k == 1 << (man_bits + 1) {
                e += 1;
                k = 1 << man_bits;
            }
            let exp_field = (e + self.bias) as u32;
            if exp_field >= 1 << self.exp_bits {
                return overflow();
            }
            (exp_field << man_bits) | (k - (1 << man_bits))
        };
        if code > u32::from(self.max_code()) {
            return overflow();
        }
        let code = code as u8;
        if code == 0 && self.special == Special::UnsignedZero {
            return 0;
        }
        code | sign
    }
}

fn round_half_even(v: f64) -> f64 {
    let r = v.round();
    if (r - v).abs() == 0.5 { 2.0 * (v / 2.0).round() } else { r }
}

/// (m, e) with v = m · 2^e and m in [0.5, 1), for finite v > 0.
fn frexp(v: f64) -> (f64, i32) {
    let bits = v.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        // Subnormal f64: scale into the normal range first.
        let (m, e) = frexp(v * (2f64).powi(64));
        return (m, e - 64);
    }
    let m = f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52));
    (m, exp - 1022)
}

/// `f8e8m0`'s rounding of a value's fraction (ONNX `Cast.round_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundMode {
    Up,
    Down,
    Nearest,
}

impl RoundMode {
    pub fn parse(s: &str) -> Option<RoundMode> {
        match s {
            "up" => Some(RoundMode::Up),
            "down" => Some(RoundMode::Down),
            "nearest" => Some(RoundMode::Nearest),
            _ => None,
        }
    }
}

/// `x` as `f8e8m0` (a power of two, 2^(code − 127); 0xff is NaN): its exponent, rounded by
/// `mode`, as ONNX's reference does; the sign is dropped; NaN and infinities are 0xff;
/// with `saturate`, no rounding past 2^127.
pub fn e8m0_encode(x: f32, saturate: bool, mode: RoundMode) -> u8 {
    let bits = x.to_bits();
    let exponent = (bits >> 23) & 0xff;
    if exponent == 0xff {
        return 0xff;
    }
    let up = match mode {
        RoundMode::Down => false,
        RoundMode::Up => bits & 0x7f_ffff != 0,
        RoundMode::Nearest => {
            let guard = bits & 0x40_0000 != 0;
            let rest = bits & 0x3f_ffff != 0;
            guard && (rest || exponent > 0)
        }
    };
    let up = up && !(saturate && exponent == 0xfe);
    (exponent + u32::from(up)) as u8
}

pub fn e8m0_decode(code: u8) -> f32 {
    if code == 0xff { f32::NAN } else { (2f32).powi(i32::from(code) - 127) }
}

/// A sub-byte integer type: its width and whether it is signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubByte {
    pub bits: u32,
    pub signed: bool,
}

pub const I4: SubByte = SubByte { bits: 4, signed: true };
pub const U4: SubByte = SubByte { bits: 4, signed: false };
pub const I2: SubByte = SubByte { bits: 2, signed: true };
pub const U2: SubByte = SubByte { bits: 2, signed: false };

impl SubByte {
    /// `v` wrapped to the type's width (as C's conversion to a narrower integer does),
    /// held in the low bits of a byte.
    pub fn wrap(self, v: i64) -> u8 {
        (v & ((1 << self.bits) - 1)) as u8
    }

    /// A float truncated toward zero and wrapped (NaN and infinities: 0), as `ml_dtypes`
    /// converts and ONNX's `Cast` does.
    pub fn from_f64(self, v: f64) -> u8 {
        if !v.is_finite() {
            return 0;
        }
        let t = v.trunc();
        // Beyond i64, only the low bits matter and they are 0 for such a float.
        if t.abs() >= 9.2e18 { 0 } else { self.wrap(t as i64) }
    }

    /// The value held in the low bits of `code`.
    pub fn value(self, code: u8) -> i64 {
        let v = i64::from(code & ((1 << self.bits) - 1) as u8);
        if self.signed && v >= 1 << (self.bits - 1) { v - (1 << self.bits) } else { v }
    }

    /// The smallest and largest values.
    pub fn range(self) -> (i64, i64) {
        if self.signed {
            (-(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1)
        } else {
            (0, (1 << self.bits) - 1)
        }
    }
}

/// The low-precision element types, whose elements a tensor holds one per byte
/// ([`crate::TensorData::Lowp`]). Only casts, quantization and movement ops take them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lowp {
    F8E4M3FN,
    F8E4M3FNUZ,
    F8E5M2,
    F8E5M2FNUZ,
    F8E8M0,
    F4E2M1,
    I4,
    U4,
    I2,
    U2,
}

impl Lowp {
    pub const ALL: [Lowp; 10] = [
        Lowp::F8E4M3FN,
        Lowp::F8E4M3FNUZ,
        Lowp::F8E5M2,
        Lowp::F8E5M2FNUZ,
        Lowp::F8E8M0,
        Lowp::F4E2M1,
        Lowp::I4,
        Lowp::U4,
        Lowp::I2,
        Lowp::U2,
    ];

    /// Bits an element takes where it is stored packed (ONNX's `raw_data`).
    pub fn bits(self) -> u32 {
        match self {
            Lowp::F4E2M1 | Lowp::I4 | Lowp::U4 => 4,
            Lowp::I2 | Lowp::U2 => 2,
            _ => 8,
        }
    }

    fn minifloat(self) -> Option<Minifloat> {
        Some(match self {
            Lowp::F8E4M3FN => F8E4M3FN,
            Lowp::F8E4M3FNUZ => F8E4M3FNUZ,
            Lowp::F8E5M2 => F8E5M2,
            Lowp::F8E5M2FNUZ => F8E5M2FNUZ,
            Lowp::F4E2M1 => F4E2M1,
            _ => return None,
        })
    }

    /// The sub-byte integer type, for `i4`, `u4`, `i2`, `u2`.
    pub fn sub_byte(self) -> Option<SubByte> {
        Some(match self {
            Lowp::I4 => I4,
            Lowp::U4 => U4,
            Lowp::I2 => I2,
            Lowp::U2 => U2,
            _ => return None,
        })
    }

    pub fn is_int(self) -> bool {
        self.sub_byte().is_some()
    }

    pub fn dtype(self) -> crate::DType {
        use crate::DType;
        match self {
            Lowp::F8E4M3FN => DType::F8E4M3FN,
            Lowp::F8E4M3FNUZ => DType::F8E4M3FNUZ,
            Lowp::F8E5M2 => DType::F8E5M2,
            Lowp::F8E5M2FNUZ => DType::F8E5M2FNUZ,
            Lowp::F8E8M0 => DType::F8E8M0,
            Lowp::F4E2M1 => DType::F4E2M1,
            Lowp::I4 => DType::I4,
            Lowp::U4 => DType::U4,
            Lowp::I2 => DType::I2,
            Lowp::U2 => DType::U2,
        }
    }

    /// The value of an element (NaN for a NaN code; integers exactly).
    pub fn to_f64(self, code: u8) -> f64 {
        match (self.minifloat(), self.sub_byte()) {
            (Some(f), _) => f64::from(f.decode(code)),
            (_, Some(i)) => i.value(code) as f64,
            _ => f64::from(e8m0_decode(code)),
        }
    }

    /// A float as an element: ONNX `Cast` from a float type (`saturate` for the 8-bit
    /// floats, `mode` for `f8e8m0`; integers truncate and wrap).
    pub fn from_f32(self, x: f32, saturate: bool, mode: RoundMode) -> u8 {
        match (self.minifloat(), self.sub_byte()) {
            (Some(f), _) => f.encode(x, saturate),
            (_, Some(i)) => i.from_f64(f64::from(x)),
            _ => e8m0_encode(x, saturate, mode),
        }
    }

    /// An integer as an element: integers wrap; floats round from the integer's f32 value.
    pub fn from_i128(self, v: i128, saturate: bool, mode: RoundMode) -> u8 {
        match self.sub_byte() {
            Some(i) => i.wrap(v as i64),
            None => self.from_f32(v as f32, saturate, mode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_f32() {
        for fmt in [F8E4M3FN, F8E4M3FNUZ, F8E5M2, F8E5M2FNUZ, F4E2M1] {
            for code in 0..(1u16 << fmt.width()) {
                let code = code as u8;
                let v = fmt.decode(code);
                if v.is_nan() {
                    continue;
                }
                let back = fmt.encode(v, false);
                // fnuz has one zero: -0 is not a code.
                assert_eq!(
                    fmt.decode(back).to_bits(),
                    v.to_bits(),
                    "{fmt:?} code {code:#x} value {v}"
                );
            }
        }
    }

    #[test]
    fn the_largest_values_and_overflow() {
        assert_eq!(F8E4M3FN.decode(F8E4M3FN.max_code()), 448.0);
        assert_eq!(F8E4M3FNUZ.decode(F8E4M3FNUZ.max_code()), 240.0);
        assert_eq!(F8E5M2.decode(F8E5M2.max_code()), 57344.0);
        assert_eq!(F8E5M2FNUZ.decode(F8E5M2FNUZ.max_code()), 57344.0);
        assert_eq!(F4E2M1.decode(F4E2M1.max_code()), 6.0);
        // 464 is halfway between 448 and 480 (not a number in e4m3fn): even is 448.
        assert_eq!(F8E4M3FN.encode(464.0, false), 0x7e);
        assert!(F8E4M3FN.decode(F8E4M3FN.encode(470.0, false)).is_nan());
        assert_eq!(F8E4M3FN.encode(470.0, true), 0x7e);
        assert_eq!(F8E5M2.encode(1e6, false), 0x7c);
        assert_eq!(F8E5M2.encode(-f32::INFINITY, true), 0xfb);
        assert_eq!(F8E4M3FNUZ.encode(-0.0, false), 0);
        assert_eq!(F4E2M1.encode(100.0, false), 0x7);
    }

    #[test]
    fn sub_byte_integers_wrap_and_truncate() {
        assert_eq!(I4.value(I4.from_f64(-9.2)), 7);
        assert_eq!(U4.value(U4.from_f64(300.0)), 12);
        assert_eq!(I2.value(I2.from_f64(2.5)), -2);
        assert_eq!(I4.value(I4.from_f64(f64::NAN)), 0);
        assert_eq!(I4.range(), (-8, 7));
    }

    #[test]
    fn e8m0_rounds_as_onnx_does() {
        assert_eq!(e8m0_encode(0.3, true, RoundMode::Up), 126);
        assert_eq!(e8m0_encode(1.0, true, RoundMode::Up), 127);
        assert_eq!(e8m0_encode(3.0, true, RoundMode::Up), 129);
        assert_eq!(e8m0_encode(0.0, true, RoundMode::Up), 0);
        assert_eq!(e8m0_encode(f32::NAN, true, RoundMode::Up), 255);
        assert_eq!(e8m0_decode(127), 1.0);
    }
}
