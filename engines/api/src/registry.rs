//! The engines registered in a process, and the live inventory they make up.

use std::sync::Arc;

use crate::{Availability, Capabilities, Engine, Inventory, catalog};

/// Engines this process can run, by name. Catalogue engines that are not registered appear
/// in the inventory as `SupportDisabled`, so plans and explanations can say why they were
/// not used.
#[derive(Clone, Default)]
pub struct Registry {
    engines: Vec<Arc<dyn Engine>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.engines.iter().map(|e| e.name())).finish()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    pub fn register(&mut self, engine: Arc<dyn Engine>) {
        self.engines.retain(|e| e.name() != engine.name());
        self.engines.push(engine);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Engine>> {
        self.engines.iter().find(|e| e.name() == name)
    }

    /// The live inventory: every registered engine's capabilities, then every catalogue
    /// engine this build lacks.
    pub fn inventory(&self) -> Inventory {
        self.inventory_where(|_| true)
    }

    /// The live inventory for planning `graph`: an engine that says, without loading its
    /// library, that it runs none of the graph's op classes is not loaded and is listed as
    /// unavailable for that reason (a table-only job does not pay for ONNX Runtime).
    pub fn inventory_for(&self, graph: &xpu_ir::Graph) -> Inventory {
        let classes: Vec<xpu_ir::OpClass> = graph.nodes.iter().map(|n| n.op.class()).collect();
        self.inventory_where(|e| {
            e.classes_without_loading().is_none_or(|runs| classes.iter().any(|c| runs.contains(c)))
        })
    }

    fn inventory_where(&self, load: impl Fn(&dyn Engine) -> bool) -> Inventory {
        let mut engines: Vec<Capabilities> = self
            .engines
            .iter()
            .map(|e| {
                if load(e.as_ref()) {
                    e.capabilities()
                } else {
                    Capabilities::absent(
                        e.name(),
                        Availability::Unavailable {
                            reason: "not loaded: it runs none of this graph's op classes".into(),
                        },
                    )
                }
            })
            .collect();
        for known in catalog::ENGINES {
            if self.get(known.name).is_none() {
                engines.push(Capabilities::absent(
                    known.name,
                    Availability::SupportDisabled { feature: known.feature.into() },
                ));
            }
        }
        Inventory {
            name: "live".into(),
            description: "the engines of this process".into(),
            engines,
            notes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Assignment, EngineError, Executable};
    use xpu_ir::{Graph, OpClass};

    /// An engine that must not be loaded: asking its capabilities fails the test.
    struct Heavy;

    impl Engine for Heavy {
        fn name(&self) -> &str {
            "ort"
        }
        fn version(&self) -> String {
            String::new()
        }
        fn capabilities(&self) -> Capabilities {
            panic!("the heavy engine was loaded")
        }
        fn classes_without_loading(&self) -> Option<Vec<OpClass>> {
            Some(vec![OpClass::MatMul])
        }
        fn prepare(&self, _: &Graph, _: &Assignment) -> Result<Box<dyn Executable>, EngineError> {
            Err(EngineError::Other("unused".into()))
        }
    }

    #[test]
    fn an_engine_that_runs_none_of_a_graphs_classes_is_not_loaded() {
        let mut r = Registry::new();
        r.register(Arc::new(Heavy));
        let g = xpu_ir::text::parse(
            "graph \"t\" {\n  %0: f32[2] = input \"x\"\n  %1: f32[2] = relu(%0)\n  return \"y\" = %1\n}",
        )
        .unwrap();
        let inv = r.inventory_for(&g);
        let ort = inv.engine("ort").unwrap();
        assert!(
            matches!(&ort.availability, Availability::Unavailable { reason } if reason.contains("not loaded")),
            "{:?}",
            ort.availability
        );
        // A graph with a class it may run does load it.
        let mm = xpu_ir::text::parse(
            "graph \"m\" {\n  %0: f32[2,2] = input \"a\"\n  %1: f32[2,2] = matmul(%0, %0)\n  return \"y\" = %1\n}",
        )
        .unwrap();
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.inventory_for(&mm)))
                .is_err()
        );
    }
}
