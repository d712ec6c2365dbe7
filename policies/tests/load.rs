//! Loading and structural validation, data-driven through one `check` helper: a policy
//! text and the diagnostics it must produce (`line:col code substring`), or `ok`.

use std::path::Path;

use xpu_policy::spec::{ByteSize, KernelChoice, PrecisionName};
use xpu_policy::{Loader, Policy};

fn load(text: &str) -> Result<Policy, Vec<String>> {
    Loader::new().load_text("p.toml", None, text).map_err(|d| {
        d.0.iter()
            .map(|d| {
                format!(
                    "{}:{} {} {}{}",
                    d.at.line,
                    d.at.col,
                    d.code,
                    d.message,
                    d.help.as_ref().map(|h| format!(" | {h}")).unwrap_or_default()
                )
            })
            .collect()
    })
}

/// `expect`: "ok", or one line per diagnostic: `line:col CODE substring` (substring of
/// message + help).
fn check(text: &str, expect: &str) {
    let result = load(text);
    if expect == "ok" {
        if let Err(e) = result {
            panic!("expected the policy to load, got:\n{}\n--- policy ---\n{text}", e.join("\n"));
        }
        return;
    }
    let got = match result {
        Ok(_) => {
            panic!("expected diagnostics {expect:?}, the policy loaded\n--- policy ---\n{text}")
        }
        Err(g) => g,
    };
    let wanted: Vec<&str> = expect.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    assert_eq!(got.len(), wanted.len(), "diagnostics: {got:#?}\nexpected: {wanted:#?}");
    for (g, w) in got.iter().zip(&wanted) {
        let mut parts = w.splitn(3, ' ');
        let (pos, code, sub) =
            (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap_or(""));
        assert!(
            g.starts_with(&format!("{pos} {code} ")),
            "got {g:?}, expected position {pos} and code {code}"
        );
        assert!(g.contains(sub), "got {g:?}, expected it to contain {sub:?}");
    }
}

const HEAD: &str = "[policy]\nname = \"p\"\n";

#[test]
fn valid_policies_load() {
    check(HEAD, "ok");
    check(
        &format!(
            "{HEAD}[engines]\norder = [\"cuda\", \"cpu\"]\ndeny = [\"openvino\"]\nfallback_budget = {{ max_nodes_pct = 5, on_exceeded = \"warn\" }}\n[kernels]\nmatmul = \"cuda.cublaslt\"\nattention = [\"cuda.flash_v2\", \"cuda.naive\"]\n[precision]\ndefault = \"bf16\"\nallow = [\"bf16\", \"fp32\"]\nkeep_fp32 = [\"softmax\", \"layer_normalization\"]\n[memory]\nlimit = \"20GiB\"\n[execution]\ntimeout = \"30s\"\nthreads = 2\n[[rule]]\nwhen = {{ op = \"matmul\", min_flops = 1e9, node = \"enc.*\" }}\nengine = \"cuda\"\n"
        ),
        "ok",
    );
}

#[test]
fn syntax_and_unknown_keys_are_located() {
    check("[policy\nname = 1", "1:8 P0001 malformed TOML");
    check(&format!("{HEAD}[engines]\nordr = [\"cpu\"]\n"), "4:1 P0002 did you mean `order`?");
    check(&format!("{HEAD}[engine]\norder = []\n"), "3:2 P0002 did you mean `engines`?");
    check(&format!("{HEAD}[precision]\ndefault = \"bf61\"\n"), "4:11 P0003 did you mean `bf16`?");
    check(&format!("{HEAD}[execution]\nthreads = \"two\"\n"), "4:11 P0003 invalid type");
    check(&format!("{HEAD}[memory]\nlimit = \"20 GiBs\"\n"), "4:9 P0003 unknown size unit");
    check(
        &format!("{HEAD}[[rule]]\nwhen = {{ opp = \"matmul\" }}\nengine = \"cpu\"\n"),
        "4:10 P0002 did you mean `op`?",
    );
}

#[test]
fn unknown_names_get_suggestions() {
    check(
        &format!("{HEAD}[engines]\norder = [\"cdua\"]\n"),
        "4:1 P0004 unknown engine `cdua` | did you mean `cuda`?",
    );
    check(
        &format!("{HEAD}[kernels]\nmatmul = \"cuda.cublasLt\"\n"),
        "4:1 P0005 unknown kernel `cuda.cublasLt` | did you mean `cuda.cublaslt`?",
    );
    check(
        &format!("{HEAD}[kernels]\nmatmull = \"cpu.gemm\"\n"),
        "4:1 P0006 unknown op or op class `matmull` | did you mean `matmul`?",
    );
    check(
        &format!("{HEAD}[precision]\nkeep_fp32 = [\"sofmax\"]\n"),
        "4:1 P0006 unknown op or op class `sofmax` | did you mean `softmax`?",
    );
    check(
        &format!("{HEAD}[[rule]]\nwhen = {{ op = \"conv\", dtype = \"f23\" }}\nengine = \"cpu\"\n"),
        "4:23 P0010 unknown dtype `f23` | did you mean `f32`?",
    );
    check(
        &format!("{HEAD}[[rule]]\nwhen = {{ op = \"pool\" }}\nengine = \"cpu\"\n"),
        "4:10 P0006 is an op class",
    );
}

#[test]
fn contradictions_and_ranges() {
    check(
        &format!("{HEAD}[engines]\norder = [\"cuda\"]\ndeny = [\"cuda\"]\n"),
        "4:1 P0008 both preferred\n5:1 P0008 every engine in engines.order is denied",
    );
    check(
        &format!("{HEAD}[engines]\ndeny = [\"cuda\"]\n[kernels]\nmatmul = \"cuda.cublaslt\"\n"),
        "6:1 P0008 which engines.deny denies",
    );
    check(
        &format!("{HEAD}[engines]\norder = [\"cpu\"]\n[kernels]\nmatmul = \"cuda.cublaslt\"\n"),
        "6:1 P0008 does not list | add `cuda`",
    );
    check(
        &format!("{HEAD}[precision]\ndefault = \"bf16\"\nallow = [\"fp32\"]\n"),
        "4:1 P0008 precision bf16 is not in precision.allow",
    );
    check(
        &format!("{HEAD}[engines]\nfallback_budget = {{ max_nodes_pct = 150 }}\n"),
        "4:21 P0010 out of range",
    );
    check(&format!("{HEAD}[execution]\nthreads = 0\n"), "4:1 P0010 at least 1");
    check(&format!("{HEAD}[[rule]]\nwhen = {{ op = \"matmul\" }}\n"), "3:1 P0010 sets nothing");
    check(
        &format!(
            "{HEAD}[[rule]]\nwhen = {{ op = \"matmul\" }}\nengine = \"cpu\"\nkernel = \"cuda.cublas\"\n"
        ),
        "6:1 P0008 belongs to `cuda`, but the rule sets engine `cpu`",
    );
    check("[policy]\nversion = 2\n", "1:2 P0010 no name");
    check(
        &format!("{HEAD}overridable = [\"execution.thread\"]\n"),
        "3:1 P0002 `execution.thread` is not a policy key | did you mean `execution.threads`?",
    );
}

#[test]
fn units_parse() {
    assert_eq!(ByteSize::parse("20GiB").unwrap(), ByteSize(20 << 30));
    assert_eq!(ByteSize::parse("512 MB").unwrap(), ByteSize(512_000_000));
    assert_eq!(ByteSize::parse("4096").unwrap(), ByteSize(4096));
    assert!(ByteSize::parse("lots").is_err());
    assert_eq!(ByteSize(20 << 30).to_string(), "20GiB");
    let p =
        load(&format!("{HEAD}[memory]\nlimit = 1024\n[execution]\ntimeout = \"1.5s\"\n")).unwrap();
    assert_eq!(p.spec.memory.limit, Some(ByteSize(1024)));
    assert_eq!(p.spec.execution.timeout.unwrap().0.as_millis(), 1500);
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn extends_layers_merge_key_by_key_with_origins() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "base.toml",
        "[policy]\nname = \"base\"\noverridable = [\"execution.threads\"]\n[engines]\norder = [\"cpu\"]\n[execution]\nthreads = 4\ntimeout = \"60s\"\n[[rule]]\nname = \"parent\"\nwhen = { op = \"conv\" }\nkernel = \"cpu.naive\"\n",
    );
    let child = write(
        dir.path(),
        "child.toml",
        "[policy]\nname = \"child\"\nextends = \"base\"\n[execution]\nthreads = 2\n[kernels]\nmatmul = \"cpu.gemm\"\n[[rule]]\nname = \"child\"\nwhen = { op = \"matmul\" }\nkernel = \"cpu.blas\"\n",
    );
    let p = Loader::new().load(&child).unwrap();
    assert_eq!(p.name(), "child");
    assert_eq!(p.spec.execution.threads, Some(2), "child wins");
    assert_eq!(p.spec.execution.timeout.unwrap().0.as_secs(), 60, "parent fills the rest");
    assert_eq!(p.spec.engines.order, vec!["cpu"]);
    assert_eq!(p.spec.kernels["matmul"], KernelChoice::Pinned("cpu.gemm".into()));
    let rules: Vec<_> = p.spec.rules.iter().map(|r| r.name.clone().unwrap()).collect();
    assert_eq!(rules, vec!["child", "parent"], "child rules come first");
    assert_eq!(p.files.len(), 2);
    let o = p.origin("execution.threads");
    assert!(o.file.ends_with("child.toml") && o.line == 5, "{o}");
    let o = p.origin("engines.order");
    assert!(o.file.ends_with("base.toml") && o.line == 5, "{o}");
    let o = p.origin("rule[1]");
    assert!(o.file.ends_with("base.toml") && o.line == 9, "{o}");
    let o = p.origin("precision.allow");
    assert!(o.file.starts_with("built-in default"), "{o}");

    // Job overrides: allowed keys only.
    let p2 = Loader::new().with_override("execution.threads", "8").load(&child).unwrap();
    assert_eq!(p2.spec.execution.threads, Some(8));
    assert_ne!(p2.sha256, p.sha256, "the hash follows the effective policy");
    let err = Loader::new().with_override("engines.order", "[\"cuda\"]").load(&child).unwrap_err();
    assert_eq!(err.0[0].code, "P0011");
    assert!(err.0[0].to_string().contains("overridable keys: execution.threads"), "{}", err.0[0]);

    // Operators' environment wins over everything, with its own origin.
    let mut l = Loader::new();
    l.env = vec![
        ("XPU_POLICY__EXECUTION__THREADS".into(), "3".into()),
        ("XPU_POLICY__ENGINES__ORDER".into(), "[\"cpu\", \"ort\"]".into()),
    ];
    let p3 = l.load(&child).unwrap();
    assert_eq!(p3.spec.execution.threads, Some(3));
    assert_eq!(p3.spec.engines.order, vec!["cpu", "ort"]);
    assert_eq!(p3.origin("execution.threads").file, "env XPU_POLICY__EXECUTION__THREADS");
    let mut bad = Loader::new();
    bad.env = vec![("XPU_POLICY__EXECUTION__THREADS".into(), "many".into())];
    let err = bad.load(&child).unwrap_err();
    assert!(err.0[0].to_string().contains("execution.threads"), "{}", err.0[0]);
}

#[test]
fn extends_cycles_and_missing_parents_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.toml", "[policy]\nname = \"a\"\nextends = \"b\"\n");
    write(dir.path(), "b.toml", "[policy]\nname = \"b\"\nextends = \"a.toml\"\n");
    let err = Loader::new().load(&dir.path().join("a.toml")).unwrap_err();
    assert_eq!(err.0[0].code, "P0009");
    assert!(err.0[0].message.contains("cycle"), "{}", err.0[0]);
    assert!(err.0[0].at.file.ends_with("b.toml") && err.0[0].at.line == 3, "{}", err.0[0].at);
    let missing = write(dir.path(), "c.toml", "[policy]\nname = \"c\"\nextends = \"nowhere\"\n");
    let err = Loader::new().load(&missing).unwrap_err();
    assert!(err.0[0].message.contains("no such policy"), "{}", err.0[0]);
    // A parent's own errors are reported in the parent's file.
    write(dir.path(), "broken.toml", "[policy]\nname = \"broken\"\n[engines]\norder = 5\n");
    let child = write(dir.path(), "d.toml", "[policy]\nname = \"d\"\nextends = \"broken\"\n");
    let err = Loader::new().load(&child).unwrap_err();
    assert!(err.0[0].at.file.ends_with("broken.toml") && err.0[0].at.line == 4, "{}", err.0[0]);
}

#[test]
fn a_confined_loader_extends_only_inside_its_directories() {
    let dirs = tempfile::tempdir().unwrap();
    let (policies, elsewhere) = (dirs.path().join("policies"), dirs.path().join("elsewhere"));
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    write(&policies, "base.toml", "[policy]\nname = \"base\"\n[execution]\nthreads = 3\n");
    let secret = write(&elsewhere, "secret.toml", "[policy]\nname = \"secret\"\n");
    let anchor = policies.join("inline.toml");
    let confined = || Loader::new().confined_to(vec![policies.clone()]);
    let inline = |extends: &str| format!("[policy]\nname = \"job\"\nextends = \"{extends}\"\n");
    let p = confined().load_text("inline", Some(&anchor), &inline("base")).unwrap();
    assert_eq!(p.spec.execution.threads, Some(3), "a parent inside the directories is found");
    let outside = [secret.display().to_string(), "../elsewhere/secret".to_string()];
    for extends in &outside {
        let err = confined().load_text("inline", Some(&anchor), &inline(extends)).unwrap_err();
        assert_eq!(err.0[0].code, "P0009", "{extends}: {}", err.0[0]);
        assert!(err.0[0].message.contains("no such policy"), "{extends}: {}", err.0[0]);
        // Unconfined (a local file's own `extends`), the same names are followed.
        let p = Loader::new().load_text("inline", Some(&anchor), &inline(extends));
        assert!(p.is_ok(), "{extends}: the parent is read: {:?}", p.err());
    }
}

#[test]
fn selection_by_labels() {
    let mk = |name: &str, labels: &str, prio: i32| {
        load(&format!("[policy]\nname = \"{name}\"\npriority = {prio}\nmatch = {{ labels = {{ {labels} }} }}\n")).unwrap()
    };
    let ps = vec![
        mk("any", "", 0),
        mk("gpu", "tier = \"interactive\"", 10),
        mk("gpu-eu", "tier = \"interactive\", region = \"eu\"", 0),
        mk("gpu-hi", "tier = \"interactive\"", 20),
    ];
    let labels =
        |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    assert_eq!(xpu_policy::select(&ps, &labels(&[])).unwrap().name(), "any");
    assert_eq!(
        xpu_policy::select(&ps, &labels(&[("tier", "interactive")])).unwrap().name(),
        "gpu-hi"
    );
    assert_eq!(
        xpu_policy::select(&ps, &labels(&[("tier", "interactive"), ("region", "eu")]))
            .unwrap()
            .name(),
        "gpu-eu"
    );
}

#[test]
fn precision_names_round_trip() {
    for p in PrecisionName::ALL {
        let p2: PrecisionName = serde_json::from_value(serde_json::json!(p.name())).unwrap();
        assert_eq!(p, p2);
    }
}

#[test]
fn garbage_never_panics() {
    let seeds = [
        "[policy]\nname = \"x\"\n",
        "[[rule]]\nwhen = {}\n",
        "[kernels]\nmatmul = [1, 2]\n",
        "a = \"\\u{0}\"",
        "[memory]\nlimit = -5\n",
    ];
    let mut state: u64 = 0x9e3779b97f4a7c15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..3000 {
        let base = seeds[round % seeds.len()].as_bytes().to_vec();
        let mut bytes = base.clone();
        for _ in 0..(next() % 8) {
            let pos = (next() as usize) % (bytes.len() + 1);
            match next() % 3 {
                0 => bytes.insert(pos, (next() % 128) as u8),
                1 if pos < bytes.len() => {
                    bytes.remove(pos);
                }
                _ => {
                    let pool = b"[]{}=\"\n.,#";
                    bytes.insert(pos, pool[(next() as usize) % pool.len()])
                }
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        let _ = Loader::new().load_text("garbage.toml", None, &text);
    }
}

/// The engines a plan can place nodes on: the order, the `table` engine, every rule's
/// engine and kernel's engine, every pinned or preferred kernel's engine; any engine (None)
/// when the order is empty.
#[test]
fn the_engines_a_policy_may_place_nodes_on() {
    let names = |text: &str| {
        load(text).unwrap().engines_it_may_place_on().map(|s| s.into_iter().collect::<Vec<_>>())
    };
    assert_eq!(names(HEAD), None, "no order: any engine");
    assert_eq!(
        names(&format!("{HEAD}[engines]\norder = [\"llvm\", \"cpu\"]\n")),
        Some(vec!["cpu".into(), "llvm".into(), "table".into()])
    );
    assert_eq!(
        names(&format!(
            "{HEAD}[engines]\norder = [\"llvm\", \"cpu\"]\n[kernels]\nmatmul = \"cpu.blas\"\n[[rule]]\nwhen = {{ op = \"conv\" }}\nengine = \"openvino\"\n[[rule]]\nwhen = {{ op = \"relu\" }}\nkernel = \"ort.cpu\"\n"
        )),
        Some(["cpu", "llvm", "openvino", "ort", "table"].map(String::from).to_vec())
    );
}
