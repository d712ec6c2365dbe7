//! The deploy files agree with the daemon they deploy: the container's and the Kubernetes
//! ConfigMap's `xpud.toml` load (unknown keys are errors), the ConfigMap's policies are
//! valid, and every metric the Grafana dashboard and the alert rules query is one xpud
//! documents — and every metric xpud exposes is documented.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The documents of a YAML file.
fn yaml(path: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The `data` of the ConfigMap named `name` in the Kubernetes manifests.
fn config_map(name: &str) -> Vec<(String, String)> {
    let docs = yaml("deploy/kubernetes/xpud.yaml");
    let map = docs
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("ConfigMap") && d["metadata"]["name"].as_str() == Some(name)
        })
        .unwrap_or_else(|| panic!("no ConfigMap {name}"));
    map["data"]
        .as_hash()
        .expect("data")
        .iter()
        .map(|(k, v)| (k.as_str().unwrap().to_string(), v.as_str().unwrap().to_string()))
        .collect()
}

fn load_config(text: &str) -> Result<xpud::Config, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("xpud.toml");
    std::fs::write(&file, text).unwrap();
    xpud::Config::load(Some(&file), &xpud::config::Flags::default()).map_err(|e| e.to_string())
}

#[test]
fn deployed_settings_and_policies_load() {
    let docker = load_config(&read("deploy/docker/xpud.toml")).unwrap();
    assert_eq!(docker.listen, "0.0.0.0:8080");
    assert!(!docker.dev, "a container must not run without auth");
    let k8s = config_map("xpud-config");
    let (_, text) = k8s.iter().find(|(k, _)| k == "xpud.toml").expect("xpud.toml in the ConfigMap");
    let k8s = load_config(text).unwrap();
    assert!(k8s.auth.tokens_file.is_some() && !k8s.dev);
    // The checker is real: a typo in a key is refused, not ignored.
    let typo = load_config("listen = \"0.0.0.0:8080\"\n[limits]\nqueue_capacty = 3\n").unwrap_err();
    assert!(typo.contains("queue_capacty"), "{typo}");
    // The policies ConfigMap, mounted as a directory, is a policy set xpud accepts.
    let policies = config_map("xpud-policies");
    let mounted = tempfile::tempdir().unwrap();
    for (name, text) in &policies {
        std::fs::write(mounted.path().join(name), text).unwrap();
    }
    let set = xpud::policies::PolicySet::load(&[mounted.path().to_path_buf()]).unwrap();
    for (name, _) in &policies {
        let stem = name.trim_end_matches(".toml");
        assert!(set.get(stem).is_some(), "{name} does not define policy {stem}");
    }
}

/// `xpu_*` metric names in a PromQL expression or an exposition, histogram suffixes cut.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, _) in text.match_indices("xpu_") {
        if i > 0 && text.as_bytes()[i - 1].is_ascii_alphanumeric() {
            continue;
        }
        let name: String =
            text[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name);
        names.insert(base.to_string());
    }
    names
}

#[test]
fn dashboards_and_alerts_query_documented_metrics() {
    let documented = metric_names(&read("docs/metrics.md"));
    assert!(documented.len() > 20, "{documented:?}");
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/xpud-dashboard.json")).unwrap();
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().expect("expr").to_string());
        }
    }
    assert!(exprs.len() >= 8, "{exprs:?}");
    assert!(exprs.iter().all(|e| !metric_names(e).is_empty()), "{exprs:?}");
    let rules = yaml("deploy/prometheus/alerts.yml");
    for group in rules[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            exprs.push(rule["expr"].as_str().expect("expr").to_string());
        }
    }
    for expr in &exprs {
        for name in metric_names(expr) {
            assert!(documented.contains(&name), "{name} (in `{expr}`) is not in docs/metrics.md");
        }
    }
    // And what the daemon exposes is documented.
    let dir = tempfile::tempdir().unwrap();
    let app = xpud::App::start(xpud::Config {
        data_dir: dir.path().join("var"),
        dev: true,
        policy_dirs: vec![repo().join("policies/examples")],
        ..xpud::Config::default()
    })
    .unwrap();
    for name in metric_names(&app.metrics.render()) {
        assert!(documented.contains(&name), "{name} is exposed but not in docs/metrics.md");
    }
}

#[test]
fn engine_sections_reach_the_engines_and_typos_are_refused() {
    let c = load_config(
        "[engines.cuda]\nlibrary_dir = \"/opt/cuda/lib\"\n[engines.llvm]\ncache_dir = \"jit\"\n",
    )
    .unwrap();
    let libs = c.engines.libraries(std::path::Path::new("/var/xpu"));
    assert_eq!(libs.cuda_library_dir.as_deref(), Some(std::path::Path::new("/opt/cuda/lib")));
    // Relative cache dirs are under the data dir; unset, each engine has its own default.
    assert_eq!(libs.llvm_cache_dir.as_deref(), Some(std::path::Path::new("/var/xpu/jit")));
    assert_eq!(libs.cuda_cache_dir.as_deref(), Some(std::path::Path::new("/var/xpu/cuda-cache")));
    let typo = load_config("[engines.cuda]\nlibary_dir = \"/opt/cuda/lib\"\n").unwrap_err();
    assert!(typo.contains("libary_dir"), "{typo}");
}
