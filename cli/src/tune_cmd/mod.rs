//! `xpuctl tune PROGRAM --policy P`: measures, on this machine, every candidate the policy
//! allows for each node and writes the winners to a lock file beside the policy
//! (`P.lock.toml`) that `choose = "measured"` reads.
//!
//! How: the static plan lists each node's allowed candidates (its choice and every kernel
//! outranked only by the order). Plans that steer nodes to one engine ("only ENGINE") and
//! to each further kernel ("only KERNEL") run side by side — warm-up, then rounds of
//! blocks (`measure`) — giving each node's time on each candidate and each engine's cost
//! per partition; a plan several times slower than the fastest drops out after its
//! warm-up. A dynamic programme over the nodes in order then picks per node the candidate
//! that minimises the nodes' times plus a partition's cost at every change of engine.
//! That plan, its neighbours (each of its stretches moved to another engine), the others
//! and the policy's static plan run side by side once more; the plans within 25 % of the
//! fastest then run again alone (the others' executables released) as the finals,
//! compared round by round: the fastest is locked if it beats the static plan by more
//! than `--min-gain` (3 %); otherwise the lock confirms the static choices. A lock never
//! encodes a plan measured slower than one it was compared with.

mod choose;
mod evidence;
mod measure;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use xpu_engine::Inventory;
use xpu_ir::{Graph, Tensor};
use xpu_plan::{CapturePlan, Explanation};
use xpu_policy::Policy;
use xpu_policy::lock::{LockFile, Machine, micros};

use choose::{
    Unit, cheapest_assignment, evidence_of, lock_of, neighbours, picked, span, steering_lock,
    steerings, units,
};
pub use evidence::evidence;
use measure::Variants;

/// The least cost of a change of engine in the coarse programme, as a fraction of the
/// fastest plan's time.
const COARSE: f64 = 0.1;

/// How close to the fastest plan (a ratio) a plan must be to run in the finals.
const FINALS: f64 = 1.25;

/// What `tune` was asked.
pub struct TuneArgs<'a> {
    pub program: &'a Path,
    pub policy: &'a str,
    pub inputs: &'a [String],
    pub runs: u32,
    pub warmup: u32,
    pub out: Option<&'a Path>,
    pub in_process: bool,
    pub dry_run: bool,
    /// How much faster than the policy's static plan (a fraction) another plan must run,
    /// round by round, to be locked instead.
    pub min_gain: f64,
}

pub fn tune(a: &TuneArgs) -> Result<()> {
    let policy = crate::policy_cmd::load_policy(Some(a.policy), &[])?;
    let least = policy.spec.measured.min_samples.max(1);
    if a.runs < least {
        bail!(
            "--runs {} is below what the policy's winners need ([measured] min_samples = {least}): the lock would never decide",
            a.runs
        );
    }
    let lock_path = match a.out {
        Some(p) => p.to_path_buf(),
        None => lock_path_for(&policy)?,
    };
    let g = Arc::new(crate::program::load(a.program)?);
    let inputs = tune_inputs(&g, a.inputs)?;
    let roots = xpu_runtime::program::data_roots_of(a.program);
    let registry = if a.in_process {
        xpu_runtime::registry_for(roots.roots())
    } else {
        xpu_runtime::isolated_registry_for(roots.roots())
    };
    let inventory = registry.inventory_for_engines(&g, policy.engines_it_may_place_on().as_ref());
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let bindings = xpu_plan::bind_symbols(&g, &shapes);
    let optimised = optimised(&g, &policy);
    let (static_plan, static_ex) = plan(&g, &policy, &inventory, &bindings)?;
    let (units, notes) = units(&optimised, &static_ex, &bindings, &inventory);
    for n in &notes {
        eprintln!("note: {n}");
    }
    let machine = Machine::of(&inventory);
    let steered = steerings(&units);
    if steered.len() < 2 {
        eprintln!("note: the policy allows one candidate for every node here: nothing to choose");
    }
    let plan_with = |lock: &LockFile| -> Result<Arc<CapturePlan>> {
        Ok(plan(&g, &policy.choosing_by(evidence_of(lock)), &inventory, &bindings)?.0)
    };
    let mut set = Variants::new(&registry);
    for s in steered {
        let p = plan_with(&steering_lock(&units, &s.picks, &machine, &g, &policy))?;
        set.add(s.name, Some(s.engine), s.picks, p)?;
    }
    set.measure(&inputs, a.warmup, a.runs, true)?;
    let times = set.node_times();
    let costs = set.partition_costs(&times);
    // A coarse programme too: every change of engine costs at least a tenth of the fastest
    // plan's time (a worker's round trip, fusion lost at the cut), so it keeps long
    // stretches where node times that do not add up would scatter the fine one's.
    let floor = set.fastest_median_us() * COARSE;
    let coarse = costs.iter().map(|(e, c)| (e.clone(), c.max(floor))).collect();
    let mut kept = Vec::new();
    for (name, costs) in [("measured", &costs), ("measured coarsely", &coarse)] {
        let picks = cheapest_assignment(&units, &times, costs);
        let lock = lock_of(&units, &picks, &times, &machine, &g, &policy, a.runs);
        kept.push(set.add(name.into(), None, picks.clone(), plan_with(&lock)?)?);
        // Node times do not add up across engines: the programme's plan and its
        // neighbours — each of its stretches on another engine — are all measured, and
        // the runs decide.
        for n in neighbours(&units, &picks, &times) {
            let lock = steering_lock(&units, &n.picks, &machine, &g, &policy);
            kept.push(set.add(format!("{name}, {}", n.name), None, n.picks, plan_with(&lock)?)?);
        }
    }
    let static_picks: Vec<Option<usize>> = units.iter().map(|_| Some(0)).collect();
    let static_at = set.add("static".into(), None, static_picks.clone(), static_plan)?;
    for i in kept.into_iter().chain([static_at]) {
        set.keep(i);
    }
    let best = decide(&mut set, static_at, &inputs, a)?;
    let times = set.node_times();
    let picks = if best == static_at { &static_picks } else { &set.list[best].picks };
    let mut lock = lock_of(&units, picks, &times, &machine, &g, &policy, a.runs);
    // The lock must make the plan that was measured: say so where it would not.
    if !set.plans_as(best, &*plan_with(&lock)?) {
        eprintln!(
            "warning: a policy reading this lock plans differently from {:?}, the plan measured fastest (candidates below [measured] min_samples?)",
            set.list[best].name()
        );
    }
    let mut order: Vec<usize> = (0..set.list.len()).collect();
    let vs_best: Vec<f64> = (0..set.list.len()).map(|i| set.relative(i, best)).collect();
    order.sort_by(|&x, &y| (x != best).cmp(&(y != best)).then(vs_best[x].total_cmp(&vs_best[y])));
    lock.plans = order.iter().map(|&i| set.list[i].figure()).collect();
    lock.plans[0].name = format!("{} (locked)", lock.plans[0].name);
    let vs_locked: Vec<f64> = order.iter().map(|&i| vs_best[i]).collect();
    report(&lock, &units, &vs_locked);
    println!("locked plan: {}", runs_of(&units, picks));
    if a.dry_run {
        println!("(--dry-run: {} not written)", lock_path.display());
        return Ok(());
    }
    std::fs::write(&lock_path, lock.to_toml())
        .with_context(|| format!("cannot write {}", lock_path.display()))?;
    println!("wrote {} ({} node signatures)", lock_path.display(), lock.nodes.len());
    if policy.spec.measured.lock.is_none() {
        println!(
            "use it: add to the policy\n  [engines]\n  choose = \"measured\"\n  [measured]\n  lock = {:?}",
            lock_path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_default()
        );
    }
    Ok(())
}

/// Which plan to lock: every plan in the race measured again side by side, then the
/// finals — the plans within [`FINALS`] of the fastest and the static plan, alone, every
/// other plan's executables released first (the engine threads of plans that lost do not
/// weigh on those compared). The fastest finalist, round by round, is locked if it beat
/// the static plan in both measurements, in the finals by more than `--min-gain`;
/// otherwise the static plan is, and a re-run does not flip between plans a few percent
/// apart.
fn decide(set: &mut Variants, static_at: usize, inputs: &[Tensor], a: &TuneArgs) -> Result<usize> {
    set.measure(inputs, a.warmup, a.runs, false)?;
    let fastest_of = |set: &Variants, among: &[usize]| {
        among
            .iter()
            .copied()
            .reduce(|best, i| if set.relative(i, best) < 1.0 { i } else { best })
            .unwrap_or(static_at)
    };
    let all: Vec<usize> = (0..set.list.len()).collect();
    let leader = fastest_of(set, &all);
    let finalists: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| i == static_at || set.relative(i, leader) < FINALS)
        .collect();
    let before: Vec<f64> = all.iter().map(|&i| set.relative(i, static_at)).collect();
    set.retire_all_but(&finalists);
    set.measure(inputs, a.warmup, a.runs, false)?;
    let fastest = fastest_of(set, &finalists);
    let gain = set.relative(fastest, static_at) * (1.0 + a.min_gain) < 1.0;
    Ok(if gain && before[fastest] < 1.0 { fastest } else { static_at })
}

/// `P.toml` → `P.lock.toml` beside it.
fn lock_path_for(policy: &Policy) -> Result<PathBuf> {
    let Some(file) = policy.files.first() else {
        bail!("--policy must name a policy file for the lock to go beside it (or give --out)");
    };
    let stem = file.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    Ok(file.with_file_name(format!("{stem}.lock.toml")))
}

/// The inputs given, and generated ones (deterministic values in [-1, 1)) for every other
/// float input of fully known shape.
fn tune_inputs(g: &Graph, args: &[String]) -> Result<Vec<Tensor>> {
    let mut read = crate::read_inputs(args)?;
    for (i, &v) in g.inputs.iter().enumerate() {
        let name = g.value(v).name.clone().unwrap_or_default();
        if read.contains_key(&name) {
            continue;
        }
        let ty = g.ty(v);
        let dims: Option<Vec<usize>> = ty.dims.as_ref().and_then(|d| {
            d.iter()
                .map(|d| match d {
                    xpu_ir::Dim::Known(n) => Some(*n as usize),
                    _ => None,
                })
                .collect()
        });
        let Some(dims) = dims.filter(|_| ty.dtype.is_float()) else {
            bail!(
                "input {name:?} ({}): give it with --input {name}=FILE (only float inputs of known shape are generated)",
                g.ty(v)
            );
        };
        let count: usize = dims.iter().product();
        let mut state = 0x9E3779B97F4A7C15u64 ^ i as u64;
        let values: Vec<f32> = (0..count)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect();
        let t = Tensor::from_vec(dims, values)
            .ok()
            .and_then(|t| t.to_float_dtype(ty.dtype))
            .with_context(|| format!("input {name:?}: cannot make {}", g.ty(v)))?;
        read.insert(name, ("generated".into(), t));
    }
    crate::bind_inputs(g, read)
}

/// The program as the planner sees it: after the pass pipeline the policy asks for (the
/// graph decisions and signatures refer to).
fn optimised(g: &Arc<Graph>, policy: &Policy) -> Arc<Graph> {
    let eval = xpu_runtime::fold_evaluator();
    let pipeline = xpu_plan::passes::pipeline(policy.spec.execution.graph_optimization);
    let rewritten = xpu_plan::passes::optimize(g, pipeline, Some(eval.as_ref())).0;
    rewritten.map(Arc::new).unwrap_or_else(|| g.clone())
}

fn plan(
    g: &Arc<Graph>,
    policy: &Policy,
    inventory: &Inventory,
    bindings: &BTreeMap<String, u64>,
) -> Result<(Arc<CapturePlan>, Explanation)> {
    let eval = xpu_runtime::fold_evaluator();
    let hash = g.content_hash();
    match xpu_plan::plan_shared(g, &hash, policy, inventory, bindings, Some(&*eval)) {
        Ok((p, e)) => Ok((Arc::new(p), e)),
        Err(f) => bail!("no plan under policy {}:\n{f}", policy.name()),
    }
}

/// A plan's picks as runs of units on one kernel: `n1 openvino.cpu; n3..n16 llvm.fused`.
fn runs_of(units: &[Unit], picks: &[Option<usize>]) -> String {
    // (first unit, last unit, kernel) of each run.
    let mut runs: Vec<(usize, usize, &str)> = Vec::new();
    for i in 0..units.len() {
        let kernel = picked(units, picks, i).map_or("(static)", |(_, k)| k.as_str());
        match runs.last_mut() {
            Some((_, last, k)) if *k == kernel => *last = i,
            _ => runs.push((i, i, kernel)),
        }
    }
    let text: Vec<String> =
        runs.iter().map(|&(a, b, k)| format!("{} {k}", span(units, a, b))).collect();
    text.join("; ")
}

/// The plans as compared (`vs_locked`: each one's time over the locked plan's, round by
/// round, in the lock's order) and the locked choice per signature.
fn report(lock: &LockFile, units: &[Unit], vs_locked: &[f64]) {
    println!("plans (median of {} runs or more each, side by side in rounds):", lock.runs);
    for (p, r) in lock.plans.iter().zip(vs_locked) {
        println!(
            "  {:<32} {:>12}  p90 {:>12}  {} partition(s)  {r:.2}x",
            p.name,
            micros(p.median_us),
            micros(p.p90_us),
            p.partitions,
        );
    }
    println!("nodes ({} units, {} signatures):", units.len(), lock.nodes.len());
    for n in &lock.nodes {
        let runner = n.runner_up.as_ref().map(|r| format!(" vs {r}")).unwrap_or_default();
        println!("  {:<28} {:<10} {}{runner}", n.label, n.op, n.winner);
    }
}
