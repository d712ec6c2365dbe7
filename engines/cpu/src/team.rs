//! The cpu engine's worker team: a fixed set of threads that spin briefly between jobs, so
//! splitting a 10 µs kernel across cores pays ~0.2 µs to start instead of the 7–20 µs a
//! futex wake costs (rayon's `join` measured 21 µs from outside its pool and 6.5 µs inside
//! it on this project's 2-vCPU machines — more than a batch-1 dense layer takes). The
//! calling thread works too, so a team of `n` threads has `n − 1` workers.
//!
//! One job runs on a team at a time. A job submitted while the team is busy (another run
//! of the same executable, or a kernel nested inside a task) runs on the calling thread
//! alone — correct, and never oversubscribing the cores. A panicking task does not take
//! the process down: the panic is carried back to the caller and resumed there, where the
//! executor turns it into an error.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it sleeps: back-to-back runs and the serial gaps
/// between a run's parallel kernels stay inside it.
const SPIN: Duration = Duration::from_micros(300);

/// Tasks per job are packed into 16 bits of the job word.
const MAX_TASKS: usize = u16::MAX as usize;

/// A job's closure, lifetime erased: valid while its job is unfinished (see `Team::run`).
type TaskFn = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// `epoch << 32 | tasks << 16 | next`: the job, its size and the next unclaimed task
    /// in one word, so a claim (one CAS) can never mix two jobs.
    job: AtomicU64,
    /// The current job's closure; written before the job word is published.
    task: Mutex<Option<SendTask>>,
    finished: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    sleepers: AtomicUsize,
    wake: (Mutex<()>, Condvar),
    stop: AtomicBool,
}

#[derive(Copy, Clone)]
struct SendTask(TaskFn);
// SAFETY: the pointee is `Sync` (the type says so) and outlives every use (see `Team::run`).
unsafe impl Send for SendTask {}

fn epoch(word: u64) -> u64 {
    word >> 32
}

fn tasks(word: u64) -> usize {
    (word >> 16 & 0xffff) as usize
}

fn next(word: u64) -> usize {
    (word & 0xffff) as usize
}

impl Shared {
    /// Claims the next task of the job published as `epoch`; `None` once it has none left.
    fn claim(&self, epoch_seen: u64) -> Option<usize> {
        let mut word = self.job.load(Ordering::Acquire);
        loop {
            if epoch(word) != epoch_seen || next(word) >= tasks(word) {
                return None;
            }
            match self.job.compare_exchange_weak(
                word,
                word + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(next(word)),
                Err(now) => word = now,
            }
        }
    }

    /// Runs claimed tasks of job `epoch_seen` until none is left.
    fn work(&self, epoch_seen: u64) {
        let mut task: Option<SendTask> = None;
        while let Some(i) = self.claim(epoch_seen) {
            // The job cannot finish while this claimed task is unfinished, so the closure
            // the caller stored before publishing is still the job's and still alive; read
            // once per job, not per task.
            let task = *task.get_or_insert_with(|| {
                self.task.lock().unwrap_or_else(|p| p.into_inner()).expect("published")
            });
            // SAFETY: `Team::run` keeps the closure alive until every claimed task has
            // counted itself in `finished`, which this one does only after the call; every
            // claim here is of the same job (`claim` checks the epoch).
            let f = unsafe { &*task.0 };
            let outer = IN_TASK.replace(true);
            let outcome = catch_unwind(AssertUnwindSafe(|| f(i)));
            IN_TASK.set(outer);
            if let Err(payload) = outcome {
                self.panic.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(payload);
            }
            self.finished.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// A fixed team of threads; see the module doc.
pub struct Team {
    shared: Arc<Shared>,
    /// Held by the one job running; `try_lock` failing means run inline.
    submit: Mutex<()>,
    workers: Vec<JoinHandle<()>>,
    threads: usize,
}

thread_local! {
    /// The team kernels on this thread split their work over (`None`: the default team).
    static CURRENT: RefCell<Option<Arc<Team>>> = const { RefCell::new(None) };
    /// Set while this thread runs a team task (always, on a worker): a kernel inside a
    /// task runs its own work inline instead of splitting it again.
    static IN_TASK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Team {
    /// A team of `threads` threads (the caller plus `threads − 1` workers).
    pub fn new(threads: usize) -> std::io::Result<Team> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            job: AtomicU64::new(0),
            task: Mutex::new(None),
            finished: AtomicUsize::new(0),
            panic: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            wake: (Mutex::new(()), Condvar::new()),
            stop: AtomicBool::new(false),
        });
        let mut workers = Vec::with_capacity(threads - 1);
        for i in 1..threads {
            let for_worker = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("xpu-cpu-{i}"))
                .spawn(move || worker(&for_worker));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    // Stop the ones already started before reporting.
                    drop(Team { shared, submit: Mutex::new(()), workers, threads: i });
                    return Err(e);
                }
            }
        }
        Ok(Team { shared, submit: Mutex::new(()), workers, threads })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Calls `f(i)` for every `i < tasks`, spread over the team; returns when all are done.
    /// A task's panic is resumed here after the others finish.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        // A lock poisoned by an earlier job's resumed panic still serialises jobs; only a
        // job in progress (`WouldBlock`) sends this one inline.
        let submitted = match self.submit.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        if self.threads == 1 || tasks <= 1 || submitted.is_none() || IN_TASK.get() {
            (0..tasks).for_each(f);
            return;
        }
        for first in (0..tasks).step_by(MAX_TASKS) {
            let count = (tasks - first).min(MAX_TASKS);
            let shifted = |i: usize| f(first + i);
            self.job(count, &shifted);
        }
    }

    fn job(&self, count: usize, f: &(dyn Fn(usize) + Sync)) {
        let shared = &*self.shared;
        // SAFETY: (lifetime erasure) the pointer is only dereferenced for claimed tasks of
        // this job, and this function returns only after all `count` of them finished.
        let erased: TaskFn = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), TaskFn>(f) };
        *shared.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(SendTask(erased));
        shared.finished.store(0, Ordering::Relaxed);
        let epoch_now = epoch(shared.job.load(Ordering::Relaxed)) + 1;
        shared.job.store(epoch_now << 32 | (count as u64) << 16, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = shared.wake.0.lock().unwrap_or_else(|p| p.into_inner());
            shared.wake.1.notify_all();
        }
        shared.work(epoch_now);
        while shared.finished.load(Ordering::Acquire) < count {
            std::hint::spin_loop();
        }
        *shared.task.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Some(payload) = shared.panic.lock().unwrap_or_else(|p| p.into_inner()).take() {
            resume_unwind(payload);
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _guard = self.shared.wake.0.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.1.notify_all();
        }
        for handle in self.workers.drain(..) {
            let _ = handle.join();
        }
    }
}

fn worker(shared: &Shared) {
    IN_TASK.set(true);
    // Epoch 0 is the team's state before any job; starting from the epoch current when
    // this thread happens to start would miss a job published while it was starting (the
    // default team is made by the first job's call, which publishes at once).
    let mut seen = 0;
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        let word = loop {
            let word = shared.job.load(Ordering::Acquire);
            if epoch(word) != seen || shared.stop.load(Ordering::Relaxed) {
                break word;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && started.elapsed() > SPIN {
                sleep(shared, seen);
            }
            std::hint::spin_loop();
        };
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        seen = epoch(word);
        shared.work(seen);
    }
}

/// Blocks until a job newer than `seen` is published (or the team stops).
fn sleep(shared: &Shared, seen: u64) {
    let (lock, condvar) = &shared.wake;
    let mut guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    shared.sleepers.fetch_add(1, Ordering::SeqCst);
    // Checked after announcing the sleep: a publisher either sees the sleeper or this
    // check sees its job (both sides use SeqCst), so no wake-up is lost.
    while epoch(shared.job.load(Ordering::SeqCst)) == seen && !shared.stop.load(Ordering::SeqCst) {
        guard = condvar.wait(guard).unwrap_or_else(|p| p.into_inner());
    }
    shared.sleepers.fetch_sub(1, Ordering::SeqCst);
}

/// The team for threads that were given none: one thread per available core.
fn default_team() -> Option<Arc<Team>> {
    static DEFAULT: OnceLock<Option<Arc<Team>>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            let threads = std::thread::available_parallelism().map(usize::from).unwrap_or(1);
            Team::new(threads).ok().map(Arc::new)
        })
        .clone()
}

fn current() -> Option<Arc<Team>> {
    CURRENT.with(|c| c.borrow().clone()).or_else(default_team)
}

/// Runs `f` with `team` as the team this thread's kernels use.
pub fn with_team<R>(team: &Arc<Team>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Arc<Team>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| *c.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(CURRENT.with(|c| c.borrow_mut().replace(team.clone())));
    f()
}

/// Threads a kernel on this thread can split its work over (1 inside a task).
pub fn threads() -> usize {
    if IN_TASK.get() {
        return 1;
    }
    current().map_or(1, |t| t.threads())
}

/// Calls `f(i)` for every `i < tasks` on the current team.
pub fn for_each(tasks: usize, f: impl Fn(usize) + Sync) {
    match current() {
        Some(team) if tasks > 1 => team.run(tasks, &f),
        _ => (0..tasks).for_each(f),
    }
}

/// Calls `f(index, chunk)` for each `chunk`-long piece of `data` (the last may be shorter),
/// the pieces spread over the current team.
pub fn for_chunks_mut<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunk = chunk.max(1);
    let (len, base) = (data.len(), SendPtr::new(data));
    for_each(len.div_ceil(chunk), |i| {
        let start = i * chunk;
        let end = (start + chunk).min(len);
        // SAFETY: chunks [start, end) of distinct tasks are disjoint and inside `data`,
        // which stays mutably borrowed (and so untouched elsewhere) until `for_each` returns.
        let piece = unsafe { std::slice::from_raw_parts_mut(base.at(start), end - start) };
        f(i, piece)
    });
}

/// Like [`for_chunks_mut`] over two slices at once: task `i` gets the `i`-th piece of each
/// (`a`'s pieces decide the task count; `b` must have a piece for each).
pub fn for_chunk_pairs_mut<A: Send, B: Send>(
    (a, chunk_a): (&mut [A], usize),
    (b, chunk_b): (&mut [B], usize),
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync,
) {
    let chunk_a = chunk_a.max(1);
    let tasks = a.len().div_ceil(chunk_a);
    assert!(b.len() >= tasks * chunk_b, "the second slice has a piece for every task");
    let (len_a, base_a, base_b) = (a.len(), SendPtr::new(a), SendPtr::new(b));
    for_each(tasks, |i| {
        let start = i * chunk_a;
        let end = (start + chunk_a).min(len_a);
        // SAFETY: as in `for_chunks_mut`, for each slice: task `i`'s pieces are disjoint
        // from every other task's and lie inside their slices (the assert above for `b`).
        let (pa, pb) = unsafe {
            (
                std::slice::from_raw_parts_mut(base_a.at(start), end - start),
                std::slice::from_raw_parts_mut(base_b.at(i * chunk_b), chunk_b),
            )
        };
        f(i, pa, pb)
    });
}

/// The base of a mutable slice whose disjoint pieces team tasks write (`for_chunks_mut`,
/// and `linalg::mm`'s blocks of C).
pub(crate) struct SendPtr<T>(*mut T);
impl<T> SendPtr<T> {
    pub(crate) fn new(data: &mut [T]) -> Self {
        SendPtr(data.as_mut_ptr())
    }

    /// The element `offset` places past the base.
    ///
    /// # Safety
    /// `offset` lies inside the slice the pointer came from.
    pub(crate) unsafe fn at(&self, offset: usize) -> *mut T {
        // SAFETY: the caller keeps `offset` inside the slice's allocation.
        unsafe { self.0.add(offset) }
    }
}
// SAFETY: only hands disjoint pieces of one `&mut [T]` (T: Send) to team threads; each user
// says why its pieces are disjoint.
unsafe impl<T: Send> Sync for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_on_any_team_size() {
        for threads in [1, 2, 3, 5] {
            let team = Arc::new(Team::new(threads).unwrap());
            for tasks in [0, 1, 2, 7, 100, MAX_TASKS + 3] {
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                with_team(&team, || {
                    for_each(tasks, |i| _ = hits[i].fetch_add(1, Ordering::Relaxed))
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "{threads} threads, {tasks} tasks"
                );
            }
        }
    }

    #[test]
    fn chunks_cover_the_slice_exactly() {
        let team = Arc::new(Team::new(3).unwrap());
        let mut data = vec![0usize; 1003];
        with_team(&team, || {
            for_chunks_mut(&mut data, 100, |i, piece| piece.iter_mut().for_each(|v| *v += i + 1))
        });
        assert!(data.iter().enumerate().all(|(j, &v)| v == j / 100 + 1));
    }

    #[test]
    fn the_first_job_of_a_new_team_is_shared() {
        // A job published while the worker is still starting must still reach it. Each
        // task holds its thread long enough (30 ms) that a worker delayed by a loaded
        // machine still claims the second before the caller is free to.
        for _ in 0..20 {
            let team = Arc::new(Team::new(2).unwrap());
            let ids = Mutex::new(std::collections::HashSet::new());
            with_team(&team, || {
                for_each(2, |_| {
                    ids.lock().unwrap().insert(std::thread::current().id());
                    std::thread::sleep(Duration::from_millis(30));
                })
            });
            assert_eq!(ids.lock().unwrap().len(), 2, "both threads took a task");
        }
    }

    #[test]
    fn chunk_pairs_line_up() {
        let team = Arc::new(Team::new(2).unwrap());
        let (mut a, mut b) = (vec![0usize; 10], vec![0usize; 8]);
        with_team(&team, || {
            for_chunk_pairs_mut((&mut a, 3), (&mut b, 2), |i, pa, pb| {
                pa.iter_mut().for_each(|v| *v = i + 1);
                pb.iter_mut().for_each(|v| *v = pa.len());
            })
        });
        assert_eq!(a, [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]);
        assert_eq!(b, [3, 3, 3, 3, 3, 3, 1, 1]);
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_team_goes_on() {
        let team = Arc::new(Team::new(2).unwrap());
        let caught = catch_unwind(AssertUnwindSafe(|| {
            with_team(&team, || for_each(8, |i| assert!(i != 5, "task five fails")))
        }));
        let message = xpu_engine::panic_message(caught.unwrap_err().as_ref());
        assert!(message.contains("task five fails"), "{message}");
        let count = AtomicUsize::new(0);
        with_team(&team, || for_each(8, |_| _ = count.fetch_add(1, Ordering::Relaxed)));
        assert_eq!(count.load(Ordering::Relaxed), 8);
    }

    #[test]
    fn a_team_keeps_both_threads_after_a_panic() {
        let team = Arc::new(Team::new(2).unwrap());
        let _ =
            catch_unwind(AssertUnwindSafe(|| with_team(&team, || for_each(2, |_| panic!("boom")))));
        let ids = Mutex::new(std::collections::HashSet::new());
        with_team(&team, || {
            for_each(2, |_| {
                ids.lock().unwrap().insert(std::thread::current().id());
                std::thread::sleep(Duration::from_millis(5));
            })
        });
        assert_eq!(ids.lock().unwrap().len(), 2, "the poisoned submit lock did not make it serial");
    }

    #[test]
    fn nested_and_concurrent_jobs_run_inline_without_deadlock() {
        let team = Arc::new(Team::new(2).unwrap());
        let count = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    with_team(&team, || {
                        for_each(4, |_| for_each(3, |_| _ = count.fetch_add(1, Ordering::Relaxed)))
                    })
                });
            }
        });
        assert_eq!(count.load(Ordering::Relaxed), 36);
    }

    #[test]
    fn sleeping_workers_wake_for_the_next_job() {
        let team = Arc::new(Team::new(2).unwrap());
        std::thread::sleep(SPIN * 10);
        let ids = Mutex::new(std::collections::HashSet::new());
        for _ in 0..50 {
            with_team(&team, || {
                for_each(2, |_| {
                    ids.lock().unwrap().insert(std::thread::current().id());
                    std::thread::sleep(Duration::from_millis(1));
                })
            });
        }
        assert_eq!(ids.lock().unwrap().len(), 2, "the worker took tasks after sleeping");
    }
}
