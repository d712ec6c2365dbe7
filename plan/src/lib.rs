//! Planning and execution: [`plan`] is the pure function (graph, policy, inventory) →
//! ([`CapturePlan`], [`Explanation`]) that decides engine, kernel and precision for every
//! node with a reason code for every rejected candidate; [`GraphExec`] runs a plan over the
//! engines registered in a process and adds timings, transfers and engine facts to the
//! explanation; [`PlanCache`] reuses plans while their inputs stay the same.

pub mod cache;
pub mod evidence;
pub mod exec;
pub mod frozen;
pub mod model;
pub mod passes;
pub mod planner;
pub mod prepared;
pub mod reason;
pub mod render;

pub use cache::{CachedPlan, Keys, PlanCache, PlanKey, bind_symbols};
pub use exec::{ExecError, GraphExec, RunRecord};
pub use frozen::PlanFileError;
pub use model::{
    CapturePlan, Decision, Explanation, FrozenPlan, PartitionPrepared, PrepareOutcome, Rejection,
};
pub use passes::PassRecord;
pub use planner::{PlanFailure, plan, plan_shared, plan_with};
pub use prepared::{PreparedCache, PreparedStats};
pub use reason::ReasonCode;

impl Explanation {
    /// Adds what a run measured: timings, transfers performed and engine facts.
    pub fn record_run(&mut self, run: &RunRecord) {
        self.timings = run.timings.clone();
        self.transfers_done = run.transfers.clone();
        self.facts = run.facts.clone();
        self.prepared = run.prepared.clone();
    }
}
