//! Stopping a request in flight: a cancel or a deadline that fires while the parent waits
//! for its worker's reply tells the worker to stop that run, and kills a worker that does
//! not answer in time.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xpu_engine::StopToken;

use crate::protocol::{Control, send};

/// How long a worker told to stop may take to answer before it is killed: engines stop at
/// their next check or at once through a hook (ORT's terminate, DuckDB's interrupt), but a
/// single long kernel of generated code is never split.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// Stops a worker's request from another thread: a stop (a cancel, a deadline) fires while
/// the caller waits for the reply; it sends [`Control::Stop`] on the control socket and kills
/// the worker if the request is still in flight [`STOP_GRACE`] later.
pub(crate) struct Stopper {
    state: Arc<Mutex<StopperState>>,
}

struct StopperState {
    control: UnixStream,
    /// The worker's process (killed if it does not stop).
    pid: libc::pid_t,
    /// The call in flight: a sequence number of this side's.
    in_flight: Option<u64>,
    calls: u64,
}

/// Ends the watch of one call when dropped.
pub(crate) struct Watch {
    state: Arc<Mutex<StopperState>>,
    _hook: Option<xpu_engine::HookGuard>,
}

impl Stopper {
    pub(crate) fn new(control: UnixStream, pid: libc::pid_t) -> Stopper {
        let state = StopperState { control, pid, in_flight: None, calls: 0 };
        Stopper { state: Arc::new(Mutex::new(state)) }
    }

    /// Until the returned guard drops, a stop of `stop` tells the worker to stop run `run`
    /// (0: the call is not a run, so there is nothing to tell) and kills it if the call is
    /// still in flight [`STOP_GRACE`] later.
    pub(crate) fn watch(&self, run: u64, stop: &StopToken) -> Watch {
        if stop.is_inert() {
            return Watch { state: self.state.clone(), _hook: None };
        }
        let call = match self.state.lock() {
            Ok(mut s) => {
                s.calls += 1;
                s.in_flight = Some(s.calls);
                s.calls
            }
            Err(_) => return Watch { state: self.state.clone(), _hook: None },
        };
        let state = self.state.clone();
        let hook = stop.on_stop(move || {
            let Ok(mut s) = state.lock() else { return };
            if s.in_flight != Some(call) {
                return;
            }
            if run > 0 {
                let _ = send(&mut s.control, &Control::Stop { run });
            }
            let state = state.clone();
            let _ = std::thread::Builder::new().name("xpu-worker-stop".into()).spawn(move || {
                std::thread::sleep(STOP_GRACE);
                if let Ok(s) = state.lock()
                    && s.in_flight == Some(call)
                {
                    // The worker stays our unreaped child while its call is in flight (it is
                    // reaped only after the watch ends), so the pid is still its.
                    // SAFETY: kill sends a signal to our own child process.
                    unsafe { libc::kill(s.pid, libc::SIGKILL) };
                }
            });
        });
        Watch { state: self.state.clone(), _hook: Some(hook) }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock() {
            s.in_flight = None;
        }
    }
}
