//! Random programs drawn from the grammar, whitespace and all, for tests and fuzzing: each
//! must parse without a syntax error, which holds the grammar to the parser. Draws go
//! shallow past a depth budget (the alternative that ends soonest), so every draw ends.

use std::collections::BTreeMap;

use super::emit::{Mode, space_lex, spaced};
use super::{G, Rule, Rx, rules};

/// A small deterministic generator (xorshift64*): the same seed, the same program.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

struct Sampler {
    rules: Vec<Rule>,
    /// Fewest rule expansions a rule needs to end.
    height: BTreeMap<&'static str, u32>,
    rng: Rng,
    budget: u32,
    out: String,
}

/// A random program of the grammar (about `budget` rules deep).
pub fn sample(seed: u64, budget: u32) -> String {
    let rules = rules();
    let height = heights(&rules);
    let mut s = Sampler { rules, height, rng: Rng(seed | 1), budget, out: String::new() };
    s.rule("program", Mode::Line, 0);
    s.out
}

fn heights(rules: &[Rule]) -> BTreeMap<&'static str, u32> {
    let mut h: BTreeMap<&'static str, u32> = rules.iter().map(|r| (r.name, u32::MAX)).collect();
    loop {
        let mut changed = false;
        for r in rules {
            let v = height_of(&r.body, &h);
            if v < h[r.name] {
                h.insert(r.name, v);
                changed = true;
            }
        }
        if !changed {
            return h;
        }
    }
}

fn height_of(g: &G, h: &BTreeMap<&'static str, u32>) -> u32 {
    match g {
        G::Tok(_) | G::Lex(_) | G::Space(_) | G::Opt(_) | G::Star(_) => 0,
        G::Ref(name) => h[name].saturating_add(1),
        G::Seq(v) => v.iter().map(|e| height_of(e, h)).max().unwrap_or(0),
        G::Alt(v) => v.iter().map(|e| height_of(e, h)).min().unwrap_or(0),
        G::Nest(inner) | G::Lines(inner) => height_of(inner, h),
    }
}

impl Sampler {
    fn rule(&mut self, name: &str, mode: Mode, depth: u32) {
        let body = self.rules.iter().find(|r| r.name == name).expect("known rule").body.clone();
        self.expr(&body, mode, depth + 1);
    }

    fn deep(&self, depth: u32) -> bool {
        depth >= self.budget
    }

    /// Whether an optional part is drawn: less often the deeper the draw is, so programs
    /// stay small while the budget still reaches the rules at the bottom of expressions.
    fn grow(&mut self, depth: u32) -> bool {
        !self.deep(depth) && self.rng.chance(u64::from(60 * (self.budget - depth) / self.budget))
    }

    fn repeats(&mut self, depth: u32) -> usize {
        if self.grow(depth) { 1 + self.rng.below(2) } else { 0 }
    }

    fn expr(&mut self, g: &G, mode: Mode, depth: u32) {
        match g {
            G::Tok(s) => self.out.push_str(s),
            G::Lex(l) => self.rx(&l.rx()),
            G::Space(s) => self.rx(&space_lex(*s, mode).rx()),
            G::Ref(name) => self.rule(name, mode, depth),
            G::Seq(v) => self.seq(v, mode, depth),
            G::Alt(v) => {
                let pick = if self.deep(depth) {
                    let h = self.height.clone();
                    (0..v.len()).min_by_key(|&i| height_of(&v[i], &h)).expect("alternatives")
                } else {
                    self.rng.below(v.len())
                };
                self.expr(&v[pick], mode, depth);
            }
            G::Opt(inner) => {
                if self.grow(depth) {
                    self.expr(inner, mode, depth);
                }
            }
            G::Star(inner) => {
                let n = self.repeats(depth);
                for _ in 0..n {
                    self.expr(inner, mode, depth);
                }
            }
            G::Nest(inner) => {
                self.rx(&super::Lex::Nl.rx());
                self.expr(inner, Mode::Nest, depth);
                self.rx(&super::Lex::Nl.rx());
            }
            G::Lines(inner) => self.expr(inner, Mode::Line, depth),
        }
    }

    /// As the writer does: whitespace between elements, inside a group that follows one.
    fn seq(&mut self, v: &[G], mode: Mode, depth: u32) {
        for (e, ws) in spaced(v, mode) {
            let ws = ws.map(|l| l.rx());
            match (e, ws) {
                (G::Opt(inner), Some(ws)) => {
                    if self.grow(depth) {
                        self.rx(&ws);
                        self.expr(inner, mode, depth);
                    }
                }
                (G::Star(inner), Some(ws)) => {
                    for _ in 0..self.repeats(depth) {
                        self.rx(&ws);
                        self.expr(inner, mode, depth);
                    }
                }
                (_, ws) => {
                    if let Some(ws) = ws {
                        self.rx(&ws);
                    }
                    self.expr(e, mode, depth);
                }
            }
        }
    }

    fn rx(&mut self, rx: &Rx) {
        match rx {
            Rx::Lit(s) => self.out.push_str(s),
            Rx::Class(ranges, negated) => {
                let c = if *negated { self.outside(ranges) } else { self.inside(ranges) };
                self.out.push(c);
            }
            Rx::Seq(v) => v.iter().for_each(|e| self.rx(e)),
            Rx::Alt(v) => {
                let i = self.rng.below(v.len());
                self.rx(&v[i]);
            }
            Rx::Rep(inner, min, max) => {
                let extra = self.rng.below(3) as u32;
                let n = max.map_or(min + extra, |m| (min + extra).min(m));
                for _ in 0..n {
                    self.rx(inner);
                }
            }
        }
    }

    fn inside(&mut self, ranges: &[(char, char)]) -> char {
        let (lo, hi) = ranges[self.rng.below(ranges.len())];
        let span = hi as u32 - lo as u32 + 1;
        char::from_u32(lo as u32 + self.rng.below(span as usize) as u32).unwrap_or(lo)
    }

    /// A character outside `ranges`: printable ASCII, a tab, or a letter beyond ASCII.
    fn outside(&mut self, ranges: &[(char, char)]) -> char {
        loop {
            let c = match self.rng.below(20) {
                0 => 'é',
                1 => '\t',
                _ => char::from_u32(0x20 + self.rng.below(95) as u32).unwrap_or(' '),
            };
            if !ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c)) {
                return c;
            }
        }
    }
}
