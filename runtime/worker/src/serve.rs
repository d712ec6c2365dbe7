//! The worker's side: hosts one engine, answers the parent's requests one at a time, keeps
//! the executables it prepared. It exits when the parent closes the socket (or dies: the
//! parent asked the kernel to kill it then).

use std::collections::HashMap;
use std::io::BufReader;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use xpu_engine::{Engine, Executable, Fact, StopToken};
use xpu_ir::{BorrowedTensor, Tensor};

use crate::protocol::{Control, Reply, Request, Slot, WireError, receive, send};
use crate::shm::{Region, align};

/// The file descriptors a worker inherits: the shared memory and the socket.
pub(crate) const SHM_FD: i32 = 3;
pub(crate) const SOCKET_FD: i32 = 4;
pub(crate) const CONTROL_FD: i32 = 5;

/// With fault injection on (tests only: `WorkerSetup::inject_faults`), a run with an f32
/// (or f64) input whose first element is one of these values does that instead of running: how the
/// crash tests make a real worker die mid-job in each way a native library can.
pub const FAULT_MARKERS: [(f32, &str); 6] = [
    (-1001.0, "segfault"),
    (-1002.0, "abort"),
    (-1003.0, "hang"),
    (-1004.0, "leak"),
    (-1005.0, "exit"),
    (-1006.0, "poison"),
];

/// Set by the `poison` fault marker: the run fails as a sticky device error would and the
/// worker then retires, as it does when its engine reports itself poisoned.
static INJECTED_POISON: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Serves `engine` on the descriptors the parent handed down, watching the socket for
/// `spin` after each reply before blocking (`WorkerSetup::spin`); returns the exit status.
pub fn serve_inherited(engine: Arc<dyn Engine>, inject_faults: bool, spin: Duration) -> i32 {
    // Rust's SIGSEGV/SIGBUS handler (its stack overflow message) returns from a signal that
    // was sent rather than faulted, so a worker would survive `kill -SEGV`; with the default
    // action every segfault, stack overflows included, ends the worker and the parent
    // reports the signal.
    // SAFETY: setting a signal's disposition to the default affects only this process.
    unsafe {
        libc::signal(libc::SIGSEGV, libc::SIG_DFL);
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
    keep_freed_memory();
    // SAFETY: the parent placed the memfd at SHM_FD, the socket at SOCKET_FD and the control
    // socket at CONTROL_FD before exec (supervise.rs); nothing else in this process owns them.
    let (region, socket, control) = unsafe {
        (
            Region::inherited(SHM_FD),
            UnixStream::from_raw_fd(SOCKET_FD),
            UnixStream::from_raw_fd(CONTROL_FD),
        )
    };
    let in_flight = match watch_control(control) {
        Ok(in_flight) => in_flight,
        Err(e) => {
            eprintln!("xpu-worker ({}): control thread: {e}", engine.name());
            return 1;
        }
    };
    match serve(engine.as_ref(), region, socket, &in_flight, inject_faults, spin) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("xpu-worker ({}): {e}", engine.name());
            1
        }
    }
}

/// Every run allocates its inputs' and outputs' buffers afresh, at the same sizes as the
/// run before. glibc hands buffers past its mmap threshold back to the kernel when freed, so
/// each run page-faulted them in again (on this VM about 100 µs for a 200 KB batch: half
/// the crossing's cost). The worker keeps freed memory for reuse instead; its resident size
/// is bounded by `isolation.max_rss_mb`.
fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only tunes this process's allocator; it is called before serving.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TOP_PAD, 16 << 20);
    }
}

fn serve(
    engine: &dyn Engine,
    mut region: Region,
    socket: UnixStream,
    in_flight: &InFlight,
    inject_faults: bool,
    spin: Duration,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(socket.try_clone()?);
    let mut writer = socket;
    let mut executables: HashMap<u64, Hosted> = HashMap::new();
    // The last run's inputs, by executable: the next run of the same one reads its inputs
    // into their buffers (one executable's, so the worker holds one extra set at most).
    let mut last_inputs: Option<(u64, Vec<Tensor>)> = None;
    let mut watch = crate::wait::RequestWatch::new(spin);
    loop {
        // A busy client's next request comes soon after the reply: watched for about the
        // recent gap between requests, within `spin`, before blocking (an idle CPU's
        // wake-up costs more than the request).
        let replied = std::time::Instant::now();
        crate::wait::spin_for_message(&reader, watch.watch(), None);
        let Some(request) = receive::<Request>(&mut reader)? else { break };
        watch.arrived(replied.elapsed());
        let reply = match request {
            Request::Hello => Reply::Hello {
                version: engine.version(),
                capabilities: engine.capabilities(),
                classes: engine.classes_without_loading(),
            },
            Request::Prepare { id, partition, assignment } => match xpu_ir::from_json(&partition) {
                Err(e) => Reply::Failed(WireError::Other(format!("partition: {e}"))),
                Ok(graph) => match engine.prepare(&graph, &assignment) {
                    Ok(exe) => {
                        executables.insert(id, Hosted { exe, facts_sent: Vec::new() });
                        Reply::Prepared
                    }
                    Err(e) => Reply::Failed((&e).into()),
                },
            },
            Request::Run { id, run: number, inputs } => match executables.get_mut(&id) {
                None => Reply::Failed(WireError::Other(format!("no executable {id} here"))),
                Some(hosted) => {
                    let stop = in_flight.start(number);
                    let reuse = match last_inputs.take() {
                        Some((last, tensors)) if last == id => tensors,
                        _ => Vec::new(),
                    };
                    let ran = run(hosted, &mut region, &inputs, reuse, &stop, inject_faults);
                    in_flight.end();
                    match ran {
                        Ok((reply, tensors)) => {
                            last_inputs = Some((id, tensors));
                            reply
                        }
                        Err(e) => Reply::Failed(e),
                    }
                }
            },
            Request::Release { id } => {
                executables.remove(&id);
                last_inputs.take_if(|(last, _)| *last == id);
                Reply::Released
            }
        };
        // An engine whose device state is poisoned (CUDA after a sticky error) can run
        // nothing more in this process: the worker says so with its reply and exits, and
        // the parent starts a fresh one for the next job.
        let poisoned = engine.poisoned().or_else(|| INJECTED_POISON.get().cloned());
        if let Some(reason) = poisoned {
            eprintln!("xpu-worker ({}): retiring: {reason}", engine.name());
            send(&mut writer, &Reply::Retiring { reply: Box::new(reply), reason })?;
            return Ok(());
        }
        send(&mut writer, &reply)?;
    }
    Ok(())
}

/// A prepared executable and its facts in its last `Ran` reply (the prefix the next reply
/// may keep).
struct Hosted {
    exe: Box<dyn Executable>,
    facts_sent: Vec<Fact>,
}

/// The run in flight (its number) and its stop token, shared with the control thread.
#[derive(Clone, Default)]
struct InFlight(Arc<std::sync::Mutex<RunState>>);

#[derive(Default)]
struct RunState {
    run: u64,
    stop: StopToken,
    /// A Stop for a run not started yet (it overtook its request, which travels on the
    /// other socket): that run starts stopped.
    stop_ahead: u64,
}

impl InFlight {
    fn start(&self, run: u64) -> StopToken {
        let stop = StopToken::new();
        if let Ok(mut s) = self.0.lock() {
            if s.stop_ahead == run {
                stop.cancel();
            }
            *s = RunState { run, stop: stop.clone(), stop_ahead: s.stop_ahead };
        }
        stop
    }

    fn end(&self) {
        if let Ok(mut s) = self.0.lock() {
            s.stop = StopToken::default();
        }
    }

    fn stop(&self, run: u64) {
        let token = match self.0.lock() {
            Ok(s) if s.run == run => s.stop.clone(),
            Ok(mut s) if run > s.run => {
                s.stop_ahead = run;
                return;
            }
            // A Stop that crossed its run's reply.
            _ => return,
        };
        // Cancelled outside the lock: the engine's hooks (ORT's terminate) run here.
        token.cancel();
    }
}

/// Reads the control socket on its own thread: a [`Control::Stop`] cancels the token of the
/// run in flight if it is the run named, so the engine stops at its next check, or at once
/// through its hook (ORT's terminate, DuckDB's interrupt), while the main thread is busy.
fn watch_control(control: UnixStream) -> std::io::Result<InFlight> {
    let in_flight = InFlight::default();
    let target = in_flight.clone();
    std::thread::Builder::new().name("xpu-worker-control".into()).spawn(move || {
        let mut reader = BufReader::new(control);
        while let Ok(Some(Control::Stop { run })) = receive::<Control>(&mut reader) {
            target.stop(run);
        }
    })?;
    Ok(in_flight)
}

/// Runs `exe` on the inputs in the region (read into `reuse`'s buffers where they fit);
/// returns the reply and the input tensors, for the next run to reuse.
fn run(
    hosted: &mut Hosted,
    region: &mut Region,
    inputs: &[Slot],
    reuse: Vec<Tensor>,
    stop: &StopToken,
    inject_faults: bool,
) -> Result<(Reply, Vec<Tensor>), WireError> {
    let io = |e: std::io::Error| WireError::Other(format!("shared memory: {e}"));
    let started = std::time::Instant::now();
    let end = inputs.iter().map(|s| s.offset.saturating_add(s.len)).max().unwrap_or(0);
    region.map_through(end).map_err(io)?;
    let input_error =
        |i: usize, message: String| WireError::Input { name: format!("#{i}"), message };
    let views = inputs
        .iter()
        .enumerate()
        .map(|(i, slot)| region.borrowed(slot).map_err(|e| input_error(i, e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if inject_faults && inject_fault(views.iter().filter_map(fault_marker)) {
        return Err(injected_poison());
    }
    // An engine that reads elements where they lie (ORT) gets the shared memory itself: no
    // copy, and the buffers of the run before stay unused. Others get tensors, copied into
    // the last run's buffers where they fit.
    let exe = hosted.exe.as_mut();
    let (ran, inputs_read, tensors) = if exe.reads_borrowed() {
        let inputs_read = started.elapsed();
        (exe.run_borrowed(&views, stop), inputs_read, Vec::new())
    } else {
        let mut reuse = reuse.into_iter();
        let tensors = views
            .iter()
            .enumerate()
            .map(|(i, view)| view.to_tensor_in(reuse.next()).map_err(|m| input_error(i, m)))
            .collect::<Result<Vec<_>, _>>()?;
        let inputs_read = started.elapsed();
        (exe.run_until(&tensors, stop), inputs_read, tensors)
    };
    let ran = ran.map_err(|e| WireError::from(&e))?;
    let outputs = region.put_all(align(end), &ran.outputs).map_err(io)?;
    let sent = &mut hosted.facts_sent;
    let facts_kept = sent.iter().zip(&ran.facts).take_while(|(a, b)| a == b).count();
    let facts = ran.facts[facts_kept..].to_vec();
    *sent = ran.facts;
    let reply = Reply::Ran {
        outputs,
        timings: ran.timings,
        facts_kept,
        facts,
        inputs_read,
        served: started.elapsed(),
    };
    Ok((reply, tensors))
}

fn injected_poison() -> WireError {
    WireError::Kernel {
        node: "(injected)".into(),
        message: "an injected sticky device error: it poisons this worker process".into(),
    }
}

/// An input's first element, where it could be a fault marker (f32 or f64).
fn fault_marker(b: &BorrowedTensor<'_>) -> Option<f32> {
    match b.elements::<f32>() {
        Some(v) => v.first().copied(),
        None => b.elements::<f64>()?.first().map(|&v| v as f32),
    }
}

/// Does what the first marked input's marker says (see [`FAULT_MARKERS`]); true when the
/// run is to fail as a poisoning device error.
fn inject_fault(firsts: impl Iterator<Item = f32>) -> bool {
    let fault = firsts
        .filter_map(|first| FAULT_MARKERS.iter().find(|(m, _)| *m == first))
        .map(|(_, fault)| fault)
        .next();
    let Some(fault) = fault else { return false };
    match *fault {
        "segfault" => {
            // SAFETY: raise signals this process; SIGSEGV's default action (set at start)
            // ends it, which is the point.
            unsafe { libc::raise(libc::SIGSEGV) };
        }
        "abort" => std::process::abort(),
        "hang" => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        "leak" => {
            // 64 MiB touched and never freed, per run: the worker's memory grows.
            std::mem::forget(vec![1u8; 64 << 20]);
        }
        "poison" => {
            let _ = INJECTED_POISON.set("an injected sticky device error".into());
            return true;
        }
        _ => std::process::exit(3),
    }
    false
}

#[cfg(test)]
mod tests {
    use super::InFlight;

    #[test]
    fn a_stop_reaches_its_run_only() {
        let runs = InFlight::default();
        let first = runs.start(1);
        runs.stop(1);
        assert!(first.is_cancelled(), "the run in flight stops");
        runs.end();
        let second = runs.start(2);
        runs.stop(1);
        assert!(!second.is_cancelled(), "a Stop that crossed its run's reply is ignored");
        runs.end();
        runs.stop(3);
        assert!(runs.start(3).is_cancelled(), "a Stop that overtook its run stops it at start");
        runs.end();
        assert!(!runs.start(4).is_cancelled(), "and only that run");
    }
}
