//! Dead-value elimination: `let`s nothing reads are dropped, to a fixpoint. Lowerings
//! emit values freely (an idiom rewrite leaves the op-by-op spelling it replaced behind);
//! this keeps the printed LIR, the interpreter and the generated IR to what is used.
//! Integer `div`/`rem` stay even when unused: dropping one would drop its division-by-zero
//! error (a float division has none, and goes like any other value).

use std::collections::{HashMap, HashSet};

use crate::{BinaryOp, Expr, Kernel, Stmt};

/// Removes the kernel's unused values; returns how many went.
pub fn remove_dead_values(kernel: &mut Kernel) -> usize {
    // Float values, by the verifier's typing: a float division has no error to keep. A
    // kernel that does not verify keeps every division.
    let floats: HashSet<String> = crate::verify::value_types(kernel)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(name, ty)| ty.is_float().then_some(name))
        .collect();
    let mut removed = 0;
    loop {
        let used = reads(&kernel.body);
        let n = prune(&mut kernel.body, &used, &floats);
        if n == 0 {
            return removed;
        }
        removed += n;
    }
}

/// How many times each value is read (by statements, stores and yields), through nested
/// loops and reduction bodies.
pub(crate) fn reads(body: &[Stmt]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    count_reads(body, &mut counts);
    counts
}

fn count_reads(body: &[Stmt], counts: &mut HashMap<String, usize>) {
    fn read(name: &str, counts: &mut HashMap<String, usize>) {
        *counts.entry(name.to_string()).or_default() += 1;
    }
    for s in body {
        match s {
            Stmt::For { body, .. } => count_reads(body, counts),
            Stmt::Store { value, .. } | Stmt::Yield(value) => read(value, counts),
            Stmt::Let { value, .. } => match value {
                Expr::Const { .. } | Expr::Index(_) | Expr::Load { .. } => {}
                Expr::Unary { arg, .. } | Expr::Cast { arg, .. } => read(arg, counts),
                Expr::Binary { lhs, rhs, .. } | Expr::Compare { lhs, rhs, .. } => {
                    read(lhs, counts);
                    read(rhs, counts);
                }
                Expr::Select { cond, then, otherwise } => {
                    for v in [cond, then, otherwise] {
                        read(v, counts);
                    }
                }
                Expr::Reduce { body, .. } => count_reads(body, counts),
            },
        }
    }
}

fn prune(body: &mut Vec<Stmt>, used: &HashMap<String, usize>, floats: &HashSet<String>) -> usize {
    let before = body.len();
    let mut nested = 0;
    body.retain_mut(|s| match s {
        Stmt::Let { name, value } => {
            if let Expr::Reduce { body, .. } = value {
                nested += prune(body, used, floats);
            }
            used.contains_key(name)
                || (matches!(value, Expr::Binary { op: BinaryOp::Div | BinaryOp::Rem, .. })
                    && !floats.contains(name))
        }
        Stmt::For { body, .. } => {
            nested += prune(body, used, floats);
            true
        }
        Stmt::Store { .. } | Stmt::Yield(_) => true,
    });
    before - body.len() + nested
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unused_chains_go_and_what_stores_read_stays() {
        let src = "kernel @k(%a: f32[4] in, %o: f32[4] out, %n: i32[4] in) {
  for %i in 0..4 {
    %x = load %a[%i]
    %e = exp %x
    %one = const 1.0 : f32
    %u = add %e, %one
    %l = log %u
    %y = neg %x
    %p = load %n[%i]
    %z = const 0 : i32
    %q = div %p, %z
    %h = div %x, %one
    store %o[%i], %y
  }
}
";
        let mut m = crate::parse(src).unwrap();
        let k = &mut m.kernels[0];
        assert_eq!(remove_dead_values(k), 5, "exp, const, add, log, the float div");
        let text = m.to_string();
        for gone in ["exp", "log", "%one", "%u =", "%h ="] {
            assert!(!text.contains(gone), "{gone} left in:\n{text}");
        }
        for kept in ["%y = neg %x", "%q = div %p, %z", "store %o[%i], %y"] {
            assert!(text.contains(kept), "{kept} dropped:\n{text}");
        }
        crate::verify(&m).unwrap();
    }
}
