//! ORT's own profile of one run: which execution provider ran each node, as what op, and
//! for how long. The profile is a Chrome trace (JSON array of events); node events have
//! `cat = "Node"`, a name `<node>_kernel_time`, `dur` in µs and `args.provider`/`op_name`.

use std::path::Path;

use xpu_engine::EngineError;

use crate::convert;
use crate::options::SessionOptions;

/// The name exported partition nodes get, so the profile maps back onto node ids.
pub fn node_name(index: usize) -> String {
    format!("xpu_n{index}")
}

/// The partition node index in a name [`node_name`] made. ORT renames nodes it fuses
/// (`fused xpu_n1/MatMulAddFusion`): the first node name inside still says where it began.
pub fn node_index(name: &str) -> Option<usize> {
    let at = name.find("xpu_n")? + "xpu_n".len();
    let digits: String = name[at..].chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeProfile {
    /// ORT's node name (after its own graph optimisations: fused nodes get new names).
    pub node: String,
    pub op: String,
    pub provider: String,
    pub nanos: u64,
}

impl NodeProfile {
    pub fn failed(reason: String) -> NodeProfile {
        NodeProfile {
            node: String::new(),
            op: String::new(),
            provider: format!("unknown (profile failed: {reason})"),
            nanos: 0,
        }
    }

    pub fn describe(&self) -> String {
        if self.node.is_empty() {
            return self.provider.clone();
        }
        format!(
            "{} ({} {}) on {}, {} µs",
            self.node,
            self.op,
            self.provider_short(),
            self.provider,
            self.nanos / 1000
        )
    }

    fn provider_short(&self) -> &str {
        self.provider.strip_suffix("ExecutionProvider").unwrap_or(&self.provider)
    }
}

/// Parses ORT's profile JSON into one entry per node, summing repeated runs of a node.
pub fn parse(json: &str) -> Result<Vec<NodeProfile>, String> {
    let events: Vec<serde_json::Value> = serde_json::from_str(json)
        .map_err(|e| format!("profile is not a JSON array of events: {e}"))?;
    let mut out: Vec<NodeProfile> = Vec::new();
    for e in &events {
        if e.get("cat").and_then(|c| c.as_str()) != Some("Node") {
            continue;
        }
        let Some(name) = e.get("name").and_then(|n| n.as_str()) else { continue };
        let Some(node) = name.strip_suffix("_kernel_time") else { continue };
        let args = e.get("args");
        let field = |k: &str| {
            args.and_then(|a| a.get(k)).and_then(|v| v.as_str()).unwrap_or("").to_string()
        };
        let nanos = e.get("dur").and_then(|d| d.as_u64()).unwrap_or(0) * 1000;
        match out.iter_mut().find(|p| p.node == node) {
            Some(p) => p.nanos += nanos,
            None => out.push(NodeProfile {
                node: node.to_string(),
                op: field("op_name"),
                provider: field("provider"),
                nanos,
            }),
        }
    }
    Ok(out)
}

/// Builds a profiling twin of a session, runs it once on `inputs`, and returns its report.
pub(crate) fn run_profiled(
    env: &ort::environment::Environment,
    name: &str,
    model: &[u8],
    opts: &SessionOptions,
    prefix: &Path,
    inputs: &[impl convert::OrtInput],
    build: impl Fn(
        &ort::environment::Environment,
        &str,
        &[u8],
        &SessionOptions,
        Option<&Path>,
    ) -> Result<ort::session::Session, EngineError>,
) -> Result<Vec<NodeProfile>, String> {
    let mut session = build(env, name, model, opts, Some(prefix)).map_err(|e| e.to_string())?;
    let values = inputs.iter().map(|i| i.value()).collect::<Result<Vec<_>, _>>()?;
    session.run(&values[..]).map_err(|e| e.to_string())?;
    let file = session.end_profiling().map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"));
    let _ = std::fs::remove_file(&file);
    parse(&text?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_node_events_and_ignores_the_rest() {
        let json = r#"[
          {"cat":"Session","name":"model_run","dur":90},
          {"cat":"Node","name":"xpu_n0_kernel_time","dur":12,"args":{"op_name":"MatMul","provider":"CPUExecutionProvider"}},
          {"cat":"Node","name":"xpu_n0_fence_before","dur":0,"args":{}},
          {"cat":"Node","name":"xpu_n1_kernel_time","dur":3,"args":{"op_name":"Relu","provider":"CPUExecutionProvider"}},
          {"cat":"Node","name":"xpu_n0_kernel_time","dur":8,"args":{"op_name":"MatMul","provider":"CPUExecutionProvider"}}
        ]"#;
        let p = parse(json).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].node.as_str(), p[0].op.as_str(), p[0].nanos),
            ("xpu_n0", "MatMul", 20_000)
        );
        assert_eq!(node_index(&p[1].node), Some(1));
        assert_eq!(node_index("fused xpu_n12/MatMulAddFusion"), Some(12));
        assert_eq!(node_index("Gemm_token_3"), None);
        assert!(p[0].describe().contains("on CPUExecutionProvider"), "{}", p[0].describe());
    }

    #[test]
    fn garbage_profiles_are_errors() {
        assert!(parse("not json").is_err());
        assert!(parse("{\"cat\": 1}").is_err());
        assert_eq!(parse("[1, \"x\", {}]").unwrap(), vec![]);
    }
}
