//! The store on disk: runs committed whole with their decisions and candidates, listed,
//! searched per tenant, re-opened (the index catches up from its payload), re-indexed, one
//! owner at a time, read-only SQL.

use std::collections::BTreeMap;
use std::path::Path;

use xpu_store::{
    Durability, OutputInfo, RunFilter, RunRecord, RunStatus, Scope, Store, StoreError, StoreOptions,
};

const GRAPH: &str = r#"graph "mlp" {
  %0: f32[4,8] = input "x"
  %1: f32[8,8] = input "w"
  %2: f32[4,8] = matmul(%0, %1) @name("fc")
  %3: f32[4,8] = softmax(%2) {axis = -1} @name("probs")
  return "y" = %3
}"#;

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A real explanation: the graph planned under a policy that prefers cuda on the H100
/// inventory with cuda denied, so every node has a rejected candidate with a reason.
fn explanation() -> xpu_plan::Explanation {
    let g = xpu_ir::text::parse(GRAPH).unwrap();
    let inv = std::fs::read_to_string(repo().join("policies/inventories/h100.toml")).unwrap();
    let inv = xpu_engine::Inventory::from_toml(&inv).unwrap();
    let policy = xpu_policy::Loader::new()
        .load_text("deny.toml", None, "[policy]\nname = \"no-gpu\"\n[engines]\ndeny = [\"cuda\"]\n")
        .unwrap();
    match xpu_plan::plan(&g, &policy, &inv) {
        Ok((_, ex)) => ex,
        Err(f) => *f.explanation,
    }
}

fn record(i: usize, tenant: Option<&str>, status: RunStatus) -> RunRecord {
    let mut labels = BTreeMap::new();
    labels.insert(
        "team".to_string(),
        if i.is_multiple_of(2) { "vision" } else { "search" }.to_string(),
    );
    RunRecord {
        run_id: format!("run-{i:04}"),
        tenant: tenant.map(str::to_string),
        status,
        program_name: "mlp.sgr".into(),
        program_kind: "sgr".into(),
        program_sha256: "ab".repeat(32),
        program_source: Some(GRAPH.into()),
        policy_name: "no-gpu".into(),
        policy_version: 1,
        policy_sha256: "cd".repeat(32),
        labels,
        submitted_us: 1_700_000_000_000_000 + i as i64,
        started_us: Some(1_700_000_000_000_100 + i as i64),
        finished_us: 1_700_000_000_000_900 + i as i64,
        queue_us: 100,
        run_us: 800,
        error: (status == RunStatus::Failed).then(|| "division by zebra".to_string()),
        outputs: vec![OutputInfo {
            name: "y".into(),
            dtype: "f32".into(),
            shape: vec![4, 8],
            sha256: "ef".repeat(32),
            bytes: 128,
        }],
        explanation: Some(explanation()),
        environment: vec![("xpu".into(), "0.1.0".into())],
        machine: None,
    }
}

#[test]
fn runs_are_stored_whole_and_found_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let batch: Vec<RunRecord> = (0..10)
        .map(|i| {
            let tenant = if i < 6 { "acme" } else { "globex" };
            let status = if i == 3 { RunStatus::Failed } else { RunStatus::Succeeded };
            record(i, Some(tenant), status)
        })
        .collect();
    let seqs = store.commit(&batch).unwrap();
    assert_eq!(seqs, (1..=10).collect::<Vec<u64>>());

    let run = store.run("run-0003", Scope::Tenant("acme")).unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_deref(), Some("division by zebra"));
    assert_eq!(run.labels["team"], "search");
    assert_eq!(run.outputs[0].shape, vec![4, 8]);
    assert_eq!(run.nodes, 2, "matmul and softmax: {run:?}");
    // Another tenant's run is invisible, as if it did not exist.
    assert!(store.run("run-0003", Scope::Tenant("globex")).unwrap().is_none());
    assert!(store.run("run-0003", Scope::All).unwrap().is_some());

    let (ex, source) = store.explanation("run-0001", Scope::All).unwrap().unwrap();
    assert_eq!(ex.unwrap(), explanation());
    assert_eq!(source.as_deref(), Some(GRAPH));

    // Decisions and candidates are rows too.
    let rows = store
        .sql(
            "SELECT count(*) FROM candidates WHERE run_id = 'run-0000' AND code = 'PolicyDenied'",
            10,
        )
        .unwrap();
    assert!(rows.rows[0][0].as_i64().unwrap() >= 1, "{rows:?}");

    // Newest first, paged with the last seq as the cursor, filtered by tenant and label.
    let page = store.list(&RunFilter { limit: 4, ..Default::default() }, Scope::All).unwrap();
    let ids: Vec<&str> = page.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run-0009", "run-0008", "run-0007", "run-0006"]);
    let next = store
        .list(&RunFilter { limit: 4, before: Some(page[3].seq), ..Default::default() }, Scope::All)
        .unwrap();
    assert_eq!(next[0].run_id, "run-0005");
    let vision = store
        .list(
            &RunFilter {
                limit: 100,
                labels: vec![("team".into(), "vision".into())],
                ..Default::default()
            },
            Scope::Tenant("acme"),
        )
        .unwrap();
    let ids: Vec<&str> = vision.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["run-0004", "run-0002", "run-0000"]);

    // Search sees decisions, reason codes and errors, per tenant, once indexed (xpud's
    // indexer does this at most a second after the commit).
    assert!(store.search("zebra", Scope::All, 10).unwrap().is_empty(), "not indexed yet");
    assert_eq!(store.index_pending().unwrap(), 10);
    let hits = store.search("zebra", Scope::Tenant("acme"), 10).unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].run_id, "run-0003");
    assert!(hits[0].snippet.contains("[zebra]"), "{:?}", hits[0]);
    assert!(store.search("zebra", Scope::Tenant("globex"), 10).unwrap().is_empty());
    let denied = store.search("code:PolicyDenied", Scope::All, 100).unwrap();
    assert_eq!(denied.len(), 10);
    assert_eq!(store.search("label:team=vision", Scope::All, 100).unwrap().len(), 5);
    assert!(matches!(store.search("(unclosed", Scope::All, 10), Err(StoreError::Query(_))));
}

#[test]
fn one_owner_at_a_time_and_the_index_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let err = Store::open(dir.path()).err().expect("a second open is refused");
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        assert!(err.to_string().contains("another process"), "{err}");
        store.commit(&[record(0, None, RunStatus::Succeeded)]).unwrap();
        // Committed but not yet indexed when the process goes away.
        let p = store.progress().unwrap();
        assert_eq!((p.journaled, p.committed, p.indexed), (1, 1, 0));
    }
    let store = Store::open(dir.path()).unwrap();
    let p = store.progress().unwrap();
    assert_eq!((p.journaled, p.committed, p.indexed), (1, 1, 1), "caught up at open");
    store
        .commit(&(1..5).map(|i| record(i, None, RunStatus::Succeeded)).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(store.index_pending().unwrap(), 4);
    assert_eq!(store.index_pending().unwrap(), 0, "nothing twice");
    assert_eq!(store.search("mlp.sgr", Scope::All, 100).unwrap().len(), 5);
    assert_eq!(store.reindex().unwrap(), 5);
    assert_eq!(store.search("mlp.sgr", Scope::All, 100).unwrap().len(), 5, "no duplicates");
    drop(store);
    // A damaged index is rebuilt from the database.
    for entry in std::fs::read_dir(dir.path().join("index")).unwrap().flatten() {
        if entry.path().extension().is_some_and(|e| e == "json") {
            std::fs::write(entry.path(), b"{ not json").unwrap();
        }
    }
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.search("mlp.sgr", Scope::All, 100).unwrap().len(), 5);
    assert_eq!(store.count().unwrap(), 5);
}

#[test]
fn sql_reads_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    store.commit(&[record(0, None, RunStatus::Succeeded)]).unwrap();
    let r = store.sql("SELECT run_id, nodes, status FROM runs", 10).unwrap();
    assert_eq!(r.columns, ["run_id", "nodes", "status"]);
    assert_eq!(r.rows[0][0], "run-0000");
    let many = store.sql("SELECT * FROM range(100)", 7).unwrap();
    assert_eq!((many.rows.len(), many.truncated), (7, true));
    // 128-bit sums and decimals as JSON numbers or exact digits, not debug text.
    let wide = store
        .sql(
            "SELECT sum(x) AS s, 1.5::DECIMAL(4,2) AS d, \
             170141183460469231731687303715884105727::HUGEINT AS big FROM range(10) t(x)",
            1,
        )
        .unwrap();
    assert_eq!(wide.rows[0][0], serde_json::json!(45));
    assert_eq!(wide.rows[0][1], "1.50");
    assert_eq!(wide.rows[0][2], "170141183460469231731687303715884105727");
    for bad in [
        "DELETE FROM runs",
        "DROP TABLE runs",
        "INSERT INTO runs SELECT * FROM runs",
        "ATTACH '/tmp/x.db'",
        "COPY runs TO '/tmp/runs.csv'",
        "SET enable_external_access = true",
    ] {
        assert!(matches!(store.sql(bad, 10), Err(StoreError::Query(_))), "{bad}");
    }
    // Reading files is off even inside a SELECT.
    let err = store.sql("SELECT * FROM read_csv('/etc/passwd')", 10).unwrap_err();
    assert!(matches!(err, StoreError::Query(_)), "{err}");
    assert!(store.sql("SELEC oops", 10).is_err());
    assert_eq!(store.count().unwrap(), 1, "nothing was changed");
}

/// The journal's frames (`len: u32 LE, crc32: u32 LE, payload`), whole.
fn frames(bytes: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        out.push(&bytes[at..at + 8 + len]);
        at += 8 + len;
    }
    out
}

fn segment(first: u64) -> String {
    format!("journal/{first:020}.log")
}

#[test]
fn acknowledged_runs_are_replayed_from_the_journal_once() {
    // A store whose database took in ten runs; its journal segment (still on disk while the
    // store is open) is what a crash before the database commit would leave behind.
    let first = tempfile::tempdir().unwrap();
    let runs: Vec<RunRecord> =
        (0..10).map(|i| record(i, Some("acme"), RunStatus::Succeeded)).collect();
    let journal = {
        let store = Store::open(first.path()).unwrap();
        assert_eq!(store.commit(&runs[..4]).unwrap(), [1, 2, 3, 4]);
        assert_eq!(store.append(runs[4..].to_vec()).unwrap(), [5, 6, 7, 8, 9, 10]);
        // Reads by id see an acknowledged run at once; lists once the database has it.
        let s = store.run("run-0009", Scope::Tenant("acme")).unwrap().expect("visible at once");
        assert_eq!((s.seq, s.status), (10, RunStatus::Succeeded));
        assert!(store.run("run-0009", Scope::Tenant("globex")).unwrap().is_none());
        let (ex, _) = store.explanation("run-0009", Scope::All).unwrap().unwrap();
        assert_eq!(ex.as_ref(), runs[9].explanation.as_ref());
        assert_eq!(store.count().unwrap(), 10);
        std::fs::read(first.path().join(segment(1))).unwrap()
    };
    assert!(!first.path().join(segment(1)).exists(), "a clean close removes the journal");
    let frames = frames(&journal);
    assert_eq!(frames.len(), 10);

    // Replayed into an empty database: every run, whole, under its own sequence number; the
    // journal split into two segments, as a long-running store leaves it.
    let fresh = tempfile::tempdir().unwrap();
    std::fs::create_dir(fresh.path().join("journal")).unwrap();
    std::fs::write(fresh.path().join(segment(1)), frames[..6].concat()).unwrap();
    std::fs::write(fresh.path().join(segment(7)), frames[6..].concat()).unwrap();
    {
        let store = Store::open(fresh.path()).unwrap();
        assert_eq!(store.replayed(), 10);
        assert_eq!(store.count().unwrap(), 10);
        let p = store.progress().unwrap();
        assert_eq!((p.journaled, p.committed, p.indexed), (10, 10, 10));
        let s = store.run("run-0003", Scope::All).unwrap().unwrap();
        assert_eq!(s, runs[3].summary(4));
        let (ex, source) = store.explanation("run-0007", Scope::All).unwrap().unwrap();
        assert_eq!(ex.as_ref(), runs[7].explanation.as_ref());
        assert_eq!(source.as_deref(), Some(GRAPH));
        assert!(!fresh.path().join(segment(1)).exists(), "replayed segments are released");
        // New runs continue the sequence.
        assert_eq!(store.commit(&[record(10, None, RunStatus::Failed)]).unwrap(), [11]);
    }

    // The same journal over a database that already holds its runs adds nothing; a torn
    // frame at its end (the write a kill interrupted, never acknowledged) is cut off.
    std::fs::create_dir_all(first.path().join("journal")).unwrap();
    let torn = [&journal[..], &frames[0][..frames[0].len() / 2]].concat();
    std::fs::write(first.path().join(segment(1)), &torn).unwrap();
    {
        let store = Store::open(first.path()).unwrap();
        assert_eq!(store.replayed(), 0);
        assert_eq!(store.count().unwrap(), 10, "nothing stored twice");
        assert_eq!(store.commit(&[record(10, None, RunStatus::Failed)]).unwrap(), [11]);
        assert_eq!(store.count().unwrap(), 11);
        let listed = store.list(&RunFilter { limit: 100, ..RunFilter::default() }, Scope::All);
        assert_eq!(listed.unwrap().len(), 11);
    }

    // A damaged frame before the end is corruption: the open is refused (naming the file
    // and byte) rather than dropping the runs after it.
    let broken = tempfile::tempdir().unwrap();
    std::fs::create_dir(broken.path().join("journal")).unwrap();
    let mut bad = frames[..6].concat();
    bad[frames[0].len() + 20] ^= 0x55;
    std::fs::write(broken.path().join(segment(1)), &bad).unwrap();
    std::fs::write(broken.path().join(segment(7)), frames[6..].concat()).unwrap();
    let err = Store::open(broken.path()).err().expect("a corrupt journal refuses the open");
    let text = err.to_string();
    assert!(
        text.contains(&segment(1)[8..]) && text.contains(&format!("byte {}", frames[0].len())),
        "{text}"
    );
    // Garbage that is not a journal at all, as the only segment: the torn-tail rule applies
    // (nothing whole in it), so the store opens empty and the file is cut back.
    std::fs::remove_file(broken.path().join(segment(7))).unwrap();
    std::fs::write(broken.path().join(segment(1)), b"\xff\xff\xff\x7fnot a journal").unwrap();
    let store = Store::open(broken.path()).unwrap();
    assert_eq!(store.count().unwrap(), 0);
}

#[test]
fn the_database_memory_limit_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { memory_limit_mb: Some(96), ..StoreOptions::default() };
    let store = Store::open_with(dir.path(), options).unwrap();
    let r = store.sql("SELECT current_setting('memory_limit') AS m", 1).unwrap();
    let limit = serde_json::to_string(&r.rows).unwrap();
    // DuckDB reports 96 MiB in its own units (100.6 MB).
    assert!(limit.contains("100.6 MB") || limit.contains("96.0 MiB"), "{limit}");
}

#[test]
fn machine_durability_syncs_and_stores() {
    let dir = tempfile::tempdir().unwrap();
    let options = StoreOptions { durability: Durability::Machine, ..StoreOptions::default() };
    let store = Store::open_with(dir.path(), options).unwrap();
    let seqs = store.commit(&[record(0, None, RunStatus::Succeeded)]).unwrap();
    assert_eq!(seqs, [1]);
    assert_eq!(store.count().unwrap(), 1);
}

#[test]
fn kept_files_ride_with_their_run_and_reach_disk_before_it_is_committed() {
    use xpu_store::KeptFile;
    let dir = tempfile::tempdir().unwrap();
    let kept = |path: &str, bytes: &[u8]| KeptFile { path: path.into(), bytes: bytes.to_vec() };
    let big = vec![7u8; (1 << 20) + 1];
    let journal = {
        let store = Store::open(dir.path()).unwrap();
        // A path that would leave the store is refused, and nothing of the batch is stored.
        for bad in ["../escape.npy", "/etc/passwd", "runs/../../x", ""] {
            let err = store
                .append_with_files(vec![(
                    record(0, None, RunStatus::Succeeded),
                    vec![kept(bad, b"x")],
                )])
                .unwrap_err();
            assert!(err.to_string().contains("not a relative path inside the store"), "{err}");
        }
        assert_eq!(store.progress().unwrap().journaled, 0);
        let files = vec![
            kept("runs/run-0000/inputs/x.npy", b"input bytes"),
            kept("blobs/ab/abcd.npy", b"output bytes"),
            kept("runs/run-0000/inputs/large.npy", &big),
        ];
        let seqs =
            store.append_with_files(vec![(record(0, None, RunStatus::Succeeded), files)]).unwrap();
        assert_eq!(seqs, [1]);
        // Readable at once (memory or disk), whatever the feeder has done yet; a large file
        // is on disk before the append returns.
        assert_eq!(store.read_kept("runs/run-0000/inputs/x.npy").unwrap(), b"input bytes");
        assert_eq!(store.read_kept("blobs/ab/abcd.npy").unwrap(), b"output bytes");
        assert!(dir.path().join("runs/run-0000/inputs/large.npy").is_file());
        assert_eq!(
            store.read_kept("../outside").unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
        store.settle().unwrap();
        assert!(!store.kept_pending("blobs/ab/abcd.npy"));
        assert_eq!(std::fs::read(dir.path().join("blobs/ab/abcd.npy")).unwrap(), b"output bytes");
        std::fs::read(dir.path().join(segment(1))).unwrap()
    };
    // The frame carries the small files only; replayed into a fresh store (a crash before
    // the feeder ran), they are written out at open.
    let frame = String::from_utf8_lossy(&journal[8..]).into_owned();
    assert!(frame.contains("\"files\"") && !frame.contains("large.npy"), "{}", &frame[..200]);
    let fresh = tempfile::tempdir().unwrap();
    std::fs::create_dir(fresh.path().join("journal")).unwrap();
    std::fs::write(fresh.path().join(segment(1)), &journal).unwrap();
    let store = Store::open(fresh.path()).unwrap();
    assert_eq!(store.replayed(), 1);
    assert_eq!(
        std::fs::read(fresh.path().join("runs/run-0000/inputs/x.npy")).unwrap(),
        b"input bytes"
    );
    assert_eq!(store.read_kept("blobs/ab/abcd.npy").unwrap(), b"output bytes");
}

/// A run on `machine` whose explanation timed the matmul (`sig`) with `kernel` in `micros`.
fn timed(
    i: usize,
    machine: &str,
    status: RunStatus,
    sig: Option<u64>,
    kernel: &str,
    micros: u64,
) -> RunRecord {
    let mut r = record(i, None, status);
    r.machine = Some(machine.to_string());
    let ex = r.explanation.as_mut().unwrap();
    ex.timings = vec![xpu_plan::model::NodeTime {
        node: xpu_ir::NodeId(2),
        engine: xpu_engine::catalog::engine_of(kernel).to_string(),
        kernel: kernel.to_string(),
        nanos: micros * 1000,
        signature: sig.map(xpu_plan::evidence::Signature),
    }];
    r
}

#[test]
fn evidence_is_every_succeeded_timed_run_per_machine_signature_and_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let (a, b) = (0xaaaa_0000_0000_0001_u64, 0xbbbb_0000_0000_0002_u64);
    let mut runs = Vec::new();
    for (i, us) in [30, 10, 50, 20, 40].into_iter().enumerate() {
        runs.push(timed(i, "m1", RunStatus::Succeeded, Some(a), "cpu.blas", us));
    }
    runs.push(timed(5, "m1", RunStatus::Succeeded, Some(a), "cpu.gemm", 7));
    runs.push(timed(6, "m1", RunStatus::Failed, Some(a), "cpu.gemm", 1)); // failed: not evidence
    runs.push(timed(7, "m2", RunStatus::Succeeded, Some(a), "cpu.gemm", 1)); // another machine
    runs.push(timed(8, "m1", RunStatus::Succeeded, None, "cpu.gemm", 1)); // no signature
    runs.push(timed(9, "m1", RunStatus::Succeeded, Some(b), "ort.cpu", 3));
    let mut legacy = record(10, None, RunStatus::Succeeded); // no machine (older xpud)
    legacy.machine = None;
    runs.push(legacy);
    store.append(runs).unwrap();
    let rows = store.evidence("m1", None).unwrap();
    let got: Vec<(String, &str, u64, f64, f64)> = rows
        .iter()
        .map(|r| (r.signature.clone(), r.kernel.as_str(), r.samples, r.median_us, r.p90_us))
        .collect();
    assert_eq!(
        got,
        vec![
            (format!("{a:016x}"), "cpu.gemm", 1, 7.0, 7.0),
            (format!("{a:016x}"), "cpu.blas", 5, 30.0, 46.0),
            (format!("{b:016x}"), "ort.cpu", 1, 3.0, 3.0),
        ]
    );
    assert!(rows.iter().all(|r| r.last_seen_us >= 1_700_000_000_000_900), "{rows:?}");
    // Only the signatures asked for; a name no run has is no row; another machine's own.
    let only_b = store.evidence("m1", Some(&[format!("{b:016x}"), "0123456789abcdef".into()]));
    assert_eq!(only_b.unwrap().len(), 1);
    assert_eq!(store.evidence("m2", None).unwrap().len(), 1);
    assert!(store.evidence("'; DROP TABLE runs; --", None).unwrap().is_empty());
    // The same figures are a view anyone with SQL can read.
    let q =
        store.sql("SELECT kernel, samples FROM evidence WHERE machine = 'm1' ORDER BY kernel", 10);
    assert_eq!(q.unwrap().rows.len(), 3);
}
