//! Measured choice: a lock's winner replaces the static order's choice where the policy
//! allows it, with the figures in the explanation; missing, thin, foreign or broken
//! evidence leaves the static order and says why; lock files are untrusted input.

use std::collections::BTreeMap;
use std::path::Path;

use xpu_engine::Inventory;
use xpu_plan::evidence::node_signature;
use xpu_plan::{Decision, Explanation, ReasonCode};
use xpu_policy::lock::{Figure, LOCK_VERSION, LockFile, Machine, NodeChoice};
use xpu_policy::{Loader, Policy};

const GRAPH: &str = r#"graph "t" {
  %0: f32[4,8] = input "x"
  %1: f32[8,8] = input "w"
  %2: f32[4,8] = matmul(%0, %1) @name("fc")
  %3: f32[4,8] = add(%2, %0) @name("fc.bias")
  return "y" = %3
}"#;

const INVENTORY: &str = r#"
name = "test-box"
[[engines]]
engine = "ort"
version = "1.23"
availability = { status = "available" }
devices = [{ id = "host" }]
kernels = [{ name = "ort.cpu", classes = ["matmul", "binary"], dtypes = ["f32"] }]
[[engines]]
engine = "cpu"
version = "0.1.0"
availability = { status = "available" }
devices = [{ id = "host" }]
kernels = [
  { name = "cpu.blas", ops = ["matmul"], dtypes = ["f32"] },
  { name = "cpu.naive", classes = ["matmul", "binary", "constant"], dtypes = ["f32"] },
]
[host]
cpu = "Test CPU"
features = ["avx2"]
"#;

fn graph() -> xpu_ir::Graph {
    xpu_ir::text::parse(GRAPH).unwrap()
}

fn figure(kernel: &str, us: f64, samples: u32) -> Figure {
    Figure {
        engine: xpu_engine::catalog::engine_of(kernel).into(),
        kernel: kernel.into(),
        median_us: us,
        samples,
    }
}

/// A lock saying cpu.blas beats ort.cpu on the matmul.
fn lock(samples: u32) -> LockFile {
    let g = graph();
    let fc = g.node_ids().find(|&id| g.node(id).name.as_deref() == Some("fc")).unwrap();
    LockFile {
        version: LOCK_VERSION,
        program: "t.sgr".into(),
        graph_sha256: g.content_hash(),
        policy: "t".into(),
        runs: samples,
        machine: Machine {
            cpu: "Test CPU".into(),
            features: vec!["avx2".into()],
            engines: BTreeMap::from([
                ("cpu".into(), "0.1.0".into()),
                ("ort".into(), "1.23".into()),
            ]),
        },
        plans: Vec::new(),
        nodes: vec![NodeChoice {
            signature: node_signature(&g, fc, &BTreeMap::new()),
            label: "fc".into(),
            op: "matmul".into(),
            operands: String::new(),
            winner: figure("cpu.blas", 4.0, samples),
            runner_up: Some(figure("ort.cpu", 9.5, samples)),
            also: Vec::new(),
        }],
    }
}

/// A policy file (and its lock, as text) in a directory of their own.
fn policy_with(dir: &Path, fragment: &str, lock_text: Option<&str>) -> Policy {
    if let Some(text) = lock_text {
        std::fs::write(dir.join("p.lock.toml"), text).unwrap();
    }
    let path = dir.join("p.toml");
    std::fs::write(&path, format!("[policy]\nname = \"t\"\n{fragment}")).unwrap();
    Loader::new().load(&path).unwrap_or_else(|e| panic!("policy does not load: {e}"))
}

const MEASURED: &str = "[engines]\nchoose = \"measured\"\n[measured]\nlock = \"p.lock.toml\"\n";

fn plan(p: &Policy, inventory: &str) -> Explanation {
    let inv = Inventory::from_toml(inventory).unwrap();
    match xpu_plan::plan(&graph(), p, &inv) {
        Ok((_, ex)) => ex,
        Err(f) => *f.explanation,
    }
}

fn node<'a>(ex: &'a Explanation, name: &str) -> &'a Decision {
    ex.decisions.iter().find(|d| d.name.as_deref() == Some(name)).unwrap()
}

fn kernel(d: &Decision) -> &str {
    d.chosen.as_ref().map_or("-", |c| &*c.kernel)
}

#[test]
fn the_measured_winner_replaces_the_static_choice_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy_with(dir.path(), MEASURED, Some(&lock(5).to_toml()));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let ex = plan(&p, INVENTORY);
    let fc = node(&ex, "fc");
    assert_eq!(kernel(fc), "cpu.blas");
    let rule = fc.rule.as_ref().unwrap();
    assert!(
        rule.key.starts_with("measured: cpu.blas 4.0 µs over 5 run(s) vs ort.cpu 9.5 µs over 5"),
        "{}",
        rule.key
    );
    assert!(rule.at.as_deref().unwrap().ends_with("p.toml:6"), "{rule:?}");
    let slower = fc.rejected.iter().find(|r| r.code == ReasonCode::MeasuredSlower).unwrap();
    assert_eq!(slower.kernel.as_deref(), Some("ort.cpu"));
    assert!(slower.detail.contains("ort.cpu median 9.5 µs over 5"), "{}", slower.detail);
    assert_eq!(fc.measured.as_ref().unwrap().code, None);
    // Off the first choice (ort, the inventory's first engine): counted as a fallback.
    let fb = fc.fallback.as_ref().unwrap();
    assert_eq!((fb.from.as_str(), fb.code), ("ort", ReasonCode::MeasuredSlower));
    assert!(
        fc.precision_from.as_ref().is_some_and(|p| &*p.key == "graph dtype"),
        "{:?}",
        fc.precision_from
    );
    // The add has no figures: the static order, with the reason.
    let add = node(&ex, "fc.bias");
    assert_eq!(kernel(add), "ort.cpu");
    assert_eq!(add.measured.as_ref().unwrap().code, Some(ReasonCode::EvidenceMissing));
    let ev = ex.evidence.as_ref().unwrap();
    assert_eq!((ev.lock.as_str(), ev.unused.as_deref()), ("p.lock.toml", None));
    // The same evidence gives the same plan.
    assert_eq!(
        serde_json::to_string(&plan(&p, INVENTORY)).unwrap(),
        serde_json::to_string(&ex).unwrap()
    );
    let text = xpu_plan::render::explanation_text(&ex, true);
    assert!(text.contains("evidence: lock p.lock.toml ("), "{text}");
    assert!(text.contains("rejected ort.cpu: MeasuredSlower"), "{text}");
}

#[test]
fn the_static_order_decides_without_a_measured_choice_or_with_thin_evidence() {
    let dir = tempfile::tempdir().unwrap();
    // A lock nothing reads: a warning, and the static order.
    let p =
        policy_with(dir.path(), "[measured]\nlock = \"p.lock.toml\"\n", Some(&lock(5).to_toml()));
    assert!(p.warnings.iter().any(|w| w.code == "P0014"), "{:?}", p.warnings);
    let ex = plan(&p, INVENTORY);
    assert_eq!(kernel(node(&ex, "fc")), "ort.cpu");
    assert!(node(&ex, "fc").measured.is_none() && ex.evidence.is_none());
    // Thinner than min_samples.
    let p = policy_with(dir.path(), &format!("{MEASURED}min_samples = 10\n"), None);
    let fc = node(&plan(&p, INVENTORY), "fc").clone();
    assert_eq!(kernel(&fc), "ort.cpu");
    assert_eq!(fc.measured.unwrap().code, Some(ReasonCode::EvidenceThin));
    // A rule may choose by measurement for its nodes alone.
    let rule = "[[rule]]\nwhen = { op = \"add\" }\nchoose = \"measured\"\n[measured]\nlock = \"p.lock.toml\"\n";
    let ex = plan(&policy_with(dir.path(), rule, None), INVENTORY);
    assert_eq!(kernel(node(&ex, "fc")), "ort.cpu");
    assert!(node(&ex, "fc").measured.is_none());
    assert_eq!(
        node(&ex, "fc.bias").measured.as_ref().unwrap().code,
        Some(ReasonCode::EvidenceMissing)
    );
    // choose = measured without a lock: a warning, the static order, the reason per node.
    let p = policy_with(dir.path(), "[engines]\nchoose = \"measured\"\n", None);
    assert!(p.warnings.iter().any(|w| w.code == "P0014" && w.message.contains("no lock")));
    assert_eq!(kernel(node(&plan(&p, INVENTORY), "fc")), "ort.cpu");
}

#[test]
fn pins_and_fallback_rules_stay_absolute() {
    let dir = tempfile::tempdir().unwrap();
    let text = lock(5).to_toml();
    let pinned = format!("{MEASURED}[kernels]\nmatmul = \"ort.cpu\"\n");
    let fc = node(&plan(&policy_with(dir.path(), &pinned, Some(&text)), INVENTORY), "fc").clone();
    assert_eq!(kernel(&fc), "ort.cpu");
    let m = fc.measured.unwrap();
    assert_eq!(m.code, Some(ReasonCode::EvidenceNotApplicable));
    assert!(m.detail.contains("not a candidate the policy allows"), "{}", m.detail);
    let ordered =
        "[engines]\nchoose = \"measured\"\norder = [\"ort\"]\n[measured]\nlock = \"p.lock.toml\"\n";
    let fc = node(&plan(&policy_with(dir.path(), ordered, None), INVENTORY), "fc").clone();
    assert_eq!(kernel(&fc), "ort.cpu", "cpu is not in engines.order");
    let deny = "[engines]\nchoose = \"measured\"\nfallback = \"deny\"\n[measured]\nlock = \"p.lock.toml\"\n";
    let fc = node(&plan(&policy_with(dir.path(), deny, None), INVENTORY), "fc").clone();
    assert_eq!(kernel(&fc), "ort.cpu");
    assert!(fc.measured.unwrap().detail.contains("fallback"));
}

#[test]
fn evidence_from_another_machine_or_engine_version_is_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy_with(dir.path(), MEASURED, Some(&lock(5).to_toml()));
    for (from, to, says) in [
        ("cpu = \"Test CPU\"", "cpu = \"Other CPU\"", "measured on \"Test CPU\""),
        ("features = [\"avx2\"]", "features = [\"avx2\", \"avx512f\"]", "CPU features"),
        ("version = \"1.23\"", "version = \"1.24\"", "ort 1.23"),
    ] {
        let inventory = INVENTORY.replace(from, to);
        let ex = plan(&p, &inventory);
        assert_eq!(kernel(node(&ex, "fc")), "ort.cpu");
        let m = node(&ex, "fc").measured.clone().unwrap();
        assert_eq!(m.code, Some(ReasonCode::EvidenceNotApplicable));
        assert!(m.detail.contains(says), "{}", m.detail);
        assert!(ex.evidence.as_ref().unwrap().unused.as_deref().unwrap().contains(says));
        let inv = Inventory::from_toml(&inventory).unwrap();
        let warnings = xpu_policy::validate::contextual(&p, &inv, "test-box");
        assert!(warnings.iter().any(|w| w.code == "P0108"), "{warnings:?}");
    }
}

#[test]
fn broken_locks_are_refused_with_their_line_and_planning_goes_on() {
    let good = lock(5).to_toml();
    let cases: Vec<(String, &str)> = vec![
        (good[..good.len() / 2].to_string(), "p.lock.toml:"),
        (good.replace("version = 1", "version = 9"), "lock format 9 is not supported"),
        (good.replace("samples = 5", "samples = \"five\""), "p.lock.toml:"),
        (good.replace("program =", "colour = \"red\"\nprogram ="), "unknown field `colour`"),
        (good.replace("median_us = 4.0", "median_us = nan"), "finite"),
        (good.replace("kernel = \"cpu.blas\"", "kernel = \"ort.cpu\""), "not a kernel of engine"),
        (good.replace(&lock(5).nodes[0].signature, "zz"), "not 16 hex digits"),
        (
            format!(
                "{good}\n[[node]]\nsignature = \"{}\"\nwinner = {{ engine = \"cpu\", kernel = \"cpu.blas\", median_us = 1.0, samples = 5 }}\n",
                lock(5).nodes[0].signature
            ),
            "repeats the signature",
        ),
        ("[[[[".to_string(), "p.lock.toml:1:"),
        ("x".repeat(100_000), "p.lock.toml:"),
        ("a = [".repeat(5000), "p.lock.toml:"),
    ];
    for (text, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let p = policy_with(dir.path(), MEASURED, Some(&text));
        let w = p
            .warnings
            .iter()
            .find(|w| w.code == "P0015")
            .unwrap_or_else(|| panic!("no warning for {says}"));
        assert!(w.message.contains(says), "{says}: {}", w.message);
        let ex = plan(&p, INVENTORY);
        assert_eq!(kernel(node(&ex, "fc")), "ort.cpu");
        assert_eq!(
            node(&ex, "fc").measured.as_ref().unwrap().code,
            Some(ReasonCode::EvidenceNotApplicable)
        );
    }
    // A missing file and bytes that are not text.
    let dir = tempfile::tempdir().unwrap();
    let p = policy_with(dir.path(), MEASURED, None);
    assert!(p.warnings.iter().any(|w| w.code == "P0015" && w.message.contains("cannot read")));
    std::fs::write(dir.path().join("p.lock.toml"), [0xff, 0xfe, 0x00]).unwrap();
    let p = policy_with(dir.path(), MEASURED, None);
    assert!(p.warnings.iter().any(|w| w.code == "P0015" && w.message.contains("UTF-8")));
    // A lock outside the directories a confined loader may read.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("p.lock.toml"), lock(5).to_toml()).unwrap();
    let path = dir.path().join("p.toml");
    let abs = other.path().join("p.lock.toml");
    std::fs::write(
        &path,
        format!(
            "[policy]\nname = \"t\"\n[engines]\nchoose = \"measured\"\n[measured]\nlock = {:?}\n",
            abs.display().to_string()
        ),
    )
    .unwrap();
    let p = Loader::new().confined_to(vec![dir.path().to_path_buf()]).load(&path).unwrap();
    assert!(
        p.warnings.iter().any(|w| w.code == "P0015" && w.message.contains("not a file inside"))
    );
}

#[test]
fn mutated_locks_never_panic() {
    let good = lock(5).to_toml().into_bytes();
    let mut state = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut bytes = good.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() as usize) % bytes.len();
            match next() % 3 {
                0 => bytes[i] = next() as u8,
                1 => {
                    bytes.remove(i);
                }
                _ => bytes.insert(i, b"=[]{}\"#\n.9"[(next() % 10) as usize]),
            }
        }
        if let Ok(text) = std::str::from_utf8(&bytes) {
            let _ = LockFile::parse("m.lock.toml", text);
        }
    }
}

/// Evidence as a daemon's store gives it: per candidate of the matmul `fc`, its figures.
fn store_evidence(figures: &[(&str, f64, u32)]) -> xpu_policy::lock::Evidence {
    let g = graph();
    let fc = g.node_ids().find(|&id| g.node(id).name.as_deref() == Some("fc")).unwrap();
    let signature = node_signature(&g, fc, &BTreeMap::new());
    let figures = figures
        .iter()
        .map(|&(k, us, n)| xpu_policy::lock::SignatureFigure {
            signature: signature.clone(),
            figure: figure(k, us, n),
        })
        .collect();
    xpu_policy::lock::Evidence::from_store("store", lock(1).machine, figures)
}

fn with_store(p: &Policy, e: xpu_policy::lock::Evidence) -> Policy {
    p.with_evidence(std::sync::Arc::new(e))
}

const STORE: &str = "[engines]\nchoose = \"measured\"\n";

#[test]
fn store_evidence_chooses_the_fastest_candidate_the_policy_allows() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy_with(dir.path(), STORE, None);
    // cuda.gemm is fastest but no candidate here; cpu.blas is the fastest allowed.
    let e = store_evidence(&[("cuda.gemm", 1.0, 50), ("cpu.blas", 5.0, 10), ("ort.cpu", 12.0, 10)]);
    let digest = e.sha256.to_string();
    let ex = plan(&with_store(&p, e), INVENTORY);
    let fc = node(&ex, "fc");
    assert_eq!(kernel(fc), "cpu.blas");
    let rule = &fc.rule.as_ref().unwrap().key;
    assert!(rule.starts_with("measured: cpu.blas 5.0 µs over 10 run(s) vs cuda.gemm"), "{rule}");
    assert!(rule.ends_with(&format!("store ({digest})")), "{rule}");
    let m = fc.measured.as_ref().unwrap();
    assert_eq!((m.code, m.saved_nanos), (None, Some(7000)));
    assert_eq!(ex.evidence.as_ref().unwrap().sha256, digest);
    // Every figure thin: the static order, and why.
    let thin = store_evidence(&[("cpu.blas", 5.0, 2), ("ort.cpu", 12.0, 2)]);
    let fc = node(&plan(&with_store(&p, thin), INVENTORY), "fc").clone();
    assert_eq!(kernel(&fc), "ort.cpu");
    let m = fc.measured.unwrap();
    assert_eq!(m.code, Some(ReasonCode::EvidenceThin));
    assert!(m.detail.contains("cpu.blas has 2 timed run(s)"), "{}", m.detail);
    // The digest follows what a plan can depend on: the order, sample counts (up to 100),
    // each median's distance from the best in 10 % steps; not every new run's jitter.
    let digest = |f: &[(&str, f64, u32)]| store_evidence(f).sha256.to_string();
    let a = digest(&[("cpu.blas", 5.0, 10), ("ort.cpu", 12.0, 10)]);
    assert_eq!(a, digest(&[("cpu.blas", 5.0, 10), ("ort.cpu", 12.0, 10)]));
    assert_eq!(a, digest(&[("cpu.blas", 5.1, 10), ("ort.cpu", 12.2, 10)]));
    assert_ne!(a, digest(&[("cpu.blas", 5.0, 11), ("ort.cpu", 12.0, 10)]));
    assert_ne!(a, digest(&[("cpu.blas", 5.0, 10), ("ort.cpu", 20.0, 10)]));
    assert_ne!(a, digest(&[("cpu.blas", 13.0, 10), ("ort.cpu", 12.0, 10)]));
    let many = digest(&[("cpu.blas", 5.0, 100), ("ort.cpu", 12.0, 100)]);
    assert_eq!(many, digest(&[("cpu.blas", 5.0, 5000), ("ort.cpu", 12.0, 100)]));
}

#[test]
fn exploring_plans_try_thin_candidates_within_the_policy_budget() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy_with(dir.path(), STORE, None);
    let explored = |p: &Policy, figures: &[(&str, f64, u32)]| {
        let e = store_evidence(figures).exploring();
        assert!(e.sha256.ends_with("+explore"));
        node(&plan(&with_store(p, e), INVENTORY), "fc").clone()
    };
    // ort.cpu well measured, cpu.blas never: an exploring plan runs cpu.blas, says so.
    let fc = explored(&p, &[("ort.cpu", 12.0, 10)]);
    assert_eq!(kernel(&fc), "cpu.blas");
    let m = fc.measured.as_ref().unwrap();
    assert_eq!(m.code, Some(ReasonCode::Exploring));
    assert!(m.detail.contains("exploring cpu.blas: 0 of [measured] min_samples 3"), "{}", m.detail);
    let set_aside = fc.rejected.iter().find(|r| r.code == ReasonCode::Exploring).unwrap();
    assert_eq!(set_aside.kernel.as_deref(), Some("ort.cpu"));
    assert!(fc.rule.as_ref().unwrap().key.starts_with("explore: exploring cpu.blas"));
    // The plan that does not explore keeps the measured choice.
    let e = store_evidence(&[("ort.cpu", 12.0, 10)]);
    let fc = node(&plan(&with_store(&p, e), INVENTORY), "fc").clone();
    assert_eq!((kernel(&fc), fc.measured.as_ref().unwrap().code), ("ort.cpu", None));
    // A signature with no figures at all: explored too.
    let other = xpu_policy::lock::Evidence::from_store("store", lock(1).machine, Vec::new());
    let ex = plan(&with_store(&p, other.exploring()), INVENTORY);
    assert_eq!(node(&ex, "fc").measured.as_ref().unwrap().code, Some(ReasonCode::Exploring));
    // One signature explores per plan: the add, unmeasured too, keeps its static choice.
    let add = node(&ex, "fc.bias");
    assert_eq!(kernel(add), "ort.cpu");
    assert_eq!(add.measured.as_ref().unwrap().code, Some(ReasonCode::EvidenceMissing));
    // Measured max_slowdown times slower than the best: not explored again; the next is.
    let fc = explored(&p, &[("ort.cpu", 12.0, 10), ("cpu.blas", 100.0, 1)]);
    assert_eq!(kernel(&fc), "cpu.naive");
    // The budget spent (explore_runs = 2, two explored runs stored): no more exploring.
    let tight = policy_with(dir.path(), &format!("{STORE}[measured]\nexplore_runs = 2\n"), None);
    let fc = explored(&tight, &[("ort.cpu", 12.0, 10), ("cpu.blas", 13.0, 2)]);
    assert_eq!((kernel(&fc), fc.measured.as_ref().unwrap().code), ("ort.cpu", None));
    // A run that asks for determinism never explores; nor does explore_runs = 0.
    for fragment in ["[execution]\ndeterminism = \"bitwise\"\n", "[measured]\nexplore_runs = 0\n"] {
        let p = policy_with(dir.path(), &format!("{STORE}{fragment}"), None);
        let fc = explored(&p, &[("ort.cpu", 12.0, 10)]);
        assert_eq!(kernel(&fc), "ort.cpu", "{fragment}");
        assert_ne!(fc.measured.unwrap().code, Some(ReasonCode::Exploring), "{fragment}");
    }
}

#[test]
fn measured_settings_out_of_range_are_refused_where_they_are_set() {
    let dir = tempfile::tempdir().unwrap();
    for (fragment, key) in [
        ("[measured]\nmax_slowdown = 0.5\n", "max_slowdown"),
        ("[measured]\nmax_slowdown = nan\n", "max_slowdown"),
        ("[measured]\nmin_samples = 0\n", "min_samples"),
        ("[measured]\nexplore_runs = 101\n", "explore_runs"),
        ("[measured]\nmin_samples = 101\n", "min_samples"),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, format!("[policy]\nname = \"t\"\n{STORE}{fragment}")).unwrap();
        let err = Loader::new().load(&path).expect_err(fragment).to_string();
        assert!(err.contains("P0010") && err.contains(key), "{fragment}: {err}");
        assert!(err.contains("bad.toml:"), "{err}");
    }
}
