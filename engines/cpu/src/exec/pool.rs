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

/// One place for a buffer.
#[derive(Default)]
enum Slot {
    /// A buffer ready to be taken.
    Free(Vec<f32>),
    /// Its buffer holds a live value and comes back here when the value dies.
    InUse,
    /// Empty (its buffer was released): the next buffer given back may take it.
    #[default]
    Vacant,
}

/// Free buffers and, under capture, the recorded assignment of requests to buffers.
#[derive(Default)]
pub(crate) struct Pool {
    slots: Vec<Slot>,
    free_bytes: u64,
    /// Slot taken by each request of the recorded run, in request order.
    recorded: Vec<usize>,
    /// Position in `recorded` while replaying; `None` while recording or eager.
    replay_at: Option<usize>,
    recording: bool,
    pub stats: MemoryStats,
}

fn capacity_bytes(v: &Vec<f32>) -> u64 {
    (v.capacity() * 4) as u64
}

impl Pool {
    /// Starts a run: new statistics; `capture` says whether to replay (`true`: the
    /// previous run recorded this shape's assignment) or record afresh.
    pub fn begin(&mut self, capture: Option<bool>) {
        self.stats = MemoryStats { peak_held: self.free_bytes, ..MemoryStats::default() };
        self.replay_at = (capture == Some(true)).then_some(0);
        self.recording = capture == Some(false);
        if self.recording {
            self.recorded.clear();
        }
    }

    /// Ends a run; `keep = false` drops every free buffer (`memory.pool = "none"`). Slots
    /// whose buffers left with the run's outputs become vacant.
    pub fn end(&mut self, keep: bool) {
        self.recording = false;
        self.replay_at = None;
        if !keep {
            self.clear();
        }
        for slot in &mut self.slots {
            if matches!(slot, Slot::InUse) {
                *slot = Slot::Vacant;
            }
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
        let recorded = self.replay_at.and_then(|at| self.recorded.get(at).copied());
        if let Some(at) = self.replay_at.as_mut() {
            *at += 1;
        }
        let slot = match recorded.map(|k| (k, self.slots.get(k))) {
            // A recorded slot left vacant (its buffer was released) is filled anew: taking
            // another free buffer would take one a later request was recorded with.
            Some((k, Some(Slot::Vacant))) => {
                self.slots[k] = Slot::InUse;
                return (self.allocated(), k);
            }
            Some((k, Some(Slot::Free(v)))) if v.capacity() >= n => Some(k),
            _ => {
                if self.replay_at.is_some() {
                    self.stats.replay_misses += 1;
                }
                self.best_fit(n as u64 * 4)
            }
        };
        let (v, k) = match slot {
            Some(k) => {
                let Slot::Free(v) = std::mem::replace(&mut self.slots[k], Slot::InUse) else {
                    unreachable!("best_fit and the recorded check pick free slots")
                };
                self.free_bytes -= capacity_bytes(&v);
                self.stats.reused += 1;
                (v, k)
            }
            None => {
                // Nothing free is large enough: the largest free buffer goes, replaced by the
                // new one, so the pool keeps as many buffers as the plan has however the
                // sizes change between runs (a caching pool's new shapes).
                if let Some(k) = self.free().max_by_key(|&(_, bytes)| bytes).map(|(k, _)| k) {
                    self.evict(k);
                }
                let k = match self.slots.iter().position(|s| matches!(s, Slot::Vacant)) {
                    Some(k) => k,
                    None => {
                        self.slots.push(Slot::Vacant);
                        self.slots.len() - 1
                    }
                };
                self.slots[k] = Slot::InUse;
                (self.allocated(), k)
            }
        };
        if self.recording {
            self.recorded.push(k);
        }
        self.note_held();
        (v, k)
    }

    /// A new buffer (empty: the kernel sizes it, a zeroed allocation with no fill when large).
    fn allocated(&mut self) -> Vec<f32> {
        self.stats.allocations += 1;
        Vec::new()
    }

    /// An empty buffer for a result that leaves the executable (the kernel sizes it).
    pub fn take_fresh(&mut self) -> Vec<f32> {
        self.allocated()
    }

    /// A kernel allocated `bytes` itself: release the free buffer the plan would have used.
    pub fn kernel_allocated(&mut self, bytes: u64) {
        self.stats.kernel_allocations += 1;
        if let Some(k) = self.best_fit(bytes) {
            self.evict(k);
        }
    }

    /// A dead value's elements, back into the slot they were taken from. A kernel's own
    /// buffer (no slot) is freed: its size is the kernel's, not the plan's, and keeping it
    /// would let the pool drift from the plan across runs.
    pub fn give(&mut self, data: TensorData, slot: Option<usize>) {
        let Some(k) = slot.filter(|&k| matches!(self.slots.get(k), Some(Slot::InUse))) else {
            return;
        };
        self.slots[k] = match data {
            TensorData::F32(v) => {
                self.free_bytes += capacity_bytes(&v);
                Slot::Free(v)
            }
            _ => Slot::Vacant,
        };
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

    /// The free slots with the bytes their buffers hold.
    fn free(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.slots.iter().enumerate().filter_map(|(k, s)| match s {
            Slot::Free(v) => Some((k, capacity_bytes(v))),
            _ => None,
        })
    }

    /// The smallest free buffer holding at least `need` bytes.
    fn best_fit(&self, need: u64) -> Option<usize> {
        self.free()
            .filter(|&(_, bytes)| bytes >= need)
            .min_by_key(|&(_, bytes)| bytes)
            .map(|(k, _)| k)
    }

    fn evict(&mut self, k: usize) {
        if let Slot::Free(v) = std::mem::take(&mut self.slots[k]) {
            self.free_bytes -= capacity_bytes(&v);
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
        let (a, sa) = take(&mut pool, 32);
        pool.give(TensorData::F32(a), Some(sa));
        pool.kernel_allocated(100);
        assert_eq!(pool.free_bytes(), 0);
        assert_eq!(pool.stats.kernel_allocations, 1);
        // The kernel's own buffer is freed when it dies, not pooled.
        pool.give(TensorData::F32(vec![0.0; 25]), None);
        assert_eq!(pool.free_bytes(), 0);
    }
}
