//! The `table.native` group-by: `group_by(...) |> agg(...)` over row-aligned numeric columns
//! (a plainly numeric CSV file scanned by [`crate::native::scan_csv`]), computed in Rust with
//! the answers of the DuckDB statement it replaces and of pandas' `groupby().agg()`: rows
//! whose key is missing dropped, groups sorted by key, missing values skipped, sums that
//! start from zero, the sample variance, integer columns kept integer. Each group's sum is
//! compensated (Neumaier) and its variance taken from the deviations from its mean (two
//! passes), so a group of a million values sums as exactly as pandas' Kahan sum.
//!
//! [`group_agg`] declines — the caller runs DuckDB's statement instead, and says why — where
//! its `f64` cells cannot carry the answer: a column sampled as integers that holds a
//! fraction or an integer from 2^53 on further down, an integer sum beyond `i64`, or an
//! aggregate it does not compute ([`Func::parse`]).

use rustc_hash::FxHashMap;
use xpu_ir::{Column, ColumnData, Table};

/// An aggregate the native group-by computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    /// `count()`: the group's rows.
    Size,
    /// `count(c)`: the group's non-missing values.
    Count,
    Sum,
    Mean,
    Std,
    Var,
    Min,
    Max,
}

impl Func {
    /// MiniLang's aggregate name (with or without a column); `None` for one computed only by
    /// DuckDB (`median`, `first`, `nunique`).
    pub fn parse(name: &str, has_column: bool) -> Option<Func> {
        Some(match (name, has_column) {
            ("count", false) => Func::Size,
            ("count", true) => Func::Count,
            ("sum", true) => Func::Sum,
            ("mean", true) => Func::Mean,
            ("std", true) => Func::Std,
            ("var", true) => Func::Var,
            ("min", true) => Func::Min,
            ("max", true) => Func::Max,
            _ => return None,
        })
    }
}

/// One output column: its name, aggregate and input column (an index into the columns).
#[derive(Clone, Debug)]
pub struct Agg {
    pub out: String,
    pub func: Func,
    pub column: Option<usize>,
}

/// One input column, row-aligned with the others, missing cells NaN.
#[derive(Debug)]
pub struct Input<'a> {
    pub name: &'a str,
    pub values: &'a [f64],
    /// The file's column is integral (the table's column type is `i64`).
    pub integer: bool,
}

/// Integers up to this magnitude are exact in an `f64`.
const EXACT: f64 = 9_007_199_254_740_992.0;
/// A row whose key is missing.
const DROPPED: u32 = u32::MAX;

/// Groups `columns` by the columns at `keys` and computes `aggs`; `Err` says why the native
/// kernel declines (the caller runs DuckDB's statement instead).
pub fn group_agg(columns: &[Input<'_>], keys: &[usize], aggs: &[Agg]) -> Result<Table, String> {
    // The schema came from a sample of the file: a row past it may hold a fraction, or an
    // integer an `f64` rounds (2^53 + 1 reads as 2^53, so 2^53 itself is suspect).
    for c in columns.iter().filter(|c| c.integer) {
        if c.values.iter().any(|v| !v.is_nan() && (v.fract() != 0.0 || v.abs() >= EXACT)) {
            return Err(format!(
                "column {:?} was sampled as integers and holds a fraction or an integer from \
                 2^53 on",
                c.name
            ));
        }
    }
    let (gid, firsts) = group_ids(columns, keys);
    let order = sorted_groups(columns, keys, &firsts);
    // rank[g]: where group g is printed.
    let mut rank = vec![0u32; firsts.len()];
    for (r, &g) in order.iter().enumerate() {
        rank[g as usize] = r as u32;
    }
    let gid: Vec<u32> =
        gid.into_iter().map(|g| if g == DROPPED { DROPPED } else { rank[g as usize] }).collect();
    let groups = order.len();
    let mut out = Vec::with_capacity(keys.len() + aggs.len());
    for &k in keys {
        let c = &columns[k];
        let values: Vec<f64> = order.iter().map(|&g| c.values[firsts[g as usize]] + 0.0).collect();
        out.push(Column { name: c.name.to_string(), data: typed(values, c.integer) });
    }
    for a in aggs {
        let data = match a.column {
            None => ColumnData::I64(sizes(&gid, groups).into_iter().map(Some).collect()),
            Some(c) => aggregate(a.func, &columns[c], &gid, groups)?,
        };
        out.push(Column { name: a.out.clone(), data });
    }
    Ok(Table { columns: out, index: false })
}

/// A column of `f64` values as the table holds it: `i64` for an integer column.
fn typed(values: Vec<f64>, integer: bool) -> ColumnData {
    if integer {
        ColumnData::I64(values.into_iter().map(|v| Some(v as i64)).collect())
    } else {
        ColumnData::F64(values.into_iter().map(Some).collect())
    }
}

/// The hashable bits of a key value: `-0.0` groups with `0.0`, as in DuckDB and pandas.
/// Mixed by MurmurHash3's finaliser, a bijection: whole numbers as `f64` have all-zero low
/// bits, which FxHash's multiply leaves zero, and every key would probe one bucket.
fn key_bits(v: f64) -> u64 {
    let mut x = (v + 0.0).to_bits();
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Every row's group (in order of first appearance; [`DROPPED`] for a row with a missing
/// key) and each group's first row.
fn group_ids(columns: &[Input<'_>], keys: &[usize]) -> (Vec<u32>, Vec<usize>) {
    let rows = columns.first().map_or(0, |c| c.values.len());
    let mut gid = Vec::with_capacity(rows);
    let mut firsts = Vec::new();
    if let [k] = keys {
        let values = columns[*k].values;
        let mut map: FxHashMap<u64, u32> = FxHashMap::default();
        for (r, &v) in values.iter().enumerate() {
            if v.is_nan() {
                gid.push(DROPPED);
                continue;
            }
            let next = firsts.len() as u32;
            let g = *map.entry(key_bits(v)).or_insert(next);
            if g == next {
                firsts.push(r);
            }
            gid.push(g);
        }
        return (gid, firsts);
    }
    let mut map: FxHashMap<Vec<u64>, u32> = FxHashMap::default();
    let mut probe = Vec::with_capacity(keys.len());
    for r in 0..rows {
        probe.clear();
        probe.extend(keys.iter().map(|&k| columns[k].values[r]).map(key_bits));
        if keys.iter().any(|&k| columns[k].values[r].is_nan()) {
            gid.push(DROPPED);
            continue;
        }
        let g = match map.get(probe.as_slice()) {
            Some(&g) => g,
            None => {
                let g = firsts.len() as u32;
                map.insert(probe.clone(), g);
                firsts.push(r);
                g
            }
        };
        gid.push(g);
    }
    (gid, firsts)
}

/// The groups in key order (no key is NaN: those rows were dropped).
fn sorted_groups(columns: &[Input<'_>], keys: &[usize], firsts: &[usize]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..firsts.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (ra, rb) = (firsts[a as usize], firsts[b as usize]);
        keys.iter()
            .map(|&k| (columns[k].values[ra] + 0.0).total_cmp(&(columns[k].values[rb] + 0.0)))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    order
}

fn sizes(gid: &[u32], groups: usize) -> Vec<i64> {
    let mut n = vec![0i64; groups];
    for &g in gid.iter().filter(|&&g| g != DROPPED) {
        n[g as usize] += 1;
    }
    n
}

/// The rows that count for an aggregate: a kept row's group and its non-missing value.
fn present<'a>(gid: &'a [u32], values: &'a [f64]) -> impl Iterator<Item = (usize, f64)> + 'a {
    gid.iter()
        .zip(values)
        .filter(|(g, v)| **g != DROPPED && !v.is_nan())
        .map(|(&g, &v)| (g as usize, v))
}

/// Neumaier's compensated sum per group, with the count of values.
struct Sums {
    sum: Vec<f64>,
    compensation: Vec<f64>,
    count: Vec<i64>,
}

impl Sums {
    fn new(groups: usize) -> Sums {
        Sums { sum: vec![0.0; groups], compensation: vec![0.0; groups], count: vec![0; groups] }
    }

    /// The sums of each group's present values.
    fn of(gid: &[u32], values: &[f64], groups: usize) -> Sums {
        let mut s = Sums::new(groups);
        for (g, x) in present(gid, values) {
            s.add(g, x);
        }
        s
    }

    fn add(&mut self, g: usize, x: f64) {
        let sum = self.sum[g];
        let t = sum + x;
        self.compensation[g] += if sum.abs() >= x.abs() { (sum - t) + x } else { (x - t) + sum };
        self.sum[g] = t;
        self.count[g] += 1;
    }

    fn total(&self, g: usize) -> f64 {
        let t = self.sum[g] + self.compensation[g];
        // An infinite sum leaves NaN in its compensation.
        if t.is_nan() && !self.sum[g].is_nan() { self.sum[g] } else { t }
    }

    fn mean(&self, g: usize) -> Option<f64> {
        (self.count[g] > 0).then(|| self.total(g) / self.count[g] as f64)
    }
}

fn aggregate(func: Func, c: &Input<'_>, gid: &[u32], groups: usize) -> Result<ColumnData, String> {
    let v = c.values;
    Ok(match func {
        Func::Size => ColumnData::I64(sizes(gid, groups).into_iter().map(Some).collect()),
        Func::Count => {
            let mut n = vec![0i64; groups];
            for (g, _) in present(gid, v) {
                n[g] += 1;
            }
            ColumnData::I64(n.into_iter().map(Some).collect())
        }
        Func::Sum if c.integer => {
            let mut s = vec![0i128; groups];
            for (g, x) in present(gid, v) {
                s[g] += x as i128;
            }
            let sums: Option<Vec<Option<i64>>> =
                s.into_iter().map(|x| i64::try_from(x).ok().map(Some)).collect();
            ColumnData::I64(
                sums.ok_or_else(|| format!("a sum of column {:?} overflows i64", c.name))?,
            )
        }
        Func::Sum => {
            let s = Sums::of(gid, v, groups);
            ColumnData::F64((0..groups).map(|g| Some(s.total(g))).collect())
        }
        Func::Mean => {
            let s = Sums::of(gid, v, groups);
            ColumnData::F64((0..groups).map(|g| s.mean(g)).collect())
        }
        Func::Var | Func::Std => {
            let var = variances(gid, v, groups);
            let var = if func == Func::Std {
                var.into_iter().map(|x| x.map(f64::sqrt)).collect()
            } else {
                var
            };
            ColumnData::F64(var)
        }
        Func::Min | Func::Max => {
            let start = if func == Func::Min { f64::INFINITY } else { f64::NEG_INFINITY };
            let mut best = vec![start; groups];
            let mut seen = vec![false; groups];
            for (g, x) in present(gid, v) {
                seen[g] = true;
                best[g] = if func == Func::Min { best[g].min(x) } else { best[g].max(x) };
            }
            let best = best.into_iter().zip(seen).map(|(b, s)| s.then_some(b));
            if c.integer {
                ColumnData::I64(best.map(|b| b.map(|b| b as i64)).collect())
            } else {
                ColumnData::F64(best.collect())
            }
        }
    })
}

/// The sample variance per group (`None` below two values), from the deviations from the
/// group's mean.
fn variances(gid: &[u32], v: &[f64], groups: usize) -> Vec<Option<f64>> {
    let s = Sums::of(gid, v, groups);
    let means: Vec<f64> = (0..groups).map(|g| s.mean(g).unwrap_or(0.0)).collect();
    let mut squares = Sums::new(groups);
    for (g, x) in present(gid, v) {
        let d = x - means[g];
        squares.add(g, d * d);
    }
    (0..groups)
        .map(|g| (s.count[g] > 1).then(|| squares.total(g) / (s.count[g] - 1) as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(name: &'a str, values: &'a [f64], integer: bool) -> Input<'a> {
        Input { name, values, integer }
    }

    fn f64s(c: &ColumnData) -> Vec<Option<f64>> {
        match c {
            ColumnData::F64(v) => v.clone(),
            ColumnData::I64(v) => v.iter().map(|x| x.map(|x| x as f64)).collect(),
            other => panic!("unexpected column {other:?}"),
        }
    }

    #[test]
    fn groups_sorted_missing_keys_dropped_negative_zero_merged() {
        let nan = f64::NAN;
        let k = [3.0, -0.0, nan, 3.0, 0.0, -2.5];
        let x = [1.0, 2.0, 100.0, nan, 4.0, 5.0];
        let cols = [input("k", &k, false), input("x", &x, false)];
        let aggs = [
            Agg { out: "n".into(), func: Func::Size, column: None },
            Agg { out: "c".into(), func: Func::Count, column: Some(1) },
            Agg { out: "s".into(), func: Func::Sum, column: Some(1) },
            Agg { out: "m".into(), func: Func::Mean, column: Some(1) },
            Agg { out: "v".into(), func: Func::Var, column: Some(1) },
            Agg { out: "hi".into(), func: Func::Max, column: Some(1) },
        ];
        let t = group_agg(&cols, &[0], &aggs).unwrap();
        let got: Vec<Vec<Option<f64>>> = t.columns.iter().map(|c| f64s(&c.data)).collect();
        assert_eq!(got[0], [Some(-2.5), Some(0.0), Some(3.0)]);
        assert_eq!(got[1], [Some(1.0), Some(2.0), Some(2.0)]);
        assert_eq!(got[2], [Some(1.0), Some(2.0), Some(1.0)]);
        assert_eq!(got[3], [Some(5.0), Some(6.0), Some(1.0)]);
        assert_eq!(got[4], [Some(5.0), Some(3.0), Some(1.0)]);
        assert_eq!(got[5], [None, Some(2.0), None]);
        assert_eq!(got[6], [Some(5.0), Some(4.0), Some(1.0)]);
        assert!(got[0][1].unwrap().is_sign_positive(), "-0.0 and 0.0 print as one key, 0");
    }

    #[test]
    fn integer_columns_stay_integer_and_big_ones_decline() {
        let k = [1.0, 1.0, 2.0];
        let x = [4.0, 5.0, f64::NAN];
        let cols = [input("k", &k, true), input("x", &x, true)];
        let aggs = [
            Agg { out: "s".into(), func: Func::Sum, column: Some(1) },
            Agg { out: "lo".into(), func: Func::Min, column: Some(1) },
        ];
        let t = group_agg(&cols, &[0], &aggs).unwrap();
        assert_eq!(t.columns[0].data, ColumnData::I64(vec![Some(1), Some(2)]));
        assert_eq!(t.columns[1].data, ColumnData::I64(vec![Some(9), Some(0)]));
        assert_eq!(t.columns[2].data, ColumnData::I64(vec![Some(4), None]));
        for odd in [1e17, 9_007_199_254_740_992.0, 1.5, f64::INFINITY] {
            let k = [odd, 1.0, 2.0];
            let cols = [input("k", &k, true), input("x", &x, true)];
            let err = group_agg(&cols, &[0], &aggs).unwrap_err();
            assert!(err.contains("\"k\"") && err.contains("2^53"), "{odd}: {err}");
        }
    }

    #[test]
    fn two_keys_and_compensated_sums() {
        let n = 100_000;
        let a: Vec<f64> = (0..n).map(|i| (i % 3) as f64).collect();
        let b: Vec<f64> = (0..n).map(|i| (i % 2) as f64 * 0.5).collect();
        // 0.1 is not exact in binary: a running sum of 100,000 of them drifts, Neumaier's
        // does not.
        let x = vec![0.1; n];
        let cols = [input("a", &a, true), input("b", &b, false), input("x", &x, false)];
        let aggs = [
            Agg { out: "s".into(), func: Func::Sum, column: Some(2) },
            Agg { out: "sd".into(), func: Func::Std, column: Some(2) },
        ];
        let t = group_agg(&cols, &[0, 1], &aggs).unwrap();
        assert_eq!(t.rows(), 6);
        let sums = f64s(&t.columns[2].data);
        let sizes = sizes_by_hand(&a, &b);
        for (s, size) in sums.iter().zip(sizes) {
            let want = size as f64 / 10.0;
            assert!((s.unwrap() - want).abs() <= want * 1e-15, "{s:?} vs {want}");
        }
        assert!(f64s(&t.columns[3].data).iter().all(|sd| sd.unwrap().abs() < 1e-15));
    }

    fn sizes_by_hand(a: &[f64], b: &[f64]) -> Vec<usize> {
        let mut keys: Vec<(i64, i64)> =
            a.iter().zip(b).map(|(x, y)| (*x as i64, (*y * 2.0) as i64)).collect();
        keys.sort();
        let mut out: Vec<usize> = Vec::new();
        let mut last = None;
        for k in keys {
            if Some(k) == last {
                *out.last_mut().unwrap() += 1;
            } else {
                out.push(1);
                last = Some(k);
            }
        }
        out
    }
}
