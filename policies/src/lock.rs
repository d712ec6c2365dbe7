//! Lock files: measured choices written by `xpuctl tune` beside a policy (`P.lock.toml`),
//! reviewed in git like the policy, and read by a policy that says `[measured] lock = …`
//! with `choose = "measured"`. Per node signature the lock names the winner and the
//! runner-up with their medians and sample counts; it also records the machine it was
//! measured on and the whole-model times of the plans `tune` compared.
//!
//! A lock is untrusted input: it is parsed strictly (unknown keys, wrong types, duplicate
//! signatures, a newer format) with `line:column` in every message, and a lock that cannot
//! be used leaves the policy usable — the planner falls back to the static order and
//! records why.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// The lock format this build reads and writes.
pub const LOCK_VERSION: u32 = 1;

/// Where a lock file can be read from at most (bytes): a lock has a few lines per node.
pub const MAX_LOCK_BYTES: usize = 16 << 20;

/// Whether `path` names a policy file: `*.toml` but not a lock (`*.lock.toml`), which
/// lives beside its policy. Directory scans (xpud's policy directories, `xpuctl policy
/// check DIR`, label selection) take only these.
pub fn is_policy_file(path: &std::path::Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".toml") && !name.ends_with(".lock.toml")
}

/// A lock file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockFile {
    pub version: u32,
    /// The program measured (its file name) and its graph's content hash.
    pub program: String,
    pub graph_sha256: String,
    /// The policy the candidates were allowed by.
    pub policy: String,
    /// Timed runs per plan (after warm-up).
    pub runs: u32,
    pub machine: Machine,
    /// The whole-model plans `tune` compared, the one the lock encodes first.
    #[serde(default, rename = "plan", skip_serializing_if = "Vec::is_empty")]
    pub plans: Vec<PlanFigure>,
    #[serde(default, rename = "node", skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeChoice>,
}

/// The machine a lock was measured on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// CPU model as the OS reports it.
    pub cpu: String,
    /// The instruction-set features that change kernels (`avx2`, `avx512f`, `amx_tile` …).
    #[serde(default)]
    pub features: Vec<String>,
    /// Engine → version of the engines measured.
    #[serde(default)]
    pub engines: BTreeMap<String, String>,
}

impl Machine {
    /// This machine as the inventory describes it: its host and the versions of the
    /// engines available on it.
    pub fn of(inventory: &xpu_engine::Inventory) -> Machine {
        let host = inventory.host.clone().unwrap_or_default();
        let engines = inventory
            .engines
            .iter()
            .filter(|c| c.availability.is_available())
            .map(|c| (c.engine.clone(), c.version.clone()))
            .collect();
        Machine { cpu: host.cpu, features: host.features, engines }
    }

    /// 16 hex digits of SHA-256 over the CPU model, its features and the engine versions:
    /// what the store files every run's timings under, so figures from one machine (or
    /// one version of an engine) never decide on another.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(self.cpu.as_bytes());
        for f in &self.features {
            h.update([0]);
            h.update(f.as_bytes());
        }
        for (engine, version) in &self.engines {
            h.update([1]);
            h.update(engine.as_bytes());
            h.update([2]);
            h.update(version.as_bytes());
        }
        h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

/// One whole-model plan `tune` ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFigure {
    /// `measured` (the lock's own plan), or `only <engine>` (every node the engine can run
    /// on it).
    pub name: String,
    pub median_us: f64,
    pub p90_us: f64,
    pub partitions: u32,
}

/// The measured choice for every node with one signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeChoice {
    pub signature: String,
    /// For the reader: the node's label, op and operand types when it was measured.
    #[serde(default)]
    pub label: String,
    #[serde(default)]
    pub op: String,
    #[serde(default)]
    pub operands: String,
    pub winner: Figure,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_up: Option<Figure>,
    /// The other candidates measured, fastest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<Figure>,
}

impl NodeChoice {
    /// Every candidate measured for the signature, fastest first.
    pub fn figures(&self) -> impl Iterator<Item = &Figure> {
        std::iter::once(&self.winner).chain(&self.runner_up).chain(&self.also)
    }

    /// The figure of `kernel`, if it was measured.
    pub fn figure(&self, kernel: &str) -> Option<&Figure> {
        self.figures().find(|f| f.kernel == kernel)
    }
}

/// Per-signature figures of one candidate, as a store aggregates them from its runs.
#[derive(Clone, Debug, PartialEq)]
pub struct SignatureFigure {
    /// 16 hex digits.
    pub signature: String,
    pub figure: Figure,
}

/// A candidate's measured time on one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    pub engine: String,
    pub kernel: String,
    pub median_us: f64,
    pub samples: u32,
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} median {} over {} run(s)", self.kernel, micros(self.median_us), self.samples)
    }
}

/// `41.0 µs`, `1.250 ms`.
pub fn micros(us: f64) -> String {
    if us >= 1000.0 { format!("{:.3} ms", us / 1000.0) } else { format!("{us:.1} µs") }
}

/// A lock that cannot be read, with where.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", location.map(|(l, c)| format!(":{l}:{c}")).unwrap_or_default())]
pub struct LockError {
    pub file: String,
    pub location: Option<(usize, usize)>,
    pub message: String,
}

impl LockFile {
    /// Parses a lock's text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<LockFile, LockError> {
        let err = |location, message: String| LockError { file: file.into(), location, message };
        if text.len() > MAX_LOCK_BYTES {
            return Err(err(
                None,
                format!("{} bytes, over the {MAX_LOCK_BYTES}-byte limit", text.len()),
            ));
        }
        let lock: LockFile = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| line_col(text, s.start));
            err(at, e.message().trim().to_string())
        })?;
        if lock.version != LOCK_VERSION {
            let at = find_line(text, "version");
            return Err(err(
                at,
                format!(
                    "lock format {} is not supported (this build reads {LOCK_VERSION})",
                    lock.version
                ),
            ));
        }
        for (i, p) in lock.plans.iter().enumerate() {
            if ![p.median_us, p.p90_us].iter().all(|t| t.is_finite() && *t >= 0.0) {
                let at = find_nth_line(text, "median_us", i);
                return Err(err(at, format!("plan[{i}]: times must be finite and ≥ 0")));
            }
        }
        let mut seen = HashMap::new();
        for (i, n) in lock.nodes.iter().enumerate() {
            let at = find_nth_line(text, "signature", i);
            if n.signature.len() != 16 || !n.signature.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err(
                    at,
                    format!("node[{i}].signature {:?} is not 16 hex digits", n.signature),
                ));
            }
            if let Some(first) = seen.insert(n.signature.as_str(), i) {
                return Err(err(at, format!("node[{i}] repeats the signature of node[{first}]")));
            }
            let also = n.also.iter().map(|r| ("also.", r));
            for (what, f) in std::iter::once(("", &n.winner))
                .chain(n.runner_up.iter().map(|r| ("runner_up.", r)))
                .chain(also)
            {
                if !(f.median_us.is_finite() && f.median_us >= 0.0) {
                    return Err(err(
                        at,
                        format!("node[{i}].{what}median_us must be a finite time ≥ 0"),
                    ));
                }
                if xpu_engine::catalog::engine_of(&f.kernel) != f.engine {
                    return Err(err(
                        at,
                        format!(
                            "node[{i}].{what}kernel {:?} is not a kernel of engine {:?}",
                            f.kernel, f.engine
                        ),
                    ));
                }
            }
        }
        Ok(lock)
    }

    /// The lock as TOML, nodes in the order given (tune writes them in graph order).
    pub fn to_toml(&self) -> String {
        let body = toml::to_string_pretty(self).expect("a lock serializes");
        format!(
            "# Measured choices for {} under policy {:?}, written by `xpuctl tune`.\n\
             # Review it like code; `xpuctl tune` again refreshes it.\n\n{body}",
            self.program, self.policy
        )
    }
}

/// A lock as a policy holds it: the file, its digest and what it says (or why it cannot
/// be used).
#[derive(Clone, Debug, PartialEq)]
pub struct Evidence {
    /// The path as the policy gives it, and where that key is set.
    pub source: Arc<str>,
    /// SHA-256 of the lock's bytes (first 16 hex digits): plans made with it say which.
    pub sha256: Arc<str>,
    pub lock: Result<Arc<LockFile>, LockError>,
    by_signature: HashMap<u64, usize>,
    /// Whether plans made with it may explore candidates the evidence is thin on (a
    /// daemon's store, on the runs its `[tuning]` share lets explore; never a lock).
    pub explore: bool,
    /// Aggregated from a store's runs rather than read from a lock.
    pub from_store: bool,
}

impl Evidence {
    pub fn new(source: &str, bytes: &[u8], lock: Result<LockFile, LockError>) -> Evidence {
        use sha2::{Digest, Sha256};
        let sha256: String =
            Sha256::digest(bytes).iter().take(8).map(|b| format!("{b:02x}")).collect();
        let by_signature = match &lock {
            Ok(l) => l
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| u64::from_str_radix(&n.signature, 16).ok().map(|s| (s, i)))
                .collect(),
            Err(_) => HashMap::new(),
        };
        Evidence {
            source: source.into(),
            sha256: sha256.into(),
            lock: lock.map(Arc::new),
            by_signature,
            explore: false,
            from_store: false,
        }
    }

    /// Evidence from a store's figures for `machine`: per signature every candidate
    /// measured, fastest first (ties by kernel name, so the same figures make the same
    /// evidence). Named `source` (`store`), its digest that of the figures.
    pub fn from_store(source: &str, machine: Machine, figures: Vec<SignatureFigure>) -> Evidence {
        let mut by_sig: BTreeMap<String, Vec<Figure>> = BTreeMap::new();
        for f in figures {
            by_sig.entry(f.signature).or_default().push(f.figure);
        }
        let nodes = by_sig
            .into_iter()
            .map(|(signature, mut figs)| {
                figs.sort_by(|a, b| {
                    a.median_us.total_cmp(&b.median_us).then_with(|| a.kernel.cmp(&b.kernel))
                });
                let mut figs = figs.into_iter();
                let winner = figs.next().expect("a signature has a figure");
                NodeChoice {
                    signature,
                    label: String::new(),
                    op: String::new(),
                    operands: String::new(),
                    winner,
                    runner_up: figs.next(),
                    also: figs.collect(),
                }
            })
            .collect();
        let lock = LockFile {
            version: LOCK_VERSION,
            program: "(every program)".into(),
            graph_sha256: String::new(),
            policy: "(every policy)".into(),
            runs: 0,
            machine,
            plans: Vec::new(),
            nodes,
        };
        let digest = material_digest(&lock.nodes);
        let mut e = Evidence::new(source, b"", Ok(lock));
        e.sha256 = digest.into();
        e.from_store = true;
        e
    }

    /// How explanations name it: `lock P.lock.toml`, or `store` (a daemon's runs).
    pub fn describe(&self) -> String {
        if self.from_store { "store".into() } else { format!("lock {}", self.source) }
    }

    /// The same evidence, for plans that may explore: its digest says so (plans made
    /// either way are cached apart).
    pub fn exploring(&self) -> Evidence {
        let mut e = self.clone();
        e.explore = true;
        e.sha256 = format!("{}+explore", self.sha256).into();
        e
    }

    /// A lock that could not be read at all (missing, unreadable, outside the data roots).
    pub fn unreadable(source: &str, error: LockError) -> Evidence {
        Evidence::new(source, b"", Err(error))
    }

    /// Why this lock's figures do not hold on the machine `inventory` describes: another
    /// CPU or feature set (when the inventory names its host), or another version of an
    /// engine the lock measured. `None`: they hold.
    pub fn mismatch(&self, inventory: &xpu_engine::Inventory) -> Option<String> {
        let lock = self.lock.as_ref().ok()?;
        let m = &lock.machine;
        if let Some(host) = &inventory.host {
            if host.cpu != m.cpu {
                return Some(format!(
                    "it was measured on {:?}; this machine is {:?}",
                    m.cpu, host.cpu
                ));
            }
            if host.features != m.features {
                return Some(format!(
                    "it was measured with CPU features [{}]; this machine has [{}]",
                    m.features.join(", "),
                    host.features.join(", ")
                ));
            }
        }
        for (engine, version) in &m.engines {
            if let Some(c) = inventory.engine(engine)
                && c.availability.is_available()
                && c.version != *version
            {
                return Some(format!(
                    "it measured {engine} {version}; this machine has {engine} {}",
                    c.version
                ));
            }
        }
        None
    }

    /// The measured choice for a node signature (16 hex digits).
    pub fn node(&self, signature: &str) -> Option<(usize, &NodeChoice)> {
        self.node_bits(u64::from_str_radix(signature, 16).ok()?)
    }

    /// [`Evidence::node`] by the signature's 64 bits.
    pub fn node_bits(&self, signature: u64) -> Option<(usize, &NodeChoice)> {
        let lock = self.lock.as_ref().ok()?;
        self.by_signature.get(&signature).map(|&i| (i, &lock.nodes[i]))
    }
}

/// Sample counts at or past this are alike to a store's digest: `[measured] min_samples`
/// and `explore_runs` stop at it.
pub const SAMPLES_DIGESTED: u32 = 100;

/// What a plan can depend on in a store's figures, hashed: per signature the candidates
/// in order, their sample counts up to [`SAMPLES_DIGESTED`] and each median's distance
/// from the fastest in 10 % steps (what `max_slowdown` compares). Figures that move
/// within these keep the digest, so plans and prepared executables are not made again
/// for every new run.
fn material_digest(nodes: &[NodeChoice]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for n in nodes {
        h.update(n.signature.as_bytes());
        let best = n.winner.median_us.max(1e-3);
        for f in n.figures() {
            let steps = ((f.median_us.max(1e-3) / best).ln() / 1.1f64.ln()).round() as i64;
            h.update([0]);
            h.update(f.kernel.as_bytes());
            h.update(f.samples.min(SAMPLES_DIGESTED).to_le_bytes());
            h.update(steps.to_le_bytes());
        }
        h.update([1]);
    }
    h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

fn find_line(text: &str, key: &str) -> Option<(usize, usize)> {
    find_nth_line(text, key, 0)
}

/// The line of the `n`-th line that sets `key` (`key =`), for messages about a value.
fn find_nth_line(text: &str, key: &str, n: usize) -> Option<(usize, usize)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            l.trim_start().strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('='))
        })
        .nth(n)
        .map(|(i, _)| (i + 1, 1))
}
