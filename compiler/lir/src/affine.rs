//! Affine integer expressions over symbols and loop indices, kept canonical (terms sorted,
//! merged, no zero coefficients) so that equal expressions compare equal and print the same.

use std::fmt;

/// A variable of an affine expression: a kernel symbol (`?n`) or a loop index (`%i`).
/// Symbols sort first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Var {
    Sym(String),
    Loop(String),
}

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Var::Sym(s) => write!(f, "?{s}"),
            Var::Loop(s) => write!(f, "%{s}"),
        }
    }
}

/// `constant + Σ coefficient · variable`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Affine {
    pub constant: i64,
    terms: Vec<(Var, i64)>,
}

impl Affine {
    pub fn constant(c: i64) -> Affine {
        Affine { constant: c, terms: Vec::new() }
    }

    pub fn var(v: Var) -> Affine {
        Affine { constant: 0, terms: vec![(v, 1)] }
    }

    pub fn sym(name: &str) -> Affine {
        Affine::var(Var::Sym(name.to_string()))
    }

    pub fn index(name: &str) -> Affine {
        Affine::var(Var::Loop(name.to_string()))
    }

    /// From any terms: sorted, merged, zero coefficients dropped. `None` on i64 overflow.
    pub fn from_terms(constant: i64, mut terms: Vec<(Var, i64)>) -> Option<Affine> {
        terms.sort_by(|a, b| a.0.cmp(&b.0));
        let mut merged: Vec<(Var, i64)> = Vec::with_capacity(terms.len());
        for (v, c) in terms {
            match merged.last_mut() {
                Some((last, sum)) if *last == v => *sum = sum.checked_add(c)?,
                _ => merged.push((v, c)),
            }
        }
        merged.retain(|(_, c)| *c != 0);
        Some(Affine { constant, terms: merged })
    }

    pub fn terms(&self) -> &[(Var, i64)] {
        &self.terms
    }

    /// The value when there are no variables.
    pub fn as_constant(&self) -> Option<i64> {
        self.terms.is_empty().then_some(self.constant)
    }

    pub fn checked_add(&self, other: &Affine) -> Option<Affine> {
        let terms = self.terms.iter().chain(&other.terms).cloned().collect();
        Affine::from_terms(self.constant.checked_add(other.constant)?, terms)
    }

    pub fn checked_scale(&self, k: i64) -> Option<Affine> {
        let terms = self
            .terms
            .iter()
            .map(|(v, c)| Some((v.clone(), c.checked_mul(k)?)))
            .collect::<Option<_>>()?;
        Affine::from_terms(self.constant.checked_mul(k)?, terms)
    }

    pub fn checked_sub(&self, other: &Affine) -> Option<Affine> {
        self.checked_add(&other.checked_scale(-1)?)
    }

    /// Every variable the expression mentions.
    pub fn vars(&self) -> impl Iterator<Item = &Var> {
        self.terms.iter().map(|(v, _)| v)
    }

    /// Whether the expression is ≤ 0 for every non-negative value of its variables.
    pub fn never_positive(&self) -> bool {
        self.constant <= 0 && self.terms.iter().all(|(_, c)| *c <= 0)
    }

    /// Whether the expression is ≥ 0 for every non-negative value of its variables.
    pub fn never_negative(&self) -> bool {
        self.constant >= 0 && self.terms.iter().all(|(_, c)| *c >= 0)
    }
}

impl fmt::Display for Affine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (v, c) in &self.terms {
            let (sign, mag) =
                if *c < 0 { ("-", c.unsigned_abs()) } else { ("+", c.unsigned_abs()) };
            match (first, sign) {
                (true, "-") => f.write_str("-")?,
                (true, _) => {}
                (false, s) => write!(f, " {s} ")?,
            }
            if mag == 1 {
                write!(f, "{v}")?
            } else {
                write!(f, "{v}*{mag}")?
            }
            first = false;
        }
        match (first, self.constant) {
            (true, c) => write!(f, "{c}"),
            (false, 0) => Ok(()),
            (false, c) if c < 0 => write!(f, " - {}", c.unsigned_abs()),
            (false, c) => write!(f, " + {c}"),
        }
    }
}
