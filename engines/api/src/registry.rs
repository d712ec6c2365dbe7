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
        let mut engines: Vec<Capabilities> =
            self.engines.iter().map(|e| e.capabilities()).collect();
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
        }
    }
}
