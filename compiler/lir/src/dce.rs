//! Dead-value elimination: `let`s nothing reads are dropped, to a fixpoint. Lowerings
//! emit values freely (an idiom rewrite leaves the op-by-op spelling it replaced behind);
//! this keeps the printed LIR, the interpreter and the generated IR to what is used.
//! Integer `div`/`rem` stay even when unused: dropping one would drop its division-by-zero
//! error (a float division has none, and goes like any other value).

use std::collections::HashSet;

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
        let mut used = HashSet::new();
        uses(&kernel.body, &mut used);
        let n = prune(&mut kernel.body, &used, &floats);
        if n == 0 {
            return removed;
        }
        removed += n;
    }
}

fn uses(body: &[Stmt], used: &mut HashSet<String>) {
    for s in body {
        match s {
            Stmt::For { body, .. } => uses(body, used),
            Stmt::Let { value, .. } => expr_uses(value, used),
            Stmt::Store { value, .. } | Stmt::Yield(value) => {
                used.insert(value.clone());
            }
        }
    }
}

fn expr_uses(e: &Expr, used: &mut HashSet<String>) {
    match e {
        Expr::Const { .. } | Expr::Index(_) | Expr::Load { .. } => {}
        Expr::Unary { arg, .. } | Expr::Cast { arg, .. } => {
            used.insert(arg.clone());
        }
        Expr::Binary { lhs, rhs, .. } | Expr::Compare { lhs, rhs, .. } => {
            used.extend([lhs.clone(), rhs.clone()]);
        }
        Expr::Select { cond, then, otherwise } => {
            used.extend([cond.clone(), then.clone(), otherwise.clone()]);
        }
        Expr::Reduce { body, .. } => uses(body, used),
    }
}

fn prune(body: &mut Vec<Stmt>, used: &HashSet<String>, floats: &HashSet<String>) -> usize {
    let before = body.len();
    let mut nested = 0;
    body.retain_mut(|s| match s {
        Stmt::Let { name, value } => {
            if let Expr::Reduce { body, .. } = value {
                nested += prune(body, used, floats);
            }
            used.contains(name)
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
