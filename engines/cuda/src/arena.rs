//! The memory plan of one prepared executable: every computed value of a lowered partition
//! gets an offset in one device allocation (`memory.pool = "arena"`), values whose
//! lifetimes do not overlap sharing bytes. Lifetimes are step intervals: a value lives from
//! the step that writes it first to the last step that reads it, and a partition output to
//! the end. Offsets are placed greedily, largest value first, at the lowest aligned offset
//! that overlaps no placed value alive at the same time (TensorFlow Lite's "greedy by
//! size"): the arena is never larger than the sum of the values and usually near the peak
//! of live bytes. Pure: planned and tested without a GPU.

use xpu_lower::{Program, Slot};

/// Device allocations are aligned to this (cuBLASLt and vector loads want 256 bytes).
pub const ALIGN: u64 = 256;

/// One value's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub offset: u64,
    pub bytes: u64,
    /// Steps `first..=last` during which the value must hold its bytes.
    pub first: usize,
    pub last: usize,
}

/// Where every computed value of a program lives in the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Per `Program::values` entry; `None` for a value no step touches.
    pub placements: Vec<Option<Placement>>,
    /// The arena's size.
    pub bytes: u64,
    /// The largest sum of bytes alive at one step (the lower bound any plan meets).
    pub peak_live: u64,
}

impl ArenaPlan {
    /// The plan for `program`.
    pub fn of(program: &Program) -> ArenaPlan {
        let n = program.values.len();
        let mut span: Vec<Option<(usize, usize)>> = vec![None; n];
        let mut touch = |v: usize, step: usize| {
            let s = span[v].get_or_insert((step, step));
            s.0 = s.0.min(step);
            s.1 = s.1.max(step);
        };
        for (k, step) in program.steps.iter().enumerate() {
            // The lowering writes a value before any step reads it, so its first touch is
            // the write.
            for slot in &step.buffers {
                if let Slot::Computed(v) = slot {
                    touch(*v, k);
                }
            }
        }
        let end = program.steps.len().saturating_sub(1);
        for slot in &program.outputs {
            if let Slot::Computed(v) = slot {
                let s = span[*v].get_or_insert((end, end));
                s.1 = end;
            }
        }
        let bytes_of = |v: usize| (program.values[v].bytes() as u64).max(1);
        let mut order: Vec<usize> = (0..n).filter(|&v| span[v].is_some()).collect();
        // Largest first; ties by first use then index, so the plan is deterministic.
        order.sort_by_key(|&v| (std::cmp::Reverse(bytes_of(v)), span[v].map(|s| s.0), v));
        let mut placements: Vec<Option<Placement>> = vec![None; n];
        let mut placed: Vec<Placement> = Vec::new();
        for v in order {
            let (first, last) = span[v].unwrap_or((0, 0));
            let bytes = bytes_of(v);
            let mut busy: Vec<(u64, u64)> = placed
                .iter()
                .filter(|p| p.first <= last && first <= p.last)
                .map(|p| (p.offset, p.offset + p.bytes))
                .collect();
            busy.sort_unstable();
            let mut offset = 0u64;
            for (lo, hi) in busy {
                if offset + bytes <= lo {
                    break;
                }
                offset = offset.max(hi.next_multiple_of(ALIGN));
            }
            let p = Placement { offset, bytes, first, last };
            placed.push(p);
            placements[v] = Some(p);
        }
        let size = placed.iter().map(|p| p.offset + p.bytes).max().unwrap_or(0);
        let peak_live = (0..program.steps.len().max(1))
            .map(|k| placed.iter().filter(|p| p.first <= k && k <= p.last).map(|p| p.bytes).sum())
            .max()
            .unwrap_or(0);
        ArenaPlan { placements, bytes: size.next_multiple_of(ALIGN), peak_live }
    }

    /// Whether two values alive at once share a byte (never, for a plan made by [`of`]
    /// (Self::of): the tests check it).
    pub fn overlapping(&self) -> Option<(usize, usize)> {
        let ps: Vec<(usize, Placement)> =
            self.placements.iter().enumerate().filter_map(|(v, p)| p.map(|p| (v, p))).collect();
        for (i, (a, pa)) in ps.iter().enumerate() {
            for (b, pb) in &ps[i + 1..] {
                let alive = pa.first <= pb.last && pb.first <= pa.last;
                let shared = pa.offset < pb.offset + pb.bytes && pb.offset < pa.offset + pa.bytes;
                if alive && shared {
                    return Some((*a, *b));
                }
            }
        }
        None
    }
}
