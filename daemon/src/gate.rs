//! Admission: how many jobs execute at once. `workers` slots in all (a worker thread, or a
//! request thread running a small waited job in place, holds one while it executes), and
//! at most `limits.engine_concurrency[e]` jobs using engine `e`. A planned job whose engine
//! is at its limit is parked — it holds no slot, so jobs for other engines keep flowing —
//! and is admitted, oldest first, by the job that frees its engine.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

pub struct Gate<T> {
    slots: usize,
    limits: BTreeMap<String, usize>,
    state: Mutex<State<T>>,
    freed: Condvar,
}

struct State<T> {
    busy: usize,
    /// Threads blocked in `take_slot` (a release wakes one only when there is one).
    waiting: usize,
    by_engine: HashMap<String, usize>,
    parked: VecDeque<(Vec<String>, T)>,
}

impl<T> Gate<T> {
    pub fn new(slots: usize, limits: BTreeMap<String, usize>) -> Gate<T> {
        Gate {
            slots: slots.max(1),
            limits,
            state: Mutex::new(State {
                busy: 0,
                waiting: 0,
                by_engine: HashMap::new(),
                parked: VecDeque::new(),
            }),
            freed: Condvar::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<T>> {
        // The state is counters and a queue, each updated in one step: usable after a panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes an execution slot, waiting for one.
    pub fn take_slot(&self) {
        let mut s = self.state();
        s.waiting += 1;
        while s.busy >= self.slots {
            s = self.freed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.waiting -= 1;
        s.busy += 1;
    }

    /// Takes a slot only if one is free and no worker is waiting for one (a queued job
    /// goes first).
    pub fn try_take_slot(&self) -> bool {
        let mut s = self.state();
        let free = s.busy < self.slots && s.waiting == 0;
        if free {
            s.busy += 1;
        }
        free
    }

    pub fn release_slot(&self) {
        let mut s = self.state();
        s.busy = s.busy.saturating_sub(1);
        if s.waiting > 0 {
            self.freed.notify_one();
        }
    }

    /// The engines among `engines` that have a limit.
    pub fn limited<'e>(&self, engines: impl IntoIterator<Item = &'e str>) -> Vec<String> {
        engines.into_iter().filter(|e| self.limits.contains_key(*e)).map(String::from).collect()
    }

    /// Admits `item` to run on `engines` (from [`limited`](Gate::limited)) and gives it
    /// back, or parks it when one of them is at its limit (None).
    pub fn enter(&self, engines: Vec<String>, item: T) -> Option<T> {
        let mut s = self.state();
        if self.fits(&s, &engines) {
            Self::count(&mut s, &engines, 1);
            Some(item)
        } else {
            s.parked.push_back((engines, item));
            None
        }
    }

    /// Leaves `engines`; returns the parked items that now fit, already admitted, oldest
    /// first (the caller runs them, then leaves their engines in turn).
    pub fn leave(&self, engines: &[String]) -> Vec<T> {
        if engines.is_empty() {
            return Vec::new();
        }
        let mut s = self.state();
        Self::count(&mut s, engines, -1);
        let mut admitted = Vec::new();
        let mut i = 0;
        while i < s.parked.len() {
            if self.fits(&s, &s.parked[i].0) {
                let (e, item) = s.parked.remove(i).expect("index checked");
                Self::count(&mut s, &e, 1);
                admitted.push(item);
            } else {
                i += 1;
            }
        }
        admitted
    }

    /// Takes a parked item out (a cancelled job), if one matches.
    pub fn unpark(&self, matches: impl Fn(&T) -> bool) -> Option<T> {
        let mut s = self.state();
        let i = s.parked.iter().position(|(_, item)| matches(item))?;
        s.parked.remove(i).map(|(_, item)| item)
    }

    pub fn parked(&self) -> usize {
        self.state().parked.len()
    }

    fn fits(&self, s: &State<T>, engines: &[String]) -> bool {
        engines.iter().all(|e| {
            let limit = self.limits.get(e).copied().unwrap_or(usize::MAX);
            s.by_engine.get(e).copied().unwrap_or(0) < limit
        })
    }

    fn count(s: &mut State<T>, engines: &[String], delta: isize) {
        for e in engines {
            let n = s.by_engine.entry(e.clone()).or_insert(0);
            *n = n.saturating_add_signed(delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> Gate<&'static str> {
        Gate::new(2, BTreeMap::from([("table".to_string(), 1)]))
    }

    #[test]
    fn an_engine_at_its_limit_parks_jobs_and_admits_them_in_order() {
        let g = gate();
        let table = || g.limited(["cpu", "table"]);
        assert_eq!(table(), vec!["table".to_string()], "cpu has no limit");
        assert_eq!(g.enter(table(), "a"), Some("a"));
        assert_eq!(g.enter(table(), "b"), None);
        assert_eq!(g.enter(table(), "c"), None);
        assert_eq!(g.enter(g.limited(["cpu"]), "d"), Some("d"), "other engines still flow");
        assert_eq!(g.parked(), 2);
        assert_eq!(g.leave(&table()), vec!["b"], "one admitted per freed place, oldest first");
        assert_eq!(g.unpark(|j| *j == "c"), Some("c"));
        assert_eq!(g.leave(&table()), Vec::<&str>::new());
        assert_eq!(g.enter(table(), "e"), Some("e"), "the place is free again");
    }

    #[test]
    fn slots_bound_execution_and_queued_work_goes_first() {
        let g = std::sync::Arc::new(gate());
        assert!(g.try_take_slot());
        g.take_slot();
        assert!(!g.try_take_slot(), "both slots are busy");
        let waiter = {
            let g = g.clone();
            std::thread::spawn(move || g.take_slot())
        };
        while g.state().waiting == 0 {
            std::thread::yield_now();
        }
        g.release_slot();
        waiter.join().unwrap();
        assert_eq!(g.state().busy, 2, "the waiting worker got the freed slot");
        g.release_slot();
        g.state().waiting = 1;
        assert!(!g.try_take_slot(), "a free slot goes to a waiting worker first");
        g.state().waiting = 0;
        assert!(g.try_take_slot());
    }
}
