//! The policy's engine-facing settings: the typed options every partition's assignment
//! carries, the plan's execution settings, and one recorded decision per engine and
//! setting the engine does not honour (so no key silently does nothing).

use xpu_engine::EngineOptions;
use xpu_engine::options::{Capture, Pool, Reuse, value_name};
use xpu_policy::Key;

use super::Planner;
use crate::model::{ExecutionSettings, Note, PartitionPlan};
use crate::reason::ReasonCode;

impl Planner<'_> {
    /// What the engine-facing settings (`execution.capture`, `memory.reuse`, `memory.pool`,
    /// `memory.pinned_host`, `precision.accumulate`) do on each engine the plan uses, where
    /// the engine does not honour what they ask: one recorded decision per engine and
    /// setting.
    pub(super) fn setting_decisions(&self, partitions: &[PartitionPlan]) -> Vec<Note> {
        let spec = &self.policy.spec;
        // The settings this policy asks of engines, with their values.
        let asked: Vec<(Key, String, ReasonCode)> = [
            (spec.execution.capture == Capture::Graph)
                .then(|| (Key::Capture, "graph".into(), ReasonCode::CaptureUnsupported)),
            (spec.memory.reuse != Reuse::None).then(|| {
                (Key::MemoryReuse, value_name(&spec.memory.reuse), ReasonCode::ReuseUnsupported)
            }),
            (spec.memory.pool != Pool::None).then(|| {
                (Key::MemoryPool, value_name(&spec.memory.pool), ReasonCode::SettingUnsupported)
            }),
            spec.memory
                .pinned_host
                .then(|| (Key::PinnedHost, "true".into(), ReasonCode::SettingUnsupported)),
            spec.precision.accumulate.map(|a| {
                (Key::PrecisionAccumulate, a.name().to_string(), ReasonCode::SettingUnsupported)
            }),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut engines: Vec<&str> = partitions.iter().map(|p| p.engine.as_str()).collect();
        engines.sort_unstable();
        engines.dedup();
        let mut notes = Vec::new();
        for engine in engines {
            let Some(known) = xpu_engine::catalog::engine(engine) else { continue };
            for (key, value, code) in &asked {
                let key_name = key.name();
                if let Some((_, what)) = known.unhonoured.iter().find(|(k, _)| *k == key_name) {
                    notes.push(Note {
                        code: *code,
                        message: format!("{key_name} = {value}: on {engine}, {what}"),
                        at: Some(self.resolved.site(*key).at.clone()),
                    });
                }
            }
        }
        notes
    }

    /// The options every partition's assignment carries.
    pub(super) fn engine_options(&self) -> EngineOptions {
        let spec = &self.policy.spec;
        EngineOptions {
            determinism: spec.execution.determinism,
            capture: spec.execution.capture,
            threads: spec.execution.threads,
            accumulate: spec.precision.accumulate,
            memory_limit: spec.memory.limit.map(|l| l.0),
            memory_pool: spec.memory.pool,
            memory_reuse: spec.memory.reuse,
            pinned_host: spec.memory.pinned_host,
            fallback: spec.engines.fallback,
            graph_optimization: spec.execution.graph_optimization,
            performance: spec.execution.performance,
        }
    }

    pub(super) fn execution_settings(&self) -> ExecutionSettings {
        let ex = &self.policy.spec.execution;
        ExecutionSettings {
            capture: ex.capture,
            determinism: ex.determinism,
            threads: ex.threads,
            timeout_ms: ex.timeout.map(|t| t.0.as_millis() as u64),
        }
    }
}
