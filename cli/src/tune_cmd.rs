//! `xpuctl tune PROGRAM --policy P`: measures, on this machine, every candidate the policy
//! allows for each node and writes the winners to a lock file beside the policy
//! (`P.lock.toml`) that `choose = "measured"` reads.
//!
//! How: the static plan lists each node's allowed candidates (its choice and the
//! candidates outranked only by the order). For every engine among them, a plan that
//! takes that engine wherever the policy allows ("only ENGINE") is run — warm-up, then N
//! timed runs, the plans interleaved round by round so drift hits all alike — giving each
//! node's time on each candidate and each engine's cost per partition. A dynamic
//! programme over the nodes in order then picks per node the candidate that minimises the
//! nodes' times plus a partition's cost at every change of engine. That plan, the
//! single-engine plans and the policy's static plan are then run side by side once more.
//! The fastest is locked if it beats the static plan by more than the noise (5 %);
//! otherwise the lock confirms the static choices. A lock never encodes a plan measured
//! slower than one it was compared with.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use xpu_engine::{Inventory, Registry};
use xpu_ir::{Graph, NodeId, Op, Tensor};
use xpu_plan::evidence::{node_signature, operands};
use xpu_plan::{CapturePlan, Explanation, GraphExec, ReasonCode};
use xpu_policy::Policy;
use xpu_policy::lock::{
    Evidence, Figure, LOCK_VERSION, LockFile, Machine, NodeChoice, PlanFigure, SignatureFigure,
    micros,
};

/// How much faster than the policy's static plan another plan must run, side by side, to
/// be locked instead.
const NOISE: f64 = 0.05;

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
}

/// One node of the (optimised) program and the candidates the policy allows for it.
struct Unit {
    node: NodeId,
    label: String,
    op: &'static str,
    signature: String,
    operands: String,
    /// Allowed candidates as (engine, kernel), the static choice first.
    candidates: Vec<(String, String)>,
}

/// A whole-model plan under test and what its runs measured.
struct Variant {
    name: String,
    plan: Arc<CapturePlan>,
    exec: GraphExec,
    walls: Vec<u64>,
    /// (source node, kernel) → its times.
    nodes: HashMap<(NodeId, String), Vec<u64>>,
    /// Planned node → the times its engine reported for it in any run, warm-up included
    /// (ONNX Runtime and OpenVINO report them on their first, profiled run only).
    profiled: HashMap<NodeId, Vec<u64>>,
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
    let (_, static_ex) = plan(&g, &policy, &inventory, &bindings)?;
    let units = units(&optimised, &static_ex, &bindings);
    let engines = engines_of(&units);
    if engines.len() < 2 {
        eprintln!(
            "note: the policy allows one engine for every node here ({}): nothing to choose",
            engines.join("")
        );
    }
    let machine = Machine::of(&inventory);
    let mut variants = Vec::new();
    for e in &engines {
        let lock = single_engine_lock(&units, e, &machine, &g, &policy, a.runs);
        let (p, _) = plan(&g, &policy.choosing_by(evidence_of(&lock)), &inventory, &bindings)?;
        variants.push(variant(format!("only {e}"), p, &registry)?);
    }
    measure(&mut variants, &inputs, a.warmup, a.runs)?;
    let times = node_times(&variants);
    let overheads = partition_costs(&variants, &times);
    let picks = cheapest_assignment(&units, &times, &overheads);
    let measured_lock = lock_of(&units, &picks, &times, &machine, &g, &policy, a.runs);
    let (p, _) = plan(&g, &policy.choosing_by(evidence_of(&measured_lock)), &inventory, &bindings)?;
    variants.push(variant("measured".into(), p, &registry)?);
    let (p, _) = plan(&g, &policy, &inventory, &bindings)?;
    variants.push(variant("static".into(), p, &registry)?);
    // Every plan again, side by side: the lock's own and the single-engine ones.
    for v in &mut variants {
        v.walls.clear();
    }
    measure(&mut variants, &inputs, a.warmup, a.runs)?;
    let figures: Vec<PlanFigure> = variants.iter().map(plan_figure).collect();
    let fastest = (0..variants.len())
        .min_by(|&x, &y| figures[x].median_us.total_cmp(&figures[y].median_us))
        .expect("a plan was measured");
    // The policy's own order stands unless another plan beats it by more than the noise
    // between side-by-side runs here: the lock then confirms the static choices, and a
    // re-run does not flip between plans a few percent apart.
    let static_at = variants.len() - 1;
    let beats_static = figures[fastest].median_us * (1.0 + NOISE) < figures[static_at].median_us;
    let best = if beats_static { fastest } else { static_at };
    let mut lock = if variants[best].name == "measured" {
        measured_lock
    } else if best == static_at {
        let picks: Vec<Option<usize>> = units.iter().map(|_| Some(0)).collect();
        lock_of(&units, &picks, &times, &machine, &g, &policy, a.runs)
    } else {
        let engine = variants[best].name.trim_start_matches("only ").to_string();
        let picks: Vec<Option<usize>> = units
            .iter()
            .map(|u| u.candidates.iter().position(|(e, _)| *e == engine).or(Some(0)))
            .collect();
        lock_of(&units, &picks, &times, &machine, &g, &policy, a.runs)
    };
    let mut order: Vec<usize> = (0..figures.len()).collect();
    order.sort_by_key(|&i| if i == best { 0 } else { 1 });
    lock.plans = order.iter().map(|&i| figures[i].clone()).collect();
    lock.plans[0].name = format!("{} (locked)", lock.plans[0].name);
    report(&lock, &units);
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

/// Each placed node's allowed candidates: its choice, then those outranked only by the
/// order (or by earlier measurements), one per engine.
fn units(g: &Graph, ex: &Explanation, bindings: &BTreeMap<String, u64>) -> Vec<Unit> {
    let mut out = Vec::new();
    for d in ex.decisions.iter() {
        let Some(c) = &d.chosen else { continue };
        if g.node(d.node).op == Op::Constant {
            continue;
        }
        let mut candidates = vec![(c.engine.to_string(), c.kernel.to_string())];
        for r in d.rejected.iter() {
            let allowed = matches!(r.code, ReasonCode::Outranked | ReasonCode::MeasuredSlower);
            if let (true, Some(k)) = (allowed, &r.kernel)
                && !candidates.iter().any(|(e, _)| *e == r.engine)
            {
                candidates.push((r.engine.clone(), k.clone()));
            }
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
    out
}

fn engines_of(units: &[Unit]) -> Vec<String> {
    let mut engines: Vec<String> = Vec::new();
    for u in units {
        for (e, _) in &u.candidates {
            if !engines.contains(e) {
                engines.push(e.clone());
            }
        }
    }
    engines
}

fn evidence_of(lock: &LockFile) -> Evidence {
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

/// A lock that sends every node that can go to `engine` there. Its figures are made up:
/// they only steer the plan `tune` measures next (as many samples as any policy asks).
fn single_engine_lock(
    units: &[Unit],
    engine: &str,
    machine: &Machine,
    g: &Graph,
    policy: &Policy,
    runs: u32,
) -> LockFile {
    let picks: Vec<Option<usize>> =
        units.iter().map(|u| u.candidates.iter().position(|(e, _)| e == engine)).collect();
    let mut lock = lock_of(units, &picks, &HashMap::new(), machine, g, policy, runs);
    for n in &mut lock.nodes {
        n.winner.samples = u32::MAX;
    }
    lock
}

/// A lock of the picked candidate per unit (`None`: no entry), with their figures (a
/// candidate never timed: 0 samples, which no `min_samples` lets decide). Units that share
/// a signature get the (engine, kernel) most of them picked; its figures are those of the
/// first unit that has it.
fn lock_of(
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
        let runner_up = holder
            .candidates
            .iter()
            .filter(|c| *c != winner && time(c).is_some_and(|t| t > 0.0))
            .min_by(|x, y| time(x).unwrap_or(0.0).total_cmp(&time(y).unwrap_or(0.0)));
        lock.nodes.push(NodeChoice {
            signature: u.signature.clone(),
            label: u.label.clone(),
            op: u.op.to_string(),
            operands: u.operands.clone(),
            winner: figure(holder, winner),
            runner_up: runner_up.map(|c| figure(holder, c)),
            also: Vec::new(),
        });
    }
    lock
}

fn variant(name: String, plan: Arc<CapturePlan>, registry: &Registry) -> Result<Variant> {
    let exec = GraphExec::new(plan.clone(), registry)
        .with_context(|| format!("plan {name:?}: cannot prepare"))?;
    Ok(Variant {
        name,
        plan,
        exec,
        walls: Vec::new(),
        nodes: HashMap::new(),
        profiled: HashMap::new(),
    })
}

/// Warm-up, then `runs` rounds running every variant once, in turn.
fn measure(variants: &mut [Variant], inputs: &[Tensor], warmup: u32, runs: u32) -> Result<()> {
    for v in variants.iter_mut() {
        for _ in 0..warmup {
            let record =
                v.exec.run(inputs).with_context(|| format!("plan {:?}: run failed", v.name))?;
            for t in &record.timings {
                v.profiled.entry(t.node).or_default().push(t.nanos);
            }
        }
    }
    for _ in 0..runs {
        for v in variants.iter_mut() {
            let record =
                v.exec.run(inputs).with_context(|| format!("plan {:?}: run failed", v.name))?;
            v.walls.push(record.wall_nanos);
            record_nodes(v, &record);
        }
    }
    Ok(())
}

/// A run's time per (source node, kernel): what the engine reported per node, and for the
/// nodes of a partition it reported nothing for (ONNX Runtime after its first, profiled
/// run) the partition's time beyond the reported nodes', split in proportion to what the
/// engine reported for them when it did (else equally).
fn record_nodes(v: &mut Variant, record: &xpu_plan::RunRecord) {
    let mut reported: HashMap<NodeId, u64> = HashMap::new();
    for t in &record.timings {
        *reported.entry(t.node).or_default() += t.nanos;
        v.profiled.entry(t.node).or_default().push(t.nanos);
    }
    let weight = |n: &NodeId| v.profiled.get(n).map(|t| median(&mut t.clone()).max(1.0));
    for (part, &nanos) in v.plan.partitions.iter().zip(&record.partition_nanos) {
        let placed = |n: &NodeId| {
            let p = &v.plan.placements[n.index()];
            p.source.map(|s| (s, p.kernel.to_string()))
        };
        let known: u64 = part.nodes.iter().filter_map(|n| reported.get(n)).sum();
        let silent: Vec<NodeId> = part
            .nodes
            .iter()
            .copied()
            .filter(|n| !reported.contains_key(n) && v.plan.graph.node(*n).op != Op::Constant)
            .collect();
        let rest = nanos.saturating_sub(known) as f64;
        let weights: Option<Vec<f64>> = silent.iter().map(weight).collect();
        let total: f64 = weights.iter().flatten().sum();
        let mut times: Vec<(NodeId, u64)> = Vec::new();
        for n in &part.nodes {
            let t = match reported.get(n) {
                Some(&t) => t,
                None => match silent.iter().position(|s| s == n) {
                    Some(i) => match &weights {
                        Some(w) if total > 0.0 => (rest * w[i] / total) as u64,
                        _ => (rest / silent.len() as f64) as u64,
                    },
                    None => continue,
                },
            };
            times.push((*n, t));
        }
        for (n, t) in times {
            if let Some(key) = placed(&n) {
                v.nodes.entry(key).or_default().push(t);
            }
        }
    }
}

fn median(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2] as f64,
        n => (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0,
    }
}

/// Median µs and sample count per (node, kernel), over every variant that ran it.
fn node_times(variants: &[Variant]) -> HashMap<(NodeId, String), (f64, u32)> {
    let mut all: HashMap<(NodeId, String), Vec<u64>> = HashMap::new();
    for v in variants {
        for (k, t) in &v.nodes {
            all.entry(k.clone()).or_default().extend(t);
        }
    }
    all.into_iter()
        .map(|(k, mut t)| {
            let n = t.len() as u32;
            (k, (median(&mut t) / 1000.0, n))
        })
        .collect()
}

/// Each engine's cost per partition (µs): what its single-engine plan's median run took
/// beyond its nodes' medians, shared by its partitions.
fn partition_costs(
    variants: &[Variant],
    times: &HashMap<(NodeId, String), (f64, u32)>,
) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for v in variants {
        let mut walls = v.walls.clone();
        let wall = median(&mut walls) / 1000.0;
        let nodes: f64 = v.nodes.keys().filter_map(|k| times.get(k)).map(|t| t.0).sum();
        let parts = v.plan.partitions.len().max(1) as f64;
        let engine = v.name.trim_start_matches("only ").to_string();
        out.insert(engine, ((wall - nodes) / parts).max(0.0));
    }
    out
}

/// Per unit the candidate minimising the nodes' times plus a partition's cost at every
/// change of engine (a dynamic programme over the units in order). A unit without times
/// keeps its static choice.
fn cheapest_assignment(
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

fn plan_figure(v: &Variant) -> PlanFigure {
    let mut walls = v.walls.clone();
    let median_us = median(&mut walls) / 1000.0;
    walls.sort_unstable();
    let p90 = walls.get((walls.len() * 9).div_ceil(10).saturating_sub(1)).copied().unwrap_or(0);
    PlanFigure {
        name: v.name.clone(),
        median_us,
        p90_us: p90 as f64 / 1000.0,
        partitions: v.plan.partitions.len() as u32,
    }
}

fn report(lock: &LockFile, units: &[Unit]) {
    println!("plans (median of {} runs each, side by side):", lock.runs);
    let best = lock.plans.first().map_or(0.0, |p| p.median_us);
    for p in &lock.plans {
        println!(
            "  {:<24} {:>12}  p90 {:>12}  {} partition(s)  {:.2}x",
            p.name,
            micros(p.median_us),
            micros(p.p90_us),
            p.partitions,
            p.median_us / best.max(f64::MIN_POSITIVE)
        );
    }
    println!("nodes ({} units, {} signatures):", units.len(), lock.nodes.len());
    for n in &lock.nodes {
        let runner = n.runner_up.as_ref().map(|r| format!(" vs {r}")).unwrap_or_default();
        println!("  {:<28} {:<10} {}{runner}", n.label, n.op, n.winner);
    }
}

/// `xpuctl evidence PROGRAM --policy P`: per node, its candidates under the policy and the
/// figures the policy's lock has for its signature, and what the plan made of them.
pub fn evidence(
    program: &Path,
    policy: &str,
    bind: &[String],
    server: Option<&crate::client::Client>,
    json: bool,
) -> Result<()> {
    let policy = crate::policy_cmd::load_policy(Some(policy), &[])?;
    for w in &policy.warnings {
        eprintln!("{w}");
    }
    let g = Arc::new(crate::program::load(program)?);
    let bindings = crate::policy_cmd::parse_bindings(bind)?;
    let roots = xpu_runtime::program::data_roots_of(program);
    let registry = xpu_runtime::registry_for(roots.roots());
    let inventory = registry.inventory_for_engines(&g, policy.engines_it_may_place_on().as_ref());
    let optimised = optimised(&g, &policy);
    let (mut policy, mut notes) = (policy, Vec::new());
    let mut stored: BTreeMap<String, Vec<serde_json::Value>> = BTreeMap::new();
    if server.is_some() && policy.spec.measured.lock.is_some() {
        notes.push("the policy names a lock, which xpud reads instead of its store".into());
    }
    if let Some(client) = server.filter(|_| policy.spec.measured.lock.is_none()) {
        // Every node's signature, from the graph the plan is made of (no plan needed).
        let sigs: Vec<String> = optimised
            .node_ids()
            .filter(|&id| optimised.node(id).op != Op::Constant)
            .map(|id| node_signature(&optimised, id, &bindings))
            .collect();
        let (machine, figures) = store_evidence(client, &sigs, &mut stored)?;
        // The machine as xpud fingerprints it: every engine of this build, not only those
        // the program could use.
        let here = Machine::of(&registry.inventory());
        if machine == here.fingerprint() {
            policy = policy.with_evidence(Arc::new(Evidence::from_store("store", here, figures)));
        } else {
            notes.push(format!(
                "xpud's machine ({machine}) is not this one ({}): its figures are shown, the plan is this machine's without them",
                here.fingerprint()
            ));
        }
    }
    let (_, ex) = plan(&g, &policy, &inventory, &bindings)?;
    let lock = policy.resolved().evidence.clone();
    let mut rows = Vec::new();
    for u in units(&optimised, &ex, &bindings) {
        let d = &ex.decisions[u.node.index()];
        let entry = lock.as_ref().and_then(|e| e.node(&u.signature)).map(|(_, n)| n.clone());
        let store_rows = stored.get(&u.signature).cloned().unwrap_or_default();
        rows.push(serde_json::json!({
            "node": u.label,
            "op": u.op,
            "signature": u.signature,
            "operands": u.operands,
            "candidates": allowed_kernels(d),
            "chosen": d.chosen.as_ref().map(|c| c.kernel.to_string()),
            "rule": d.rule.as_ref().map(|r| r.key.to_string()),
            "winner": entry.as_ref().map(|n| n.winner.to_string()),
            "runner_up": entry.as_ref().and_then(|n| n.runner_up.as_ref().map(|r| r.to_string())),
            "evidence": d.measured.as_ref().map(|m| serde_json::json!({
                "code": m.code.map(|c| c.name()),
                "detail": m.detail,
            })),
            "store": server.map(|_| store_rows),
        }));
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    if json {
        let doc = serde_json::json!({ "evidence": ex.evidence, "nodes": rows, "notes": notes });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    match &ex.evidence {
        Some(e) => println!(
            "evidence: {}{}",
            e.describe(),
            e.unused.as_ref().map(|w| format!(", not used: {w}")).unwrap_or_default()
        ),
        None => println!(
            "evidence: none (the policy sets no [measured] lock, or chooses nothing by measurement)"
        ),
    }
    for r in &rows {
        let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
        println!("{} {} [{}] {}", s("node"), s("op"), s("signature"), s("operands"));
        let candidates: Vec<&str> =
            r["candidates"].as_array().into_iter().flatten().filter_map(|c| c.as_str()).collect();
        println!(
            "    candidates: {}; chosen {} by {}",
            candidates.join(", "),
            s("chosen"),
            s("rule")
        );
        if r["winner"].is_string() {
            let runner = r["runner_up"].as_str().map(|x| format!(" vs {x}")).unwrap_or_default();
            println!("    measured: {}{runner}", s("winner"));
        }
        for f in r["store"].as_array().into_iter().flatten() {
            println!(
                "    store: {} median {} p90 {} over {} run(s)",
                f["kernel"].as_str().unwrap_or("-"),
                micros(f["median_us"].as_f64().unwrap_or(0.0)),
                micros(f["p90_us"].as_f64().unwrap_or(0.0)),
                f["samples"].as_u64().unwrap_or(0)
            );
        }
        if let Some(code) = r["evidence"]["code"].as_str() {
            println!("    {code}: {}", r["evidence"]["detail"].as_str().unwrap_or(""));
        }
    }
    Ok(())
}

/// The figures xpud's store holds for `signatures`: its machine's fingerprint, the figures
/// as evidence, and per signature the rows as it sent them (for printing).
fn store_evidence(
    client: &crate::client::Client,
    signatures: &[String],
    rows_by_signature: &mut BTreeMap<String, Vec<serde_json::Value>>,
) -> Result<(String, Vec<SignatureFigure>)> {
    let mut distinct: Vec<&String> = signatures.iter().collect();
    distinct.sort();
    distinct.dedup();
    let list = distinct.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",");
    let doc = client.get_query("/v1/evidence", &[("signatures", list)])?;
    let machine = doc["machine"].as_str().unwrap_or_default().to_string();
    let mut figures = Vec::new();
    for r in doc["rows"].as_array().into_iter().flatten() {
        let text = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        rows_by_signature.entry(text("signature")).or_default().push(r.clone());
        figures.push(SignatureFigure {
            signature: text("signature"),
            figure: Figure {
                engine: text("engine"),
                kernel: text("kernel"),
                median_us: r["median_us"].as_f64().unwrap_or(0.0),
                samples: r["samples"].as_u64().unwrap_or(0).min(u64::from(u32::MAX)) as u32,
            },
        });
    }
    Ok((machine, figures))
}

/// Every kernel the policy allows for a decided node, the chosen one first: those the walk
/// set aside only by the order, by measurement or to explore — kernels of one engine too
/// (what measured choice compares; `tune` measures one kernel per engine).
fn allowed_kernels(d: &xpu_plan::Decision) -> Vec<String> {
    let mut out: Vec<String> = d.chosen.iter().map(|c| c.kernel.to_string()).collect();
    for r in d.rejected.iter() {
        let allowed = matches!(
            r.code,
            ReasonCode::Outranked
                | ReasonCode::KernelDegraded
                | ReasonCode::MeasuredSlower
                | ReasonCode::Exploring
        );
        if let (true, Some(k)) = (allowed, &r.kernel)
            && !out.contains(k)
        {
            out.push(k.clone());
        }
    }
    out
}
