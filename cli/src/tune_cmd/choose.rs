//! What `tune` compares and what it locks: each node's allowed candidates (units), the
//! plans that steer nodes to one engine or one kernel, the dynamic programme that mixes
//! engines node by node, and the lock files that encode a choice.

use std::collections::{BTreeMap, HashMap};

use xpu_engine::Inventory;
use xpu_engine::device::DeviceKind;
use xpu_ir::{Graph, NodeId, Op};
use xpu_plan::Explanation;
use xpu_plan::evidence::{node_signature, operands};
use xpu_policy::Policy;
use xpu_policy::lock::{Evidence, Figure, LOCK_VERSION, LockFile, Machine, NodeChoice};

use super::evidence::allowed_kernels;

/// One node of the (optimised) program and the candidates the policy allows for it.
pub(super) struct Unit {
    pub node: NodeId,
    pub label: String,
    pub op: &'static str,
    pub signature: String,
    pub operands: String,
    /// Allowed candidates as (engine, kernel), the static choice first: every kernel,
    /// those of one engine too.
    pub candidates: Vec<(String, String)>,
}

impl Unit {
    /// The node's short name (`n34`), the first word of its label.
    pub fn short(&self) -> &str {
        self.label.split_whitespace().next().unwrap_or_default()
    }
}

/// Units `from..=to` as the report names them: `n1` or `n1..n32`.
pub(super) fn span(units: &[Unit], from: usize, to: usize) -> String {
    match from == to {
        true => units[from].short().to_string(),
        false => format!("{}..{}", units[from].short(), units[to].short()),
    }
}

/// The (engine, kernel) unit `i` is steered to, if any.
pub(super) fn picked<'u>(
    units: &'u [Unit],
    picks: &[Option<usize>],
    i: usize,
) -> Option<&'u (String, String)> {
    picks[i].and_then(|p| units[i].candidates.get(p))
}

/// A plan to measure: the candidate each unit is steered to.
pub(super) struct Steering {
    pub name: String,
    pub engine: String,
    pub picks: Vec<Option<usize>>,
}

/// Each placed node's allowed candidates: its choice, then every kernel the walk set
/// aside only by the order (or by earlier measurements). Kernels on a device this machine
/// only emulates are left out, with a note (their times would be the emulator's), unless
/// the static choice is one.
pub(super) fn units(
    g: &Graph,
    ex: &Explanation,
    bindings: &BTreeMap<String, u64>,
    inventory: &Inventory,
) -> (Vec<Unit>, Vec<String>) {
    let mut out = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    for d in ex.decisions.iter() {
        let Some(c) = &d.chosen else { continue };
        if g.node(d.node).op == Op::Constant {
            continue;
        }
        let mut candidates = Vec::new();
        for kernel in allowed_kernels(d) {
            let engine = xpu_engine::catalog::engine_of(&kernel).to_string();
            // The static choice stays, wherever it runs: it is the plan compared against.
            let emulated = (*kernel != *c.kernel).then(|| emulated(inventory, &engine, &kernel));
            if let Some(why) = emulated.flatten() {
                let note = format!("{kernel} is not measured: {why}");
                if !notes.contains(&note) {
                    notes.push(note);
                }
                continue;
            }
            candidates.push((engine, kernel));
        }
        if candidates.first().is_none_or(|(_, k)| **k != *c.kernel) {
            candidates.insert(0, (c.engine.to_string(), c.kernel.to_string()));
        }
        out.push(Unit {
            node: d.node,
            label: g.node(d.node).label(d.node),
            op: g.node(d.node).op.name(),
            signature: node_signature(g, d.node, bindings),
            operands: operands(g, d.node, bindings),
            candidates,
        });
    }
    (out, notes)
}

/// Why `kernel` runs on an emulator here (every device of its kind is run by qemu), if it
/// does. A board's runner (`[engines.llvm] riscv_runner`) is measured like any device.
fn emulated(inventory: &Inventory, engine: &str, kernel: &str) -> Option<String> {
    let caps = inventory.engines.iter().find(|c| c.engine == engine)?;
    let kind = caps.kernel(kernel)?.device?;
    if kind == DeviceKind::Host {
        return None;
    }
    let on: Vec<&str> =
        caps.devices.iter().filter(|d| d.id.kind == kind).map(|d| d.name.as_str()).collect();
    // The runner's program: `qemu-riscv64 -cpu …` or `/usr/bin/qemu-riscv64`.
    let qemu = |n: &str| {
        let program = n.split_whitespace().next().unwrap_or_default();
        std::path::Path::new(program)
            .file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with("qemu"))
    };
    (!on.is_empty() && on.iter().all(|n| qemu(n)))
        .then(|| format!("its {kind} device is emulated here ({})", on.join(", ")))
}

/// The plans to measure: one per engine (each node that can go to the engine on its
/// first allowed kernel there), then one per further kernel (the nodes that can take it
/// take it, the others their engine's first kernel) — so every allowed candidate runs.
pub(super) fn steerings(units: &[Unit]) -> Vec<Steering> {
    let mut out = Vec::new();
    let mut kernels: Vec<&(String, String)> = Vec::new();
    for u in units {
        for c in &u.candidates {
            if !kernels.contains(&c) {
                kernels.push(c);
            }
        }
    }
    let first_of = |u: &Unit, e: &str| u.candidates.iter().position(|(ce, _)| ce == e);
    let mut engines: Vec<&str> = Vec::new();
    for (e, _) in &kernels {
        if !engines.contains(&e.as_str()) {
            engines.push(e);
            let picks = units.iter().map(|u| first_of(u, e)).collect();
            out.push(Steering { name: format!("only {e}"), engine: e.clone(), picks });
        }
    }
    for (e, k) in kernels {
        let of = |u: &Unit| u.candidates.iter().position(|(_, ck)| ck == k);
        // Where the kernel is its engine's first choice for every node, "only ENGINE" ran it.
        if units.iter().all(|u| of(u).is_none() || of(u) == first_of(u, e)) {
            continue;
        }
        let picks = units.iter().map(|u| of(u).or_else(|| first_of(u, e))).collect();
        out.push(Steering { name: format!("only {k}"), engine: e.clone(), picks });
    }
    out
}

/// Most neighbours of the programme's plan measured.
const NEIGHBOURS: usize = 12;

/// The programme's plan with one of its stretches (units in a row on one engine) moved to
/// another engine the stretch's units allow, the stretches that take the most time first.
pub(super) fn neighbours(
    units: &[Unit],
    picks: &[Option<usize>],
    times: &HashMap<(NodeId, String), (f64, u32)>,
) -> Vec<Steering> {
    let engine_of = |i: usize| picked(units, picks, i).map(|c| &c.0);
    // (first unit, last unit, µs) of each stretch.
    let mut stretches: Vec<(usize, usize, f64)> = Vec::new();
    for i in 0..units.len() {
        let t = picked(units, picks, i)
            .and_then(|(_, k)| times.get(&(units[i].node, k.clone())))
            .map_or(0.0, |t| t.0);
        match stretches.last_mut() {
            Some((_, last, sum)) if engine_of(*last) == engine_of(i) => {
                *last = i;
                *sum += t;
            }
            _ => stretches.push((i, i, t)),
        }
    }
    stretches.sort_by(|a, b| b.2.total_cmp(&a.2));
    let mut out = Vec::new();
    for (from, to, _) in stretches {
        let mut others: Vec<&String> = Vec::new();
        for u in &units[from..=to] {
            for (e, _) in &u.candidates {
                if Some(e) != engine_of(from) && !others.contains(&e) {
                    others.push(e);
                }
            }
        }
        for e in others {
            let mut moved = picks.to_vec();
            for (i, u) in units.iter().enumerate().take(to + 1).skip(from) {
                if let Some(p) = u.candidates.iter().position(|(ce, _)| ce == e) {
                    moved[i] = Some(p);
                }
            }
            let name = format!("{} on {e}", span(units, from, to));
            out.push(Steering { name, engine: e.clone(), picks: moved });
        }
    }
    out.truncate(NEIGHBOURS);
    out
}

pub(super) fn evidence_of(lock: &LockFile) -> Evidence {
    Evidence::new("(tune)", lock.to_toml().as_bytes(), Ok(lock.clone()))
}

fn empty_lock(machine: &Machine, g: &Graph, policy: &Policy, runs: u32) -> LockFile {
    LockFile {
        version: LOCK_VERSION,
        program: g.name.clone(),
        graph_sha256: g.content_hash(),
        policy: policy.name().to_string(),
        runs,
        machine: machine.clone(),
        plans: Vec::new(),
        nodes: Vec::new(),
    }
}

/// A lock that sends each unit to its pick. Its figures are made up: they only steer the
/// plan `tune` measures next (as many samples as any policy asks).
pub(super) fn steering_lock(
    units: &[Unit],
    picks: &[Option<usize>],
    machine: &Machine,
    g: &Graph,
    policy: &Policy,
) -> LockFile {
    let mut lock = lock_of(units, picks, &HashMap::new(), machine, g, policy, 0);
    for n in &mut lock.nodes {
        n.winner.samples = u32::MAX;
    }
    lock
}

/// A lock of the picked candidate per unit (`None`: no entry), with their figures (a
/// candidate never timed: 0 samples, which no `min_samples` lets decide), the fastest
/// other candidate as runner-up and every other measured one after it. Units that share
/// a signature get the (engine, kernel) most of them picked; its figures are those of the
/// first unit that has it.
pub(super) fn lock_of(
    units: &[Unit],
    picks: &[Option<usize>],
    times: &HashMap<(NodeId, String), (f64, u32)>,
    machine: &Machine,
    g: &Graph,
    policy: &Policy,
    runs: u32,
) -> LockFile {
    let mut lock = empty_lock(machine, g, policy, runs);
    // Per signature: each picked (engine, kernel), how many units picked it, in order.
    let mut votes: BTreeMap<&str, Vec<(&(String, String), usize)>> = BTreeMap::new();
    for (u, pick) in units.iter().zip(picks) {
        if let Some(c) = pick.and_then(|c| u.candidates.get(c)) {
            let v = votes.entry(&u.signature).or_default();
            match v.iter_mut().find(|(k, _)| *k == c) {
                Some((_, n)) => *n += 1,
                None => v.push((c, 1)),
            }
        }
    }
    let figure = |u: &Unit, (e, k): &(String, String)| {
        let (us, n) = times.get(&(u.node, k.clone())).copied().unwrap_or((0.0, 0));
        Figure { engine: e.clone(), kernel: k.clone(), median_us: us, samples: n }
    };
    for u in units {
        let Some(v) = votes.remove(u.signature.as_str()) else { continue };
        // The most picked; the first picked among equals.
        let most = v.iter().map(|(_, n)| *n).max().unwrap_or(0);
        let Some(&(winner, _)) = v.iter().find(|(_, n)| *n == most) else { continue };
        let holder = units
            .iter()
            .find(|o| o.signature == u.signature && o.candidates.contains(winner))
            .unwrap_or(u);
        // A node an engine computes inside another's time (a fused epilogue reports 0 ns)
        // has no figure of its own to compare.
        let time = |c: &(String, String)| times.get(&(holder.node, c.1.clone())).map(|t| t.0);
        let mut others: Vec<&(String, String)> = holder
            .candidates
            .iter()
            .filter(|c| *c != winner && time(c).is_some_and(|t| t > 0.0))
            .collect();
        others.sort_by(|x, y| time(x).unwrap_or(0.0).total_cmp(&time(y).unwrap_or(0.0)));
        let mut others = others.into_iter().map(|c| figure(holder, c));
        lock.nodes.push(NodeChoice {
            signature: u.signature.clone(),
            label: u.label.clone(),
            op: u.op.to_string(),
            operands: u.operands.clone(),
            winner: figure(holder, winner),
            runner_up: others.next(),
            also: others.collect(),
        });
    }
    lock
}

/// Per unit the candidate minimising the nodes' times plus a partition's cost at every
/// change of engine (a dynamic programme over the units in order). A unit without times
/// keeps its static choice.
pub(super) fn cheapest_assignment(
    units: &[Unit],
    times: &HashMap<(NodeId, String), (f64, u32)>,
    overheads: &HashMap<String, f64>,
) -> Vec<Option<usize>> {
    // best[c] = (cost so far ending in candidate c of this unit, back pointer).
    let mut history: Vec<Vec<(f64, usize)>> = Vec::with_capacity(units.len());
    let mut prev: Vec<(String, f64)> = Vec::new();
    for u in units {
        let mut row = Vec::with_capacity(u.candidates.len());
        for (c, (e, k)) in u.candidates.iter().enumerate() {
            let t = match times.get(&(u.node, k.clone())) {
                Some(t) => t.0,
                None if c == 0 => 0.0,
                None => f64::INFINITY,
            };
            let enter = overheads.get(e).copied().unwrap_or(0.0);
            let (from, cost) = prev
                .iter()
                .enumerate()
                .map(|(j, (pe, pc))| (j, pc + if pe == e { 0.0 } else { enter }))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or((0, enter));
            row.push((cost + t, from));
        }
        prev = u.candidates.iter().zip(&row).map(|((e, _), (c, _))| (e.clone(), *c)).collect();
        history.push(row);
    }
    let mut picks = vec![None; units.len()];
    let mut at = history.last().and_then(|row| {
        row.iter().enumerate().min_by(|a, b| a.1.0.total_cmp(&b.1.0)).map(|(c, _)| c)
    });
    for i in (0..units.len()).rev() {
        let Some(c) = at else { break };
        picks[i] = Some(c);
        at = Some(history[i][c].1);
    }
    picks
}
