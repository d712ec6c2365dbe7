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
        self.inventory_with(|_, _| Ok(()))
    }

    /// The live inventory for planning `graph`: an engine that says, without loading its
    /// library, that it runs none of the graph's op classes is not loaded and is listed as
    /// unavailable for that reason (a table-only job does not pay for ONNX Runtime).
    pub fn inventory_for(&self, graph: &xpu_ir::Graph) -> Inventory {
        let classes: Vec<xpu_ir::OpClass> = graph.nodes.iter().map(|n| n.op.class()).collect();
        self.inventory_with(|e, _| Self::runs_some(e, &classes))
    }

    /// [`Registry::inventory_for`] for a plan that can only place nodes on `may_place_on`
    /// (`Policy::engines_it_may_place_on`; `None`: any engine): the other engines are not
    /// loaded either, and are listed as unavailable for that reason. A local `xpuctl run`
    /// under an `llvm, cpu` policy does not pay for loading ONNX Runtime and OpenVINO.
    pub fn inventory_for_engines(
        &self,
        graph: &xpu_ir::Graph,
        may_place_on: Option<&std::collections::BTreeSet<String>>,
    ) -> Inventory {
        let Some(allowed) = may_place_on else { return self.inventory_for(graph) };
        let classes: Vec<xpu_ir::OpClass> = graph.nodes.iter().map(|n| n.op.class()).collect();
        // The planner puts a constant no placed node reads on the inventory's first available
        // engine: until one is available, engines are loaded whether allowed or not, so that
        // engine is the one it would be with every engine loaded.
        self.inventory_with(|e, available_seen| {
            Self::runs_some(e, &classes)?;
            if !allowed.contains(e.name()) && available_seen {
                return Err("not loaded: the policy places no node on it");
            }
            Ok(())
        })
    }

    fn runs_some(e: &dyn Engine, classes: &[xpu_ir::OpClass]) -> Result<(), &'static str> {
        match e.classes_without_loading() {
            Some(runs) if !classes.iter().any(|c| runs.contains(c)) => {
                Err("not loaded: it runs none of this graph's op classes")
            }
            _ => Ok(()),
        }
    }

    /// The inventory with each engine's capabilities where `load` says to load it, else
    /// the engine listed as unavailable with `load`'s reason. `load` is asked in
    /// registration order and told whether an engine before it turned out available.
    fn inventory_with(
        &self,
        load: impl Fn(&dyn Engine, bool) -> Result<(), &'static str>,
    ) -> Inventory {
        let mut available_seen = false;
        let mut engines: Vec<Capabilities> = Vec::with_capacity(self.engines.len());
        for e in &self.engines {
            let caps = match load(e.as_ref(), available_seen) {
                Ok(()) => e.capabilities(),
                Err(reason) => Capabilities::absent(
                    e.name(),
                    Availability::Unavailable { reason: reason.into() },
                ),
            };
            available_seen |= caps.availability.is_available();
            engines.push(caps);
        }
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
            host: Some(crate::HostMachine::this().clone()),
            notes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Assignment, EngineError, Executable};
    use xpu_ir::{Graph, OpClass};

    /// A test engine: `Stub::Heavy` (ort) must not be loaded — asking its capabilities
    /// fails the test — and says without loading that it runs matrix products only;
    /// `Stub::Light` is cheap, available or not as told.
    enum Stub {
        Heavy,
        Light(&'static str, bool),
    }

    impl Engine for Stub {
        fn name(&self) -> &str {
            match self {
                Stub::Heavy => "ort",
                Stub::Light(name, _) => name,
            }
        }
        fn version(&self) -> String {
            String::new()
        }
        fn capabilities(&self) -> Capabilities {
            let available = match self {
                Stub::Heavy => panic!("the heavy engine was loaded"),
                Stub::Light(_, available) => *available,
            };
            let availability = if available {
                Availability::Available
            } else {
                Availability::Unavailable { reason: "no library".into() }
            };
            Capabilities::absent(self.name(), availability)
        }
        fn classes_without_loading(&self) -> Option<Vec<OpClass>> {
            matches!(self, Stub::Heavy).then(|| vec![OpClass::MatMul])
        }
        fn prepare(&self, _: &Graph, _: &Assignment) -> Result<Box<dyn Executable>, EngineError> {
            Err(EngineError::Other("unused".into()))
        }
    }

    fn relu_graph() -> Graph {
        let text = "graph \"t\" {\n  %0: f32[2] = input \"x\"\n  %1: f32[2] = relu(%0)\n  return \"y\" = %1\n}";
        xpu_ir::text::parse(text).unwrap()
    }

    fn matmul_graph() -> Graph {
        let text = "graph \"m\" {\n  %0: f32[2,2] = input \"a\"\n  %1: f32[2,2] = matmul(%0, %0)\n  return \"y\" = %1\n}";
        xpu_ir::text::parse(text).unwrap()
    }

    #[test]
    fn an_engine_that_runs_none_of_a_graphs_classes_is_not_loaded() {
        let mut r = Registry::new();
        r.register(Arc::new(Stub::Heavy));
        let g = relu_graph();
        let inv = r.inventory_for(&g);
        let ort = inv.engine("ort").unwrap();
        assert!(
            matches!(&ort.availability, Availability::Unavailable { reason } if reason.contains("not loaded")),
            "{:?}",
            ort.availability
        );
        // A graph with a class it may run does load it.
        let mm = matmul_graph();
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.inventory_for(&mm)))
                .is_err()
        );
    }

    #[test]
    fn until_an_engine_is_available_every_engine_is_loaded() {
        // The planner places a constant no placed node reads on the first available engine:
        // leaving an engine before it unloaded would change that choice.
        let mm = matmul_graph();
        let only_llvm: std::collections::BTreeSet<String> = ["llvm"].map(String::from).into();
        let mut r = Registry::new();
        r.register(Arc::new(Stub::Light("cpu", false)));
        r.register(Arc::new(Stub::Heavy));
        r.register(Arc::new(Stub::Light("llvm", true)));
        let load = || r.inventory_for_engines(&mm, Some(&only_llvm));
        assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(load)).is_err());
        // With an available engine first, the heavy one outside the policy stays unloaded.
        let mut r = Registry::new();
        r.register(Arc::new(Stub::Light("cpu", true)));
        r.register(Arc::new(Stub::Heavy));
        r.register(Arc::new(Stub::Light("llvm", true)));
        let inv = r.inventory_for_engines(&mm, Some(&only_llvm));
        assert!(inv.engine("cpu").unwrap().availability.is_available(), "loaded, not allowed");
        assert!(!inv.engine("ort").unwrap().availability.is_available());
    }

    #[test]
    fn an_engine_the_policy_places_nothing_on_is_not_loaded() {
        let mut r = Registry::new();
        r.register(Arc::new(Stub::Light("cpu", true)));
        r.register(Arc::new(Stub::Heavy));
        let mm = matmul_graph();
        let llvm_and_cpu: std::collections::BTreeSet<String> =
            ["llvm", "cpu", "table"].map(String::from).into();
        // (cpu, registered first and available, is the engine the planner would give a
        // stray constant; ort comes after it.)
        let inv = r.inventory_for_engines(&mm, Some(&llvm_and_cpu));
        let ort = inv.engine("ort").unwrap();
        assert!(
            matches!(&ort.availability, Availability::Unavailable { reason } if reason.contains("places no node on it")),
            "{:?}",
            ort.availability
        );
        // Named by the policy (or no order at all: any engine), it is loaded.
        let with_ort: std::collections::BTreeSet<String> = ["ort"].map(String::from).into();
        for allowed in [Some(&with_ort), None] {
            let load = || r.inventory_for_engines(&mm, allowed);
            assert!(std::panic::catch_unwind(std::panic::AssertUnwindSafe(load)).is_err());
        }
        // Named, but running none of the graph's classes: still not loaded.
        let relu = relu_graph();
        let inv = r.inventory_for_engines(&relu, Some(&with_ort));
        assert!(!inv.engine("ort").unwrap().availability.is_available());
    }
}
