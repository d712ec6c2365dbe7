//! The parent's side: [`WorkerEngine`] forwards an engine's calls to its worker processes,
//! notices a worker's death, restarts it with backoff and quarantines partitions that keep
//! killing it.
//!
//! An engine has up to [`WorkerSetup::processes`] workers, each serving one request at a
//! time. An executable lives on the worker that prepared it; a new one is prepared on an idle
//! worker (the one holding the fewest executables), else on a worker not yet started, else it
//! waits for the least loaded. One whose worker is busy with another job when it runs moves
//! to an idle running worker (prepared again there) rather than wait. A serial load so keeps one worker, while concurrent jobs —
//! which the prepared cache gives executables of their own — run side by side.

use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use xpu_engine::{
    Assignment, Availability, Capabilities, Engine, EngineError, Executable, Execution, Fact,
    StopReason, StopToken,
};
use xpu_ir::{Graph, OpClass, Tensor, TensorData};

use crate::protocol::{Reply, Request, Slot, WireError, receive, send};
use crate::serve::{CONTROL_FD, SHM_FD, SOCKET_FD};
use crate::shm::Region;
use crate::stop::Stopper;

/// A partition that crashed its worker this many times in a row (no successful run between)
/// is refused.
pub const QUARANTINE_AFTER: u32 = 3;
/// How long a starting worker may take to answer its first request (loading a runtime
/// library such as OpenVINO's takes seconds).
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Restart backoff after consecutive crashes: 100 ms, doubling, at most this.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The spin budget xpud and xpuctl give each side by default (`isolation.spin_us`): a
/// batch-1 model's run (~80 µs here) is answered within it (its overhead through the worker
/// 38 → 21 µs measured), and a worker watches at most this long after each reply. A 2 ms
/// budget did not help batch 64 on these VMs (docs/benchmarks.md, session 26).
pub const DEFAULT_SPIN: Duration = Duration::from_micros(200);

/// How to start an engine's worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSetup {
    /// The worker program (`xpu-worker`, beside xpud and xpuctl).
    pub program: PathBuf,
    /// Arguments after `--engine NAME` (the engine's configuration).
    pub args: Vec<String>,
    /// Tests only: the worker obeys the fault markers of [`crate::FAULT_MARKERS`].
    pub inject_faults: bool,
    /// A worker whose resident memory is past this after a run is replaced before the next
    /// one (0: no limit): a leak costs a restart, not the machine.
    pub max_rss_bytes: u64,
    /// Worker processes the engine may have at once (each serves one request at a time;
    /// they start as concurrent use needs them). 0 counts as 1.
    pub processes: usize,
    /// A worker other than the first that has served nothing for this long is closed (its
    /// executables are prepared again if concurrent use comes back). Zero: never.
    pub idle_exit: Duration,
    /// How long each side watches its socket before blocking (see `wait.rs`): the parent
    /// around a run's expected end, the worker after each reply. Zero: block at once.
    pub spin: Duration,
}

/// What a process's workers have done, per engine (for metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineWorkerStats {
    /// Workers started, the first included.
    pub starts: u64,
    /// Workers that ended other than by this process closing them, by cause (`SIGSEGV`,
    /// `SIGABRT`, `exit status 3`, `timeout`, `cancelled`, `memory`, …).
    pub restarts: BTreeMap<String, u64>,
    /// Jobs that failed because their worker died under them.
    pub crashed_jobs: u64,
    /// Workers running now.
    pub alive: u64,
    /// The last start's time to its first answer.
    pub last_start: Duration,
    /// Workers closed after `idle_exit` without a request.
    pub retired: u64,
}

static STATS: LazyLock<Mutex<BTreeMap<String, EngineWorkerStats>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// This process's worker statistics, by engine.
pub fn stats_snapshot() -> BTreeMap<String, EngineWorkerStats> {
    STATS.lock().map(|s| s.clone()).unwrap_or_default()
}

fn with_stats(engine: &str, f: impl FnOnce(&mut EngineWorkerStats)) {
    if let Ok(mut s) = STATS.lock() {
        f(s.entry(engine.to_string()).or_default());
    }
}

struct Worker {
    child: Child,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    region: Region,
    /// Sends a running request's Stop, and kills the worker that ignores it.
    stopper: Stopper,
    /// Runs sent so far (the number of the next is one more).
    runs: u64,
    /// `/proc/<pid>/statm`, open while the worker lives: its resident size is read after
    /// every run with one `pread`, not an open, read and close.
    statm: Option<std::fs::File>,
    /// It said it exits after its last reply (`Reply::Retiring`: its engine is poisoned
    /// for the process); replaced before the next request, counted as cause `poisoned`.
    retiring: bool,
    /// The worker's stderr, passed on to this process's and its last lines kept: what a
    /// worker that could not start said (the loader's missing library) is its reason.
    stderr: StderrTail,
}

/// A worker's stderr forwarded line by line to this process's stderr by a thread of its
/// own, the last [`StderrTail::KEEP`] bytes kept.
struct StderrTail {
    kept: Arc<Mutex<std::collections::VecDeque<u8>>>,
    /// Says the forwarder read to the end (the pipe closed).
    done: Option<std::sync::mpsc::Receiver<()>>,
}

impl StderrTail {
    const KEEP: usize = 2048;

    fn forward(from: Option<std::process::ChildStderr>) -> StderrTail {
        use std::io::{BufRead, Write};
        let kept = Arc::new(Mutex::new(std::collections::VecDeque::new()));
        let (tx, done) = std::sync::mpsc::channel();
        let forwarder = from.and_then(|pipe| {
            let kept = kept.clone();
            std::thread::Builder::new()
                .name("xpu-worker-stderr".into())
                .spawn(move || {
                    let mut lines = std::io::BufReader::new(pipe);
                    let mut line = Vec::new();
                    while matches!(lines.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                        let _ = std::io::stderr().write_all(&line);
                        if let Ok(mut k) = kept.lock() {
                            k.extend(&line);
                            let excess = k.len().saturating_sub(StderrTail::KEEP);
                            k.drain(..excess);
                        }
                        line.clear();
                    }
                    let _ = tx.send(());
                })
                .ok()
        });
        StderrTail { kept, done: forwarder.map(|_| done) }
    }

    /// What the worker wrote last, as one line (empty if nothing), once it has exited: the
    /// forwarder is given a moment to read to the end, not waited for (a process the
    /// worker started may hold the pipe open).
    fn last_words(&mut self) -> String {
        if let Some(done) = self.done.take() {
            let _ = done.recv_timeout(Duration::from_millis(500));
        }
        let kept = self.kept.lock().map(|k| k.iter().copied().collect::<Vec<u8>>());
        let text = String::from_utf8_lossy(&kept.unwrap_or_default()).into_owned();
        let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        lines[lines.len().saturating_sub(3)..].join(" / ")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the socket ends the worker's loop; kill covers one that does not listen.
        let _ = self.writer.shutdown(std::net::Shutdown::Both);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Default)]
struct Conn {
    worker: Option<Worker>,
    generation: u64,
    consecutive_crashes: u32,
    last_crash: Option<Instant>,
    /// When the worker last answered (or started).
    last_used: Option<Instant>,
}

struct Hello {
    version: String,
    capabilities: Capabilities,
    classes: Option<Vec<OpClass>>,
}

/// One worker process's place in the engine's pool.
#[derive(Default)]
struct WorkerSlot {
    conn: Mutex<Conn>,
    /// Executables prepared on this slot and not dropped yet (new ones go to the emptiest).
    executables: AtomicUsize,
    /// Executables dropped since the slot's last request, by (id, generation of the worker
    /// that prepared them), released before its next. Apart from `conn` so that dropping an
    /// executable never waits for a run in flight on the slot.
    released: Mutex<Vec<(u64, u64)>>,
}

struct Inner {
    name: String,
    setup: WorkerSetup,
    slots: Vec<WorkerSlot>,
    hello: Mutex<Option<Arc<Hello>>>,
    /// Crashes per partition (hash of the partition and its assignment).
    crashes: Mutex<HashMap<String, u32>>,
    next_id: AtomicU64,
}

/// An engine run in a supervised worker process.
#[derive(Clone)]
pub struct WorkerEngine {
    inner: Arc<Inner>,
}

/// How a call to the worker went wrong.
enum Failure {
    /// The worker died (or was killed at a stop); the cause as the metrics label it.
    Died(String),
    /// The engine answered with an error.
    Engine(EngineError),
}

impl WorkerEngine {
    /// An engine named `name` whose worker `setup` starts at first use.
    pub fn new(name: &str, setup: WorkerSetup) -> WorkerEngine {
        let engine = WorkerEngine {
            inner: Arc::new(Inner {
                name: name.to_string(),
                slots: (0..setup.processes.max(1)).map(|_| WorkerSlot::default()).collect(),
                setup,
                hello: Mutex::new(None),
                crashes: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
            }),
        };
        if engine.inner.slots.len() > 1 && !engine.inner.setup.idle_exit.is_zero() {
            start_reaper(Arc::downgrade(&engine.inner));
        }
        engine
    }

    /// The first worker's process id, if one is running (tests kill it from outside).
    /// Waits while that worker serves a request.
    pub fn worker_pid(&self) -> Option<u32> {
        self.inner.lock(0).ok()?.worker.as_ref().map(|w| w.child.id())
    }
}

/// Closes idle workers (other than the first) every so often, for as long as their engine
/// lives.
fn start_reaper(inner: std::sync::Weak<Inner>) {
    let Some(every) = inner.upgrade().map(|i| i.setup.idle_exit / 2) else { return };
    let every = every.clamp(Duration::from_millis(500), Duration::from_secs(30));
    let spawned = std::thread::Builder::new().name("xpu-worker-reaper".into()).spawn(move || {
        loop {
            std::thread::sleep(every);
            match inner.upgrade() {
                Some(inner) => inner.retire_idle(),
                None => return,
            }
        }
    });
    if let Err(e) = spawned {
        eprintln!("xpu: cannot start the worker reaper thread (idle workers stay): {e}");
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The workers close with their engine: no longer alive, but not restarts either.
        let open = self.slots.iter().filter(|s| s.conn.lock().is_ok_and(|c| c.worker.is_some()));
        let open = open.count() as u64;
        with_stats(&self.name, |s| s.alive = s.alive.saturating_sub(open));
    }
}

impl Inner {
    fn lock(&self, slot: usize) -> Result<MutexGuard<'_, Conn>, EngineError> {
        self.slots[slot]
            .conn
            .lock()
            .map_err(|_| EngineError::Other(format!("{} worker {slot}: poisoned", self.name)))
    }

    /// The slot a new executable is prepared on (see the module doc): an idle slot whose
    /// worker runs, the one with the fewest executables; else an idle slot without a worker
    /// (preparing starts one); else the slot with the fewest executables, which the caller
    /// waits for. Idle means its lock is free now; a race with another caller only costs a
    /// wait.
    fn choose_slot(&self) -> usize {
        let load = |i: usize| self.slots[i].executables.load(Ordering::Relaxed);
        let (mut running, mut empty) = (None::<usize>, None::<usize>);
        for (i, slot) in self.slots.iter().enumerate() {
            let Ok(conn) = slot.conn.try_lock() else { continue };
            if conn.worker.is_some() {
                if running.is_none_or(|best| load(i) < load(best)) {
                    running = Some(i);
                }
            } else if empty.is_none() {
                empty = Some(i);
            }
        }
        running
            .or(empty)
            .unwrap_or_else(|| (0..self.slots.len()).min_by_key(|&i| load(i)).unwrap_or(0))
    }

    /// Closes every worker but the first that has answered nothing for `idle_exit` (one
    /// busy now is skipped: its lock is taken).
    fn retire_idle(&self) {
        for slot in self.slots.iter().skip(1) {
            let Ok(mut conn) = slot.conn.try_lock() else { continue };
            let idle = conn.last_used.is_some_and(|t| t.elapsed() >= self.setup.idle_exit);
            if conn.worker.is_some() && idle {
                conn.worker = None;
                with_stats(&self.name, |s| {
                    s.alive = s.alive.saturating_sub(1);
                    s.retired += 1;
                });
            }
        }
    }

    fn hello(&self) -> Result<Arc<Hello>, EngineError> {
        if let Some(h) = self.hello.lock().ok().and_then(|h| h.clone()) {
            return Ok(h);
        }
        let mut conn = self.lock(0)?;
        self.ensure_worker(&mut conn)?;
        Ok(self.hello.lock().ok().and_then(|h| h.clone()).expect("set by ensure_worker"))
    }

    /// A running worker for a request: started if none runs; an engine that said it is
    /// unavailable here is refused with its reason.
    fn ready(&self, conn: &mut Conn) -> Result<(), EngineError> {
        self.ensure_worker(conn)?;
        if conn.worker.is_some() {
            return Ok(());
        }
        let hello = self.hello.lock().ok().and_then(|h| h.clone());
        let reason = match hello.map(|h| h.capabilities.availability.clone()) {
            Some(Availability::Unavailable { reason }) => reason,
            Some(other) => other.to_string(),
            None => "its worker is not running".to_string(),
        };
        Err(EngineError::Unavailable { engine: self.name.clone(), reason })
    }

    /// Starts the worker if none runs, after the backoff its recent crashes call for.
    fn ensure_worker(&self, conn: &mut Conn) -> Result<(), EngineError> {
        // A worker that died between jobs (killed from outside, say) costs no job: it is
        // replaced now, its death counted.
        // One that said it retires (its engine is poisoned for the process) is replaced
        // now: dropping it kills and reaps it if it has not exited yet.
        if conn.worker.as_ref().is_some_and(|w| w.retiring) {
            conn.worker = None;
            self.ended("poisoned".into());
        }
        if let Some(w) = conn.worker.as_mut()
            && let Ok(Some(status)) = w.child.try_wait()
        {
            conn.worker = None;
            self.ended(describe(status));
        }
        if conn.worker.is_some() {
            return Ok(());
        }
        if let (Some(at), n) = (conn.last_crash, conn.consecutive_crashes) {
            let backoff = (Duration::from_millis(100) * 2u32.saturating_pow(n.saturating_sub(1)))
                .min(MAX_BACKOFF);
            if let Some(wait) = backoff.checked_sub(at.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let started = Instant::now();
        let unavailable = |reason: String| EngineError::Unavailable {
            engine: self.name.clone(),
            reason: format!("its worker process cannot start: {reason}"),
        };
        let mut worker = self
            .spawn()
            .map_err(|e| unavailable(format!("{}: {e}", self.setup.program.display())))?;
        worker.reader.get_ref().set_read_timeout(Some(START_TIMEOUT)).ok();
        let hello = send(&mut worker.writer, &Request::Hello)
            .and_then(|()| receive::<Reply>(&mut worker.reader));
        worker.reader.get_ref().set_read_timeout(None).ok();
        let hello = match hello {
            Ok(Some(Reply::Hello { version, capabilities, classes })) => {
                Hello { version, capabilities, classes }
            }
            Ok(Some(Reply::Retiring { reason, .. })) => {
                return Err(unavailable(format!("its engine is poisoned at start: {reason}")));
            }
            Ok(Some(other)) => return Err(unavailable(format!("answered {other:?} to hello"))),
            Ok(None) | Err(_) => {
                drop(worker.writer.shutdown(std::net::Shutdown::Both));
                let status = ended_or_killed(&mut worker.child);
                let said = worker.stderr.last_words();
                let said = if said.is_empty() { said } else { format!(": {said}") };
                return Err(unavailable(match status {
                    Some(s) => format!("it ended ({}){said}", describe(s)),
                    None => format!("no answer{said}"),
                }));
            }
        };
        conn.generation += 1;
        // An engine that cannot run here (no GPU, no library) has said so; its worker would
        // only hold memory. It is closed, its answer kept; a later prepare (which no plan
        // makes for an unavailable engine) would start one again and get the same refusal.
        let usable = hello.capabilities.availability.is_available();
        if let Ok(mut h) = self.hello.lock() {
            *h = Some(Arc::new(hello));
        }
        with_stats(&self.name, |s| {
            s.starts += 1;
            s.alive += u64::from(usable);
            s.last_start = started.elapsed();
        });
        if usable {
            conn.worker = Some(worker);
            conn.last_used = Some(Instant::now());
        }
        Ok(())
    }

    fn spawn(&self) -> std::io::Result<Worker> {
        let region = Region::create()?;
        let (parent, child_end) = UnixStream::pair()?;
        let (control, child_control) = UnixStream::pair()?;
        let mut cmd = Command::new(&self.setup.program);
        cmd.arg("--engine").arg(&self.name).args(&self.setup.args);
        if self.setup.inject_faults {
            cmd.arg("--inject-faults");
        }
        if !self.setup.spin.is_zero() {
            cmd.arg("--spin-us").arg(self.setup.spin.as_micros().to_string());
        }
        // Its own process group: a terminal's Ctrl-C is for the parent (which stops the run
        // through the control socket), not a signal that kills the worker mid-run.
        cmd.process_group(0);
        // The worker's stdout is not the user's: engines that print go to stderr.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
            .stderr(Stdio::piped());
        let fds = [
            (region.raw_fd(), SHM_FD),
            (child_end.as_raw_fd(), SOCKET_FD),
            (child_control.as_raw_fd(), CONTROL_FD),
        ];
        // SAFETY: the closure runs in the forked child before exec and calls only fcntl,
        // dup2 and prctl, which are async-signal-safe. The descriptors are first moved above
        // the targets so that placing one cannot close another; dup2 clears close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                let mut high = [-1; 3];
                for (h, (fd, _)) in high.iter_mut().zip(fds) {
                    *h = libc::fcntl(fd, libc::F_DUPFD, 10);
                }
                let placed = high
                    .iter()
                    .zip(fds)
                    .all(|(&h, (_, target))| h >= 0 && libc::dup2(h, target) >= 0);
                if !placed
                    // Killed when the thread that forked it ends: the keeper thread, which
                    // lives as long as this process (a hung worker must not outlive it).
                    || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = spawn_on_keeper(cmd)?;
        drop((child_end, child_control));
        let stderr = StderrTail::forward(child.stderr.take());
        let pid = child.id() as libc::pid_t;
        let statm = std::fs::File::open(format!("/proc/{pid}/statm")).ok();
        Ok(Worker {
            child,
            reader: BufReader::new(parent.try_clone()?),
            stopper: Stopper::new(control, pid),
            runs: 0,
            writer: parent,
            region,
            statm,
            retiring: false,
            stderr,
        })
    }

    /// Sends `request` and waits for the reply. If `stop` fires first the worker is told to
    /// stop run number `run` (if the request is that run) and killed if it has not answered
    /// [`STOP_GRACE`] later.
    fn call(
        &self,
        conn: &mut Conn,
        request: &Request,
        run: u64,
        stop: &StopToken,
        expected: Option<Duration>,
    ) -> Result<Reply, Failure> {
        let worker = conn.worker.as_mut().expect("ensure_worker ran");
        let _stopping = worker.stopper.watch(run, stop);
        let spin = self.setup.spin;
        let answered = send(&mut worker.writer, request).and_then(|()| {
            crate::wait::spin_for_message(&worker.reader, spin, expected);
            receive::<Reply>(&mut worker.reader)
        });
        conn.last_used = Some(Instant::now());
        let answered = match answered {
            // The worker exits after this reply: it is replaced before the next request
            // (`ensure_worker`); this one's reply (and its outputs in the shared memory,
            // still mapped here) is read as usual.
            Ok(Some(Reply::Retiring { reply, reason })) => {
                eprintln!("xpu: the {} worker retires: {reason}", self.name);
                if let Some(w) = conn.worker.as_mut() {
                    w.retiring = true;
                }
                Ok(Some(*reply))
            }
            other => other,
        };
        match answered {
            Ok(Some(Reply::Failed(WireError::Stopped { node, .. }))) => {
                let reason = stop.reason().unwrap_or(StopReason::Cancelled);
                Err(Failure::Engine(EngineError::Stopped { node, reason }))
            }
            Ok(Some(Reply::Failed(e))) => Err(Failure::Engine(e.into())),
            Ok(Some(reply)) => Ok(reply),
            Ok(None) | Err(_) => {
                let mut worker = conn.worker.take().expect("still there");
                drop(worker.writer.shutdown(std::net::Shutdown::Both));
                let status = worker.child.wait();
                let cause = match (stop.reason(), status) {
                    (Some(StopReason::Cancelled), _) => "cancelled".to_string(),
                    (Some(StopReason::DeadlinePassed), _) => "timeout".to_string(),
                    (None, Ok(s)) => describe(s),
                    (None, Err(e)) => format!("lost: {e}"),
                };
                conn.consecutive_crashes += 1;
                conn.last_crash = Some(Instant::now());
                self.ended(cause.clone());
                Err(Failure::Died(cause))
            }
        }
    }

    /// Releases the executables dropped since slot `slot`'s last request that live on its
    /// current worker (best effort: a worker that dies here is noticed by the request that
    /// follows; ones prepared on a worker since replaced went with it).
    fn release_dropped(&self, slot: usize, conn: &mut Conn) {
        let dropped = match self.slots[slot].released.lock() {
            Ok(mut r) if !r.is_empty() => std::mem::take(&mut *r),
            _ => return,
        };
        for (id, generation) in dropped {
            if conn.worker.is_some() && generation == conn.generation {
                let _ = self.call(conn, &Request::Release { id }, 0, &StopToken::default(), None);
            }
        }
    }

    fn crashed(&self, key: &str, node: &str, cause: String, stop: &StopToken) -> EngineError {
        if let Some(reason) = stop.reason() {
            return EngineError::Stopped { node: node.to_string(), reason };
        }
        if let Ok(mut c) = self.crashes.lock() {
            *c.entry(key.to_string()).or_default() += 1;
        }
        with_stats(&self.name, |s| s.crashed_jobs += 1);
        EngineError::Crashed { engine: self.name.clone(), node: node.to_string(), cause }
    }

    /// A run of partition `key` succeeded: its crashes so far were not in a row (quarantine
    /// is for a partition that crashes its worker every time, not one that a worker killed
    /// from outside or a rare fault hit now and then).
    fn ran_well(&self, key: &str) {
        if let Ok(mut c) = self.crashes.lock()
            && !c.is_empty()
        {
            c.remove(key);
        }
    }

    fn check_quarantine(&self, key: &str, node: &str) -> Result<(), EngineError> {
        let crashes = self.crashes.lock().ok().and_then(|c| c.get(key).copied()).unwrap_or(0);
        if crashes >= QUARANTINE_AFTER {
            return Err(EngineError::Quarantined {
                engine: self.name.clone(),
                node: node.to_string(),
                crashes,
            });
        }
        Ok(())
    }

    /// Prepares `exe` on slot `slot`'s worker (`conn`, locked) as a new executable id;
    /// `json` is its partition's SGR-ML JSON when the caller has made it already.
    fn prepare_on_worker(
        &self,
        slot: usize,
        conn: &mut Conn,
        exe: &PartitionSource,
        json: Option<String>,
        stop: &StopToken,
    ) -> Result<u64, EngineError> {
        self.check_quarantine(&exe.key, &exe.label)?;
        self.ready(conn)?;
        self.release_dropped(slot, conn);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = Request::Prepare {
            id,
            partition: json.unwrap_or_else(|| xpu_ir::to_json(&exe.graph)),
            assignment: exe.assignment.clone(),
        };
        match self.call(conn, &request, 0, stop, None) {
            Ok(Reply::Prepared) => Ok(id),
            Ok(other) => Err(EngineError::Other(format!("worker answered {other:?} to prepare"))),
            Err(Failure::Engine(e)) => Err(e),
            Err(Failure::Died(cause)) => Err(self.crashed(&exe.key, &exe.label, cause, stop)),
        }
    }

    /// Replaces a worker whose memory is past the limit (after a run, between jobs).
    fn recycle_if_bloated(&self, conn: &mut Conn) {
        use std::os::unix::fs::FileExt;
        let limit = self.setup.max_rss_bytes;
        let Some(statm) = conn.worker.as_ref().and_then(|w| w.statm.as_ref()) else { return };
        if limit == 0 {
            return;
        }
        let mut buf = [0u8; 128];
        let n = statm.read_at(&mut buf, 0).unwrap_or(0);
        let rss = std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            // SAFETY: sysconf only reads a configuration value.
            .map(|pages| pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64);
        if rss.is_some_and(|rss| rss > limit) {
            conn.worker = None;
            self.ended("memory".into());
        }
    }

    /// Counts a worker that ended other than by this process closing it.
    fn ended(&self, cause: String) {
        with_stats(&self.name, |s| {
            *s.restarts.entry(cause).or_default() += 1;
            s.alive = s.alive.saturating_sub(1);
        });
    }
}

type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);

/// The thread every worker is forked from. `PR_SET_PDEATHSIG` fires when the forking
/// *thread* ends, so workers must not be forked from a pool thread that may retire; this one
/// never ends before the process does.
static KEEPER: LazyLock<Mutex<std::sync::mpsc::Sender<SpawnRequest>>> = LazyLock::new(|| {
    let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
    let spawned = std::thread::Builder::new().name("xpu-worker-keeper".into()).spawn(move || {
        for (mut cmd, reply) in rx {
            let _ = reply.send(cmd.spawn());
        }
        // All senders gone means the process is exiting: park so the workers die with it,
        // not before.
        loop {
            std::thread::park();
        }
    });
    if let Err(e) = spawned {
        eprintln!("xpu: cannot start the worker keeper thread: {e}");
    }
    Mutex::new(tx)
});

fn spawn_on_keeper(cmd: Command) -> std::io::Result<Child> {
    let (tx, rx) = std::sync::mpsc::channel();
    KEEPER
        .lock()
        .map_err(|_| std::io::Error::other("worker keeper poisoned"))?
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("the worker keeper thread is gone"))?;
    rx.recv().map_err(|_| std::io::Error::other("the worker keeper thread is gone"))?
}

/// The exit status of a worker that stopped answering at start: the one it exits with
/// within a moment (a loader error, a crash), else it is killed.
fn ended_or_killed(child: &mut Child) -> Option<ExitStatus> {
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break,
        }
    }
    let _ = child.kill();
    child.wait().ok()
}

/// A signal or exit status the way the metrics and errors name it.
fn describe(status: ExitStatus) -> String {
    match (status.signal(), status.code()) {
        (Some(sig), _) => signal_name(sig),
        (None, Some(code)) => format!("exit status {code}"),
        (None, None) => "ended".into(),
    }
}

fn signal_name(sig: i32) -> String {
    let known = [
        (libc::SIGSEGV, "SIGSEGV"),
        (libc::SIGABRT, "SIGABRT"),
        (libc::SIGKILL, "SIGKILL"),
        (libc::SIGBUS, "SIGBUS"),
        (libc::SIGILL, "SIGILL"),
        (libc::SIGFPE, "SIGFPE"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGPIPE, "SIGPIPE"),
    ];
    known
        .iter()
        .find(|(n, _)| *n == sig)
        .map_or_else(|| format!("signal {sig}"), |(_, name)| name.to_string())
}

/// What it takes to prepare a partition again on a new worker.
struct PartitionSource {
    /// The partition itself, not its JSON: its weights are shared with the plan's graph
    /// (a model's JSON is 4/3 its weights in base64, and xpud keeps many executables).
    graph: Graph,
    assignment: Assignment,
    /// Quarantine key: SHA-256 of the partition and its assignment.
    key: String,
    /// The partition in errors: its first nodes.
    label: String,
}

impl PartitionSource {
    /// `json` is the partition's SGR-ML JSON, which the first prepare sends.
    fn new(partition: &Graph, json: &str, assignment: &Assignment) -> PartitionSource {
        let mut h = Sha256::new();
        h.update(json.as_bytes());
        let _ = serde_json::to_writer(&mut h, assignment);
        let key = format!("{:x}", h.finalize());
        let names: Vec<String> =
            partition.node_ids().take(3).map(|id| partition.node(id).label(id)).collect();
        let more = partition.node_ids().count().saturating_sub(names.len());
        let label = if more > 0 {
            format!("partition {} (+{more} more)", names.join(", "))
        } else {
            format!("partition {}", names.join(", "))
        };
        PartitionSource { graph: partition.clone(), assignment: assignment.clone(), key, label }
    }
}

impl Engine for WorkerEngine {
    fn name(&self) -> &str {
        &self.inner.name
    }

    fn version(&self) -> String {
        self.inner.hello().map(|h| h.version.clone()).unwrap_or_default()
    }

    fn capabilities(&self) -> Capabilities {
        match self.inner.hello() {
            Ok(h) => h.capabilities.clone(),
            Err(e) => Capabilities::absent(
                &self.inner.name,
                Availability::Unavailable { reason: e.to_string() },
            ),
        }
    }

    fn classes_without_loading(&self) -> Option<Vec<OpClass>> {
        // Without starting the worker: what its engine said, else any ONNX op (as for an
        // engine that loads its library at first use).
        let known = self.inner.hello.lock().ok().and_then(|h| h.as_ref()?.classes.clone());
        Some(known.unwrap_or_else(xpu_engine::dylib::onnx_classes))
    }

    fn prepare(
        &self,
        partition: &Graph,
        assignment: &Assignment,
    ) -> Result<Box<dyn Executable>, EngineError> {
        // Made once: hashed for the quarantine key and sent; dropped after the prepare.
        let json = xpu_ir::to_json(partition);
        let source = PartitionSource::new(partition, &json, assignment);
        let slot = self.inner.choose_slot();
        let mut conn = self.inner.lock(slot)?;
        let stop = StopToken::default();
        let id = self.inner.prepare_on_worker(slot, &mut conn, &source, Some(json), &stop)?;
        self.inner.slots[slot].executables.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(RemoteExecutable {
            inner: self.inner.clone(),
            source,
            slot,
            id,
            generation: conn.generation,
            answers: Default::default(),
            facts: Vec::new(),
        }))
    }
}

/// An executable that lives in one slot's worker; re-prepared there if that worker was
/// replaced.
struct RemoteExecutable {
    inner: Arc<Inner>,
    source: PartitionSource,
    slot: usize,
    id: u64,
    generation: u64,
    /// How long its recent runs' replies took to come: when the next one is due.
    answers: crate::wait::RecentAnswers,
    /// The engine's facts in the last run's reply (a reply keeps a prefix of them).
    facts: Vec<Fact>,
}

impl Drop for RemoteExecutable {
    fn drop(&mut self) {
        // Never waits for the slot's worker: a run in flight there may take minutes, and
        // the prepared cache drops executables while others wait on it.
        let slot = &self.inner.slots[self.slot];
        slot.executables.fetch_sub(1, Ordering::Relaxed);
        if let Ok(mut released) = slot.released.lock() {
            released.push((self.id, self.generation));
        }
    }
}

impl RemoteExecutable {
    /// Its slot's connection, or — when another job holds that worker and another worker
    /// runs idle — the idle one's, the executable moving there (prepared again on it, the
    /// old one released): an executable the prepared cache hands out must not wait behind
    /// a long job on its worker while a worker is free.
    fn take_slot<'a>(&mut self, inner: &'a Inner) -> Result<MutexGuard<'a, Conn>, EngineError> {
        match inner.slots[self.slot].conn.try_lock() {
            Ok(conn) => return Ok(conn),
            Err(std::sync::TryLockError::Poisoned(_)) => return inner.lock(self.slot),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        for (i, slot) in inner.slots.iter().enumerate() {
            let Ok(conn) = slot.conn.try_lock() else { continue };
            if i == self.slot || conn.worker.is_none() {
                continue;
            }
            let old = &inner.slots[self.slot];
            old.executables.fetch_sub(1, Ordering::Relaxed);
            if let Ok(mut released) = old.released.lock() {
                released.push((self.id, self.generation));
            }
            slot.executables.fetch_add(1, Ordering::Relaxed);
            self.slot = i;
            // No worker has generation 0: the run prepares the executable on this one.
            self.generation = 0;
            return Ok(conn);
        }
        inner.lock(self.slot)
    }
}

impl Executable for RemoteExecutable {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Execution, EngineError> {
        self.run_until(inputs, &StopToken::default())
    }

    fn run_until(&mut self, inputs: &[Tensor], stop: &StopToken) -> Result<Execution, EngineError> {
        let inner = self.inner.clone();
        let mut conn = self.take_slot(&inner)?;
        stop.check(|| self.source.label.clone())?;
        inner.check_quarantine(&self.source.key, &self.source.label)?;
        inner.ready(&mut conn)?;
        if conn.generation != self.generation {
            self.id = inner.prepare_on_worker(self.slot, &mut conn, &self.source, None, stop)?;
            self.generation = conn.generation;
            self.facts.clear();
        }
        inner.release_dropped(self.slot, &mut conn);
        let slots = write_inputs(&mut conn, inputs)?;
        let worker = conn.worker.as_mut().expect("prepared on it");
        worker.runs += 1;
        let run = worker.runs;
        let request = Request::Run { id: self.id, run, inputs: slots };
        let sent = Instant::now();
        let reply = match inner.call(&mut conn, &request, run, stop, self.answers.expected()) {
            Ok(reply) => reply,
            Err(Failure::Engine(e)) => return Err(e),
            Err(Failure::Died(cause)) => {
                return Err(inner.crashed(&self.source.key, &self.source.label, cause, stop));
            }
        };
        let Reply::Ran { outputs, timings, facts_kept, facts: changed, inputs_read, served } =
            reply
        else {
            return Err(EngineError::Other(format!("worker answered {reply:?} to run")));
        };
        let answered = sent.elapsed();
        self.answers.record(answered);
        if facts_kept > self.facts.len() {
            return Err(EngineError::Other(format!(
                "worker kept {facts_kept} facts of the last run, which had {}",
                self.facts.len()
            )));
        }
        self.facts.truncate(facts_kept);
        self.facts.extend(changed);
        let mut facts = self.facts.clone();
        // What isolation cost this call: the worker's share, and the call's time less it
        // (request and reply messages, wake-ups).
        let crossing = answered.saturating_sub(served);
        for (key, took) in [
            ("worker.inputs_us", inputs_read),
            ("worker.serve_us", served),
            ("worker.crossing_us", crossing),
        ] {
            let value = format!("{:.1}", took.as_secs_f64() * 1e6);
            facts.push(Fact { node: None, key: key.into(), value });
        }
        conn.consecutive_crashes = 0;
        inner.ran_well(&self.source.key);
        let outputs = read_outputs(&mut conn, &outputs)?;
        inner.recycle_if_bloated(&mut conn);
        Ok(Execution { outputs, timings, facts })
    }
}

fn shm_error(e: std::io::Error) -> EngineError {
    EngineError::Other(format!("worker shared memory: {e}"))
}

fn write_inputs(conn: &mut Conn, inputs: &[Tensor]) -> Result<Vec<Slot>, EngineError> {
    let worker = conn.worker.as_mut().expect("prepared on it");
    if let Some(i) = inputs.iter().position(|t| matches!(t.data(), TensorData::Table(_))) {
        return Err(EngineError::Input {
            name: format!("#{i}"),
            message: "a table cannot cross to a worker process".into(),
        });
    }
    worker.region.put_all(0, inputs).map_err(shm_error)
}

fn read_outputs(conn: &mut Conn, slots: &[Slot]) -> Result<Vec<Tensor>, EngineError> {
    let worker = conn.worker.as_mut().expect("ran on it");
    slots.iter().map(|s| worker.region.get(s).map_err(EngineError::Other)).collect()
}
