//! Running whole-model plans side by side and reading node times out of their runs.
//!
//! Plans run in rounds of blocks: each round runs every plan a few times in a row, after
//! untimed runs for 20 ms, each round starting one plan later. On a host with
//! few cores, an engine's threads keep spinning for a while after its run (the cpu
//! engine's team, rayon, OpenVINO's TBB); a plan timed right after another engine's run
//! pays for that engine's spinning, so strict alternation measures the order of the plans
//! as much as the plans. The untimed runs absorb it. Each round's median is kept so plans
//! can be compared round by round (paired), which cancels the drift of a shared machine.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use xpu_engine::Registry;
use xpu_ir::{NodeId, Op, Tensor};
use xpu_plan::{CapturePlan, GraphExec, RunRecord};
use xpu_policy::lock::PlanFigure;

/// Most rounds a measurement is split into.
const ROUNDS: u32 = 5;

/// Per placement: engine, kernel, partition.
type PlanKey = Vec<(Arc<str>, Arc<str>, usize)>;

/// Most per-node times kept per node to weigh partitions' shares by.
const PROFILED: usize = 32;

/// How long a plan runs untimed before each block.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(20);

/// A plan this many times slower than the fastest on its second warm-up run is out of the
/// race: that run is its figure (a naive kernel's plan need not run fifty times to lose).
const RACE: f64 = 4.0;

/// A whole-model plan under test and what its runs measured.
pub(super) struct Variant {
    /// What the plan is called in the report: every name that led to this same plan.
    pub names: Vec<String>,
    /// The engine a single-engine or single-kernel plan favours.
    pub engine: Option<String>,
    /// Per unit, the candidate the plan was steered to (`None`: the static choice).
    pub picks: Vec<Option<usize>>,
    plan: Arc<CapturePlan>,
    /// Which placements the plan makes ([`Variant::key`]).
    key: PlanKey,
    /// `None` once retired (its executables released in the workers).
    exec: Option<GraphExec>,
    walls: Vec<u64>,
    /// The median wall time of each round's block.
    rounds: Vec<f64>,
    /// (source node, kernel) → its times.
    nodes: HashMap<(NodeId, String), Vec<u64>>,
    /// Planned node → the times its engine reported for it in any run, warm-up included
    /// (ONNX Runtime and OpenVINO report them on their first, profiled run only).
    profiled: HashMap<NodeId, Vec<u64>>,
    warmed: bool,
    /// Out of the race (see [`RACE`]), or not in the finals.
    out: bool,
    /// Why its figures are not from the last measurement, for the report.
    note: Option<&'static str>,
}

impl Variant {
    pub fn name(&self) -> String {
        self.names.join(" = ")
    }

    pub fn partitions(&self) -> usize {
        self.plan.partitions.len()
    }

    fn run(&mut self, inputs: &[Tensor]) -> Result<RunRecord> {
        let result = match self.exec.as_mut() {
            Some(exec) => exec.run(inputs),
            None => anyhow::bail!("plan {:?} was retired", self.name()),
        };
        let record = result.with_context(|| format!("plan {:?}: run failed", self.name()))?;
        for t in &record.timings {
            // Enough to weigh a node by; engines that time every run would grow it forever.
            let seen = self.profiled.entry(t.node).or_default();
            if seen.len() < PROFILED {
                seen.push(t.nanos);
            }
        }
        Ok(record)
    }

    pub fn figure(&self) -> PlanFigure {
        let mut walls = self.walls.clone();
        let median_us = median(&mut walls) / 1000.0;
        let p90 = walls.get((walls.len() * 9).div_ceil(10).saturating_sub(1)).copied().unwrap_or(0);
        PlanFigure {
            name: match self.note {
                Some(note) => format!("{} ({note})", self.name()),
                None => self.name(),
            },
            median_us,
            p90_us: p90 as f64 / 1000.0,
            partitions: self.partitions() as u32,
        }
    }

    /// Which placements the plan makes: equal keys, equal plans.
    fn key(plan: &CapturePlan) -> PlanKey {
        plan.placements.iter().map(|p| (p.engine.clone(), p.kernel.clone(), p.partition)).collect()
    }
}

/// The plans of one `tune`, each prepared once.
pub(super) struct Variants<'r> {
    registry: &'r Registry,
    pub list: Vec<Variant>,
}

impl<'r> Variants<'r> {
    pub fn new(registry: &'r Registry) -> Self {
        Variants { registry, list: Vec::new() }
    }

    /// Adds a plan (prepared now) and returns its index; a plan equal to one already
    /// added is that one, under one more name.
    pub fn add(
        &mut self,
        name: String,
        engine: Option<String>,
        picks: Vec<Option<usize>>,
        plan: Arc<CapturePlan>,
    ) -> Result<usize> {
        let key = Variant::key(&plan);
        if let Some(i) = self.list.iter().position(|v| v.key == key) {
            self.list[i].names.push(name);
            return Ok(i);
        }
        let exec = GraphExec::new(plan.clone(), self.registry)
            .with_context(|| format!("plan {name:?}: cannot prepare"))?;
        self.list.push(Variant {
            names: vec![name],
            engine,
            picks,
            plan,
            key,
            exec: Some(exec),
            walls: Vec::new(),
            rounds: Vec::new(),
            nodes: HashMap::new(),
            profiled: HashMap::new(),
            warmed: false,
            out: false,
            note: None,
        });
        Ok(self.list.len() - 1)
    }

    /// The fastest plan's median (µs) so far.
    pub fn fastest_median_us(&self) -> f64 {
        self.list.iter().map(|v| v.figure().median_us).fold(f64::INFINITY, f64::min)
    }

    /// Whether `plan` makes the same placements as plan `i`.
    pub fn plans_as(&self, i: usize, plan: &CapturePlan) -> bool {
        self.list[i].key == Variant::key(plan)
    }

    /// Retires every plan but `keep`: out of the race, its figures kept, its executables
    /// released (an engine's threads for a plan that lost no longer weigh on the others).
    pub fn retire_all_but(&mut self, keep: &[usize]) {
        for (i, v) in self.list.iter_mut().enumerate() {
            if !keep.contains(&i) {
                v.out = true;
                v.exec = None;
                v.note.get_or_insert("not in the finals");
            }
        }
    }

    /// Puts `i` back in the race (the plans every comparison needs).
    pub fn keep(&mut self, i: usize) {
        self.list[i].out = false;
        self.list[i].note = None;
    }

    /// Warms every plan not yet warmed (at least two runs each, in turn: the first
    /// profiles and compiles, so it says nothing of speed), racing them on the second when
    /// `race` (a plan out of the race keeps that run as its figure), then runs `runs` timed runs of every plan
    /// in the race, in rounds of blocks. Earlier walls and rounds are dropped; node times
    /// accumulate.
    pub fn measure(&mut self, inputs: &[Tensor], warmup: u32, runs: u32, race: bool) -> Result<()> {
        for v in self.list.iter_mut().filter(|v| !v.out) {
            v.walls.clear();
            v.rounds.clear();
        }
        let fresh: Vec<usize> = (0..self.list.len()).filter(|&i| !self.list[i].warmed).collect();
        for pass in 0..warmup.max(2) {
            let mut ran: Vec<(usize, RunRecord)> = Vec::new();
            for &i in &fresh {
                if !self.list[i].out {
                    ran.push((i, self.list[i].run(inputs)?));
                }
            }
            let fastest = ran.iter().map(|(_, r)| r.wall_nanos).min().unwrap_or(0) as f64;
            for (i, record) in ran.iter().filter(|_| race && pass == 1) {
                if record.wall_nanos as f64 > RACE * fastest {
                    // Out: this run is its figure.
                    let v = &mut self.list[*i];
                    v.out = true;
                    v.note = Some("raced out");
                    v.walls.push(record.wall_nanos);
                    v.rounds.push(record.wall_nanos as f64);
                    record_nodes(v, record);
                }
            }
        }
        for &i in &fresh {
            self.list[i].warmed = true;
        }
        let rounds = runs.clamp(1, ROUNDS);
        let per = runs.div_ceil(rounds);
        let n = self.list.len();
        for round in 0..rounds as usize {
            // Each round starts one plan later: no plan always follows the same one.
            for i in (0..n).map(|k| (k + round) % n) {
                let v = &mut self.list[i];
                if v.out {
                    continue;
                }
                settle(v, inputs)?;
                let mut block = Vec::with_capacity(per as usize);
                for _ in 0..per {
                    let record = v.run(inputs)?;
                    v.walls.push(record.wall_nanos);
                    block.push(record.wall_nanos);
                    record_nodes(v, &record);
                }
                v.rounds.push(median(&mut block));
            }
        }
        Ok(())
    }

    /// How `i` compares with `reference`: the median over rounds of their rounds' ratio
    /// (paired, so the machine's drift between rounds cancels); by whole medians when
    /// either ran no rounds (out of the race).
    pub fn relative(&self, i: usize, reference: usize) -> f64 {
        let (a, b) = (&self.list[i], &self.list[reference]);
        if a.out || b.out || a.rounds.len() != b.rounds.len() {
            return a.figure().median_us / b.figure().median_us.max(f64::MIN_POSITIVE);
        }
        let mut ratios: Vec<f64> =
            a.rounds.iter().zip(&b.rounds).map(|(x, y)| x / y.max(f64::MIN_POSITIVE)).collect();
        ratios.sort_by(f64::total_cmp);
        match ratios.len() {
            0 => 1.0,
            n if n % 2 == 1 => ratios[n / 2],
            n => (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0,
        }
    }

    /// Median µs and sample count per (node, kernel), over every plan that ran it.
    pub fn node_times(&self) -> HashMap<(NodeId, String), (f64, u32)> {
        let mut all: HashMap<(NodeId, String), Vec<u64>> = HashMap::new();
        for v in &self.list {
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

    /// Each engine's cost per partition (µs): what its single-engine plan's median run
    /// took beyond its nodes' medians, shared by its partitions.
    pub fn partition_costs(
        &self,
        times: &HashMap<(NodeId, String), (f64, u32)>,
    ) -> HashMap<String, f64> {
        let mut out = HashMap::new();
        for v in &self.list {
            let Some(engine) = &v.engine else { continue };
            let wall = v.figure().median_us;
            let nodes: f64 = v.nodes.keys().filter_map(|k| times.get(k)).map(|t| t.0).sum();
            let parts = v.partitions().max(1) as f64;
            out.entry(engine.clone()).or_insert(((wall - nodes) / parts).max(0.0));
        }
        out
    }
}

/// Untimed runs of `v` for at least [`SETTLE`] (one at least): the previous plan's engine
/// threads go idle, this plan's wake up.
fn settle(v: &mut Variant, inputs: &[Tensor]) -> Result<()> {
    let start = std::time::Instant::now();
    v.run(inputs)?;
    while start.elapsed() < SETTLE {
        v.run(inputs)?;
    }
    Ok(())
}

/// A run's time per (source node, kernel): what the engine reported per node, and for the
/// nodes of a partition it reported nothing for (ONNX Runtime and OpenVINO after their
/// first, profiled run) the partition's time beyond the reported nodes', split in
/// proportion to what the engine reported for them when it did ([`spread_over_fused`]);
/// equal shares where the profile named none of them.
fn record_nodes(v: &mut Variant, record: &RunRecord) {
    let mut reported: HashMap<NodeId, u64> = HashMap::new();
    for t in &record.timings {
        *reported.entry(t.node).or_default() += t.nanos;
    }
    for (part, &nanos) in v.plan.partitions.iter().zip(&record.partition_nanos) {
        let known: u64 = part.nodes.iter().filter_map(|n| reported.get(n)).sum();
        let silent: Vec<NodeId> = part
            .nodes
            .iter()
            .copied()
            .filter(|n| !reported.contains_key(n) && v.plan.graph.node(*n).op != Op::Constant)
            .collect();
        let rest = nanos.saturating_sub(known) as f64;
        let profiled: Vec<f64> = silent
            .iter()
            .map(|n| v.profiled.get(n).map_or(0.0, |t| median(&mut t.clone()).max(1.0)))
            .collect();
        let weights = spread_over_fused(&profiled);
        let total: f64 = weights.iter().sum();
        let share = |i: usize| match total > 0.0 {
            true => rest * weights[i] / total,
            false => rest / silent.len() as f64,
        };
        for n in &part.nodes {
            let t = match (reported.get(n), silent.iter().position(|s| s == n)) {
                (Some(&t), _) => t,
                (None, Some(i)) => share(i) as u64,
                (None, None) => continue,
            };
            let p = &v.plan.placements[n.index()];
            if let Some(source) = p.source {
                v.nodes.entry((source, p.kernel.to_string())).or_default().push(t);
            }
        }
    }
}

/// Per node of a partition (in order), its share of the profiled times: a node the profile
/// did not name shares the time of the next node it named (OpenVINO names a fused layer
/// after its last node: `MatMul, Add` run as one layer named after the `Add`), and nodes
/// after the last named one share its time. None named: all zero.
fn spread_over_fused(profiled: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; profiled.len()];
    let mut start = 0;
    let mut last: Option<(usize, usize)> = None;
    for (i, &w) in profiled.iter().enumerate() {
        if w > 0.0 {
            let members = (i - start + 1) as f64;
            out[start..=i].iter_mut().for_each(|o| *o = w / members);
            last = Some((start, i));
            start = i + 1;
        }
    }
    if let Some((from, to)) = last.filter(|_| start < profiled.len()) {
        let w: f64 = out[from..=to].iter().sum();
        let members = (profiled.len() - from) as f64;
        out[from..].iter_mut().for_each(|o| *o = w / members);
    }
    out
}

pub(super) fn median(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2] as f64,
        n => (v[n / 2 - 1] + v[n / 2]) as f64 / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::spread_over_fused;

    #[test]
    fn a_fused_layers_time_is_shared_by_the_nodes_it_ran() {
        // MatMul, Add (one layer named after the Add), Relu (its own layer), then a MatMul
        // and Add after the last named layer.
        let got = spread_over_fused(&[0.0, 40.0, 10.0, 0.0, 0.0]);
        assert_eq!(got, vec![20.0, 20.0, 10.0 / 3.0, 10.0 / 3.0, 10.0 / 3.0]);
        assert_eq!(spread_over_fused(&[0.0, 0.0]), vec![0.0, 0.0]);
        assert_eq!(spread_over_fused(&[]), Vec::<f64>::new());
        assert_eq!(spread_over_fused(&[5.0]), vec![5.0]);
    }
}
