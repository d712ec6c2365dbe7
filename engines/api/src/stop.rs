//! Stopping a run that has started: a job cancelled by its owner, or one past its
//! `execution.timeout`. Engines check the token between nodes (a node is never split) and
//! may register a hook that interrupts work they cannot poll (a DuckDB query, an ONNX
//! Runtime or OpenVINO inference), which a cancel fires at once and a deadline fires when it
//! passes — so `execution.timeout` bounds a single long node too.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::EngineError;

type Hook = Arc<dyn Fn() + Send + Sync>;

struct State {
    cancelled: AtomicBool,
    origin: Instant,
    /// Nanoseconds after `origin` the run must end by; 0: no deadline.
    deadline_ns: AtomicU64,
    hooks: Mutex<Vec<(u64, Hook)>>,
    next_hook: AtomicU64,
}

/// Shared by whoever may stop a run and the engines running it. Cloning shares it; the
/// default token never stops (and costs nothing to check).
#[derive(Clone, Default)]
pub struct StopToken(Option<Arc<State>>);

impl std::fmt::Debug for StopToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopToken").field("cancelled", &self.is_cancelled()).finish()
    }
}

/// Why a run stopped before its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Cancelled,
    DeadlinePassed,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::Cancelled => "cancelled",
            StopReason::DeadlinePassed => "past its deadline",
        })
    }
}

impl StopToken {
    /// A token that can be cancelled (and given a deadline).
    pub fn new() -> StopToken {
        StopToken(Some(Arc::new(State {
            cancelled: AtomicBool::new(false),
            origin: Instant::now(),
            deadline_ns: AtomicU64::new(0),
            hooks: Mutex::new(Vec::new()),
            next_hook: AtomicU64::new(0),
        })))
    }

    /// Stops the run: engines see it at their next check, and registered hooks run now.
    pub fn cancel(&self) {
        let Some(s) = &self.0 else { return };
        s.cancelled.store(true, Ordering::Release);
        let hooks: Vec<Hook> =
            s.hooks.lock().map(|h| h.iter().map(|(_, f)| f.clone()).collect()).unwrap_or_default();
        for hook in hooks {
            hook();
        }
    }

    /// The default token: it never stops and cannot be cancelled or given a deadline.
    pub fn is_inert(&self) -> bool {
        self.0.is_none()
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(|s| s.cancelled.load(Ordering::Acquire))
    }

    /// The run must end within `limit` from now (the earlier deadline wins).
    pub fn set_deadline(&self, limit: Duration) {
        let Some(s) = &self.0 else { return };
        let at = (s.origin.elapsed() + limit).as_nanos().max(1) as u64;
        let _ = s.deadline_ns.fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
            (d == 0 || at < d).then_some(at)
        });
    }

    /// Why the run must stop now, if it must.
    pub fn reason(&self) -> Option<StopReason> {
        let s = self.0.as_ref()?;
        if s.cancelled.load(Ordering::Acquire) {
            return Some(StopReason::Cancelled);
        }
        let d = s.deadline_ns.load(Ordering::Acquire);
        (d != 0 && s.origin.elapsed().as_nanos() as u64 > d).then_some(StopReason::DeadlinePassed)
    }

    /// For engines, between nodes: an error naming the node reached (`node` is called
    /// only then) when the run must stop.
    pub fn check(&self, node: impl FnOnce() -> String) -> Result<(), EngineError> {
        match self.reason() {
            None => Ok(()),
            Some(reason) => Err(EngineError::Stopped { node: node(), reason }),
        }
    }

    /// Runs `hook` if the run must stop while the guard lives: at a cancel (at once if it
    /// already is cancelled), or when its deadline passes. How an engine interrupts a call it
    /// cannot poll.
    pub fn on_stop(&self, hook: impl Fn() + Send + Sync + 'static) -> HookGuard {
        let Some(s) = &self.0 else { return HookGuard { hook: None, watchdog: None } };
        let id = s.next_hook.fetch_add(1, Ordering::Relaxed);
        let hook: Hook = Arc::new(hook);
        if let Ok(mut hooks) = s.hooks.lock() {
            hooks.push((id, hook.clone()));
        }
        if self.reason().is_some() {
            // Stopped between the engine's last check and the registration.
            hook();
        }
        let watchdog = self.remaining().map(|left| {
            // A thread that sleeps until the deadline unless the guard is dropped first
            // (dropping the sender wakes it with `Disconnected`).
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let hook = hook.clone();
            let spawned =
                std::thread::Builder::new().name("xpu-deadline".into()).spawn(move || {
                    if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(left) {
                        hook();
                    }
                });
            // Without a thread the deadline is still checked between nodes.
            spawned.ok().map(|_| tx)
        });
        HookGuard { hook: Some((s.clone(), id)), watchdog: watchdog.flatten() }
    }

    /// Time left before the deadline (`None`: no deadline).
    pub fn remaining(&self) -> Option<Duration> {
        let s = self.0.as_ref()?;
        let d = s.deadline_ns.load(Ordering::Acquire);
        (d != 0).then(|| Duration::from_nanos(d).saturating_sub(s.origin.elapsed()))
    }
}

/// Unregisters its hook (and stops its deadline watchdog) when dropped.
pub struct HookGuard {
    hook: Option<(Arc<State>, u64)>,
    watchdog: Option<std::sync::mpsc::Sender<()>>,
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        drop(self.watchdog.take());
        if let Some((s, id)) = &self.hook
            && let Ok(mut hooks) = s.hooks.lock()
        {
            hooks.retain(|(h, _)| h != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn cancel_is_seen_and_fires_live_hooks_only() {
        let t = StopToken::new();
        assert_eq!(t.check(|| "n0".into()), Ok(()));
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let live = t.on_stop(move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
        let f = fired.clone();
        drop(t.on_stop(move || {
            f.fetch_add(100, Ordering::SeqCst);
        }));
        t.clone().cancel();
        assert_eq!(fired.load(Ordering::SeqCst), 1, "only the hook still registered runs");
        assert_eq!(t.reason(), Some(StopReason::Cancelled));
        let err = t.check(|| "n3".into()).unwrap_err();
        assert_eq!(err.to_string(), "n3: stopped (cancelled)");
        drop(live);
        // Registering after the cancel runs the hook at once.
        let f = fired.clone();
        let _late = t.on_stop(move || {
            f.fetch_add(10, Ordering::SeqCst);
        });
        assert_eq!(fired.load(Ordering::SeqCst), 11);
    }

    #[test]
    fn a_passing_deadline_fires_live_hooks() {
        let t = StopToken::new();
        t.set_deadline(Duration::from_millis(50));
        let (tx, rx) = std::sync::mpsc::channel();
        let _guard = t.on_stop(move || {
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(20)).expect("the deadline fired the hook");
        assert_eq!(t.reason(), Some(StopReason::DeadlinePassed));
        // A guard dropped before its deadline never fires.
        let t = StopToken::new();
        t.set_deadline(Duration::from_millis(30));
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        drop(t.on_stop(move || {
            f.fetch_add(1, Ordering::SeqCst);
        }));
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(fired.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn deadlines_pass_and_the_earlier_wins() {
        let t = StopToken::new();
        t.set_deadline(Duration::from_secs(3600));
        assert_eq!(t.reason(), None);
        t.set_deadline(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(t.reason(), Some(StopReason::DeadlinePassed));
        t.set_deadline(Duration::from_secs(3600));
        assert_eq!(t.reason(), Some(StopReason::DeadlinePassed), "a later deadline is ignored");
        let never = StopToken::default();
        never.cancel();
        never.set_deadline(Duration::ZERO);
        assert_eq!(never.reason(), None);
    }
}
