//! Peephole fusion of `add(exp(t), 1)` into `expp1(t)`: the denominator of sigmoid, SiLU
//! and GELU's tanh form as exporters write them. `expp1` needs no subnormal results or
//! overflow split (a sum with 1 has neither), so it costs a few instructions less than
//! `exp` does — and these chains are compute-bound on a vector machine. Rewritten only
//! where the `exp` is read by nothing else (it would be computed twice) and both sit in
//! the same block (the add is not in a loop the exp was hoisted out of). The `exp` left
//! behind is for [`remove_dead_values`](crate::remove_dead_values).

use std::collections::{HashMap, HashSet};

use crate::{BinaryOp, Expr, Kernel, Literal, Stmt, UnaryOp};

/// Rewrites the kernel's `add(exp(t), 1)`s; returns how many.
pub fn fuse_exp_plus_one(kernel: &mut Kernel) -> usize {
    let reads = crate::dce::reads(&kernel.body);
    let mut ones = HashSet::new();
    float_ones(&kernel.body, &mut ones);
    rewrite(&mut kernel.body, &reads, &ones)
}

/// The names of float constants equal to 1 (anywhere: names are unique in a kernel).
fn float_ones(body: &[Stmt], ones: &mut HashSet<String>) {
    for s in body {
        match s {
            Stmt::For { body, .. } => float_ones(body, ones),
            Stmt::Let { name, value } => match value {
                Expr::Const { ty, value: Literal::Float(v) } if ty.is_float() && *v == 1.0 => {
                    ones.insert(name.clone());
                }
                Expr::Reduce { body, .. } => float_ones(body, ones),
                _ => {}
            },
            Stmt::Store { .. } | Stmt::Yield(_) => {}
        }
    }
}

fn rewrite(body: &mut [Stmt], reads: &HashMap<String, usize>, ones: &HashSet<String>) -> usize {
    // This block's exps: value → argument.
    let mut exps: HashMap<String, String> = HashMap::new();
    let mut fused = 0;
    for s in body.iter_mut() {
        let Stmt::Let { name, value } = s else {
            if let Stmt::For { body, .. } = s {
                fused += rewrite(body, reads, ones);
            }
            continue;
        };
        match value {
            Expr::Unary { op: UnaryOp::Exp, arg } => {
                exps.insert(name.clone(), arg.clone());
            }
            Expr::Binary { op: BinaryOp::Add, lhs, rhs } => {
                let e = if ones.contains(rhs) {
                    lhs
                } else if ones.contains(lhs) {
                    rhs
                } else {
                    continue;
                };
                if let Some(t) = exps.get(e.as_str()).filter(|_| reads.get(e.as_str()) == Some(&1))
                {
                    *value = Expr::Unary { op: UnaryOp::Expp1, arg: t.clone() };
                    fused += 1;
                }
            }
            Expr::Reduce { body, .. } => fused += rewrite(body, reads, ones),
            _ => {}
        }
    }
    fused
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fused(src: &str) -> (usize, String) {
        let mut m = crate::parse(src).unwrap();
        let k = &mut m.kernels[0];
        let n = fuse_exp_plus_one(k);
        crate::remove_dead_values(k);
        crate::verify(&m).unwrap();
        (n, m.to_string())
    }

    #[test]
    fn exp_plus_one_fuses_only_where_nothing_else_reads_the_exp_in_another_block() {
        let (n, text) = fused(
            "kernel @k(%a: f32[4] in, %o: f32[4] out, %p: f32[4] out) {
  %one = const 1.0 : f32
  for %i in 0..4 {
    %x = load %a[%i]
    %e = exp %x
    %d = add %one, %e
    %q = div %x, %d
    store %o[%i], %q
    %f = exp %q
    %g = add %f, %one
    %h = mul %g, %f
    store %p[%i], %h
  }
}",
        );
        assert_eq!(n, 1, "{text}");
        assert!(text.contains("%d = expp1 %x"), "{text}");
        assert!(!text.contains("%e = exp"), "the fused exp is gone: {text}");
        assert!(text.contains("%g = add %f, %one"), "%f is read twice: kept: {text}");

        // An exp hoisted out of the loop its add is in: not fused (it would run per
        // iteration); an add of 2, or of an integer 1: not either.
        let (n, text) = fused(
            "kernel @k(%a: f32[4] in, %o: f32[4, 4] out) {
  %one = const 1.0 : f32
  %two = const 2.0 : f32
  for %i in 0..4 {
    %x = load %a[%i]
    %e = exp %x
    %e2 = exp %x
    %t = add %e2, %two
    for %j in 0..4 {
      %d = add %e, %one
      %s = add %d, %t
      store %o[%i, %j], %s
    }
  }
}",
        );
        assert_eq!(n, 0, "{text}");
    }
}
