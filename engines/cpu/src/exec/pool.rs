//! The buffers of one prepared executable and the accounting of its memory.
//!
//! A dead value's elements go back to the pool (`memory.reuse`) and kernels that write into
//! a given buffer take the best-fitting free one — the memory plan's rule, executed. With
//! `memory.pool = "arena"` or `"caching"` the pool outlives a run, so a repeated run finds its
//! buffers ready; `execution.capture = "graph"` also records which buffer each request took
//! and replays that assignment while the input shapes stay the same.
//!
//! A kernel that allocates its own output (the ops without a buffer-taking variant) is
//! counted, and the best-fitting free buffer is released in its place: the pool then holds
//! what the memory plan counts, whichever kernels ran.

use xpu_ir::TensorData;

/// Memory figures of one run, in bytes and counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct MemoryStats {
    /// Bytes of computed values alive now (shared storage counted once; inputs and
    /// constants aside).
    pub live: u64,
    pub peak_live: u64,
    /// Largest `live` + free pooled bytes: what the executable held at once.
    pub peak_held: u64,
    /// Buffers the pool had to allocate.
    pub allocations: u64,
    /// Requests served by a free buffer.
    pub reused: u64,
    /// Values written over a dying operand.
    pub in_place: u64,
    /// Outputs kernels allocated themselves (ops with no buffer-taking variant).
    pub kernel_allocations: u64,
    /// Replayed requests whose recorded buffer was not free or too small.
    pub replay_misses: u64,
}

/// Free buffers and, under capture, the recorded assignment of requests to buffers.
#[derive(Default)]
pub(crate) struct Pool {
    /// Slots: a buffer that is free now, or `None` while its elements are in use.
    slots: Vec<Option<TensorData>>,
    free_bytes: u64,
    /// Slot taken by each request of the recorded run, in request order.
    recorded: Vec<usize>,
    /// Position in `recorded` while replaying; `None` while recording or eager.
    replay_at: Option<usize>,
    recording: bool,
    pub stats: MemoryStats,
}

fn bytes_of(d: &TensorData) -> u64 {
    let cap = match d {
        TensorData::F32(v) => v.capacity() * 4,
        TensorData::F64(v) => v.capacity() * 8,
        other => other.len() * other.dtype().size_bytes(),
    };
    cap as u64
}

impl Pool {
    /// Starts a run: new statistics; `capture` says whether to replay (`true`: the
    /// previous run recorded this shape's assignment) or record afresh.
    pub fn begin(&mut self, capture: Option<bool>) {
        self.stats = MemoryStats { peak_held: self.free_bytes, ..MemoryStats::default() };
        match capture {
            Some(true) => self.replay_at = Some(0),
            Some(false) => {
                self.recorded.clear();
                self.replay_at = None;
                self.recording = true;
            }
            None => {
                self.replay_at = None;
                self.recording = false;
            }
        }
    }

    /// Ends a run; `keep = false` drops every free buffer (`memory.pool = "none"`).
    pub fn end(&mut self, keep: bool) {
        self.recording = false;
        self.replay_at = None;
        if !keep {
            self.clear();
        }
    }

    /// Drops every buffer (and the recorded assignment).
    pub fn clear(&mut self) {
        self.slots.clear();
        self.recorded.clear();
        self.free_bytes = 0;
    }

    #[cfg(test)]
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// An f32 buffer for `n` elements (its contents are stale: the caller overwrites them)
    /// and its slot, to give it back to.
    pub fn take_f32(&mut self, n: usize) -> (Vec<f32>, usize) {
        let need = n as u64 * 4;
        let recorded = self.replay_at.and_then(|at| self.recorded.get(at).copied());
        if let Some(at) = self.replay_at.as_mut() {
            *at += 1;
        }
        let fits = |d: &TensorData| matches!(d, TensorData::F32(v) if v.capacity() >= n);
        // A recorded buffer that left with the caller (a graph output) is made anew in its
        // slot: taking another free buffer would take one a later request was recorded with.
        if let Some(k) = recorded
            && self.slots.get(k).is_some_and(Option::is_none)
        {
            self.stats.allocations += 1;
            self.note_held();
            return (Vec::new(), k);
        }
        let slot = match recorded {
            Some(k) if self.slots.get(k).and_then(Option::as_ref).is_some_and(fits) => Some(k),
            _ => {
                if self.replay_at.is_some() {
                    self.stats.replay_misses += 1;
                }
                self.best_fit(need, fits)
            }
        };
        let taken = match slot {
            Some(k) => {
                let data = self.slots[k].take().expect("a free slot");
                self.free_bytes -= bytes_of(&data);
                self.stats.reused += 1;
                if self.recording {
                    self.recorded.push(k);
                }
                match data {
                    TensorData::F32(v) => (v, k),
                    _ => unreachable!("fits() matched F32"),
                }
            }
            None => {
                // A free buffer of another type but large enough is released, so the pool
                // grows only where the memory plan would.
                if let Some(k) = self.best_fit(need, |_| true) {
                    self.evict(k);
                }
                self.stats.allocations += 1;
                let k = self.slots.len();
                if self.recording {
                    self.recorded.push(k);
                }
                self.slots.push(None);
                // Empty: the kernel sizes it (a zeroed allocation, no fill, when large).
                (Vec::new(), k)
            }
        };
        self.note_held();
        taken
    }

    /// A kernel allocated `bytes` itself: release the free buffer the plan would have used.
    pub fn kernel_allocated(&mut self, bytes: u64) {
        self.stats.kernel_allocations += 1;
        if let Some(k) = self.best_fit(bytes, |_| true) {
            self.evict(k);
        }
    }

    /// A dead value's elements, for reuse: back into the slot they were taken from, if any.
    pub fn give(&mut self, data: TensorData, slot: Option<usize>) {
        if !matches!(data, TensorData::F32(_)) {
            return; // Only f32 buffers are taken again; others are freed.
        }
        self.free_bytes += bytes_of(&data);
        let k = slot
            .filter(|&k| self.slots.get(k).is_some_and(Option::is_none))
            .or_else(|| self.slots.iter().position(Option::is_none));
        match k {
            Some(k) => self.slots[k] = Some(data),
            None => self.slots.push(Some(data)),
        }
    }

    /// Live bytes changed by `delta` (a value computed or released).
    pub fn live_add(&mut self, bytes: u64) {
        self.stats.live += bytes;
        self.stats.peak_live = self.stats.peak_live.max(self.stats.live);
        self.note_held();
    }

    pub fn live_sub(&mut self, bytes: u64) {
        self.stats.live = self.stats.live.saturating_sub(bytes);
    }

    fn note_held(&mut self) {
        self.stats.peak_held = self.stats.peak_held.max(self.stats.live + self.free_bytes);
    }

    fn best_fit(&self, need: u64, ok: impl Fn(&TensorData) -> bool) -> Option<usize> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(k, s)| s.as_ref().map(|d| (k, d)))
            .filter(|(_, d)| bytes_of(d) >= need && ok(d))
            .min_by_key(|(_, d)| bytes_of(d))
            .map(|(k, _)| k)
    }

    fn evict(&mut self, k: usize) {
        if let Some(d) = self.slots[k].take() {
            self.free_bytes -= bytes_of(&d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as a kernel makes it: the buffer sized to what it writes.
    fn take(pool: &mut Pool, n: usize) -> (Vec<f32>, usize) {
        let (mut v, slot) = pool.take_f32(n);
        crate::util::resize_for_overwrite(&mut v, n);
        (v, slot)
    }

    #[test]
    fn a_freed_buffer_is_taken_again_and_the_best_fit_wins() {
        let mut pool = Pool::default();
        pool.begin(None);
        let (a, sa) = take(&mut pool, 100);
        let (b, sb) = take(&mut pool, 10);
        assert_eq!(pool.stats.allocations, 2);
        pool.give(TensorData::F32(a), Some(sa));
        pool.give(TensorData::F32(b), Some(sb));
        let (c, _) = take(&mut pool, 8);
        assert!(c.capacity() >= 8 && c.capacity() < 100, "best fit, not the largest");
        assert_eq!((pool.stats.allocations, pool.stats.reused), (2, 1));
        assert_eq!(pool.free_bytes(), 400);
    }

    #[test]
    fn a_recorded_run_replays_its_assignment_without_allocating() {
        let mut pool = Pool::default();
        pool.begin(Some(false));
        let (a, sa) = take(&mut pool, 64);
        let (b, sb) = take(&mut pool, 64);
        pool.give(TensorData::F32(b), Some(sb));
        pool.give(TensorData::F32(a), Some(sa));
        pool.end(true);
        pool.begin(Some(true));
        let (a, sa) = take(&mut pool, 64);
        let (b, sb) = take(&mut pool, 64);
        assert_eq!(pool.stats.allocations, 0);
        assert_eq!(pool.stats.replay_misses, 0);
        assert_eq!(pool.stats.reused, 2);
        pool.give(TensorData::F32(a), Some(sa));
        pool.give(TensorData::F32(b), Some(sb));
        pool.end(false);
        assert_eq!(pool.free_bytes(), 0, "memory.pool = none drops the buffers");
    }

    #[test]
    fn a_kernel_allocation_releases_the_buffer_it_replaces() {
        let mut pool = Pool::default();
        pool.begin(None);
        pool.give(TensorData::F32(vec![0.0; 32]), None);
        pool.kernel_allocated(100);
        assert_eq!(pool.free_bytes(), 0);
        assert_eq!(pool.stats.kernel_allocations, 1);
    }
}
