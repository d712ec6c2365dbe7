//! Which row elements a warp-per-row kernel keeps in registers between its lane loops.
//! A row kernel walks its row several times: a merged softmax reads the input for the max,
//! again for the sum of exponentials and again for the quotients; ONNX's one-op Softmax
//! stores the exponentials and reads them back twice. From memory, each walk after the first
//! comes back through L2 and the kernel moves several times the bytes a copy does. Where a
//! lane loop has a constant trip count small enough to hold in registers, an element one
//! loop loads or stores is kept (`c<slot>[trip]`) and a later loop that loads the same
//! element reads the register instead: lane `l` takes elements `lo + l + 32·t` in every such
//! loop, so an element is always its own lane's. Stores still go to memory; the registers
//! only replace loads. A store to a buffer by any other path (another index, a nested loop,
//! lane 0's scalar) ends what is kept of that buffer; only loads and stores directly in a
//! lane loop's body take part (a nested loop's vary with its own index).

use std::collections::{BTreeSet, HashMap};

use xpu_lir::{Affine, Expr, Kernel, ScalarType, Stmt, Var};

use crate::codegen::{lane_trips, stores_indexed_by};

/// The most trips (elements per lane) a kept row may take: 32 registers a slot, a row of
/// 1024 elements per warp. Longer rows are read again from memory.
pub const MAX_CACHED_TRIPS: i64 = 32;

/// At most this many rows kept at once (32 registers each at most): beyond it the
/// registers would spill to local memory, which is what the cache avoids.
pub const MAX_SLOTS: usize = 4;

/// What a lane loop does with a kept element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// A load whose value is also written to the slot (a later loop reads it).
    Fill(usize),
    /// A store whose value is also written to the slot.
    Forward(usize),
    /// A store whose value goes to the slot only: a later loop stores the element again
    /// and every read before that is from the slot.
    ForwardOnly(usize),
    /// A store nothing reads, overwritten by a later loop: not emitted.
    Elide,
    /// A load served by the slot.
    Read(usize),
}

/// The register slots of one warp-per-row kernel body.
#[derive(Debug, Default)]
pub struct RowCache {
    /// (lane loop ordinal, element key, is a store) → what the loop does with it.
    uses: HashMap<(usize, String, bool), Use>,
    /// Each slot's element type (as computed) and trip count, by slot number.
    pub declared: Vec<(ScalarType, i64)>,
    /// Lane loops (by ordinal) that fill or read a slot: fully unrolled, so the slot's
    /// index is a constant and the array stays in registers.
    pub touching: BTreeSet<usize>,
}

/// An element as a lane loop sees it: the buffer, the loop's range and trips, and the
/// index with the loop's variable renamed, so that the same element reached by two loops
/// (each with its own variable) gives the same key.
pub fn key(buffer: &str, index: &[Affine], var: &str, lo: &Affine, trips: i64) -> Option<String> {
    let own = Var::Loop(var.to_string());
    let mut parts = vec![buffer.to_string(), lo.to_string(), trips.to_string()];
    for a in index {
        let terms = a
            .terms()
            .iter()
            .map(|(v, c)| (if *v == own { Var::Loop("@lane".into()) } else { v.clone() }, *c))
            .collect();
        parts.push(Affine::from_terms(a.constant, terms)?.to_string());
    }
    Some(parts.join("|"))
}

/// A top-level statement of a warp body as the emitter treats it: a lane loop (its
/// variable, range and body) or anything else.
fn as_lane_loop(s: &Stmt) -> Option<(&str, &Affine, &Affine, &[Stmt])> {
    match s {
        Stmt::Let { value: Expr::Reduce { var, lo, hi, body, .. }, .. } => {
            Some((var.as_str(), lo, hi, body.as_slice()))
        }
        Stmt::For { var, lo, hi, body, .. } if stores_indexed_by(body, var) => {
            Some((var.as_str(), lo, hi, body.as_slice()))
        }
        _ => None,
    }
}

/// Where a kept element came from: (loop ordinal, is a store), and its element type.
type Source = (usize, bool, ScalarType, i64);

/// A lane loop's store of a kept element, and whether the store to memory is needed.
struct StoreRec {
    ordinal: usize,
    key: String,
    buffer: String,
    /// A later loop stored the same element again (while this one was the latest).
    overwritten: bool,
    /// Something read the buffer from memory while this store was the latest.
    read_from_memory: bool,
}

/// The walk over a warp body that finds, for each load, an earlier loop's load or store of
/// the same element still valid in registers, and the stores nothing reads from memory.
#[derive(Default)]
struct Walk {
    /// Element key → the latest loop that loaded or stored it, while still valid.
    live: HashMap<String, Source>,
    /// (reader ordinal, key) → the source it can read.
    reads: Vec<(usize, String, Source)>,
    stores: Vec<StoreRec>,
}

impl Walk {
    fn invalidate(&mut self, buffer: &str) {
        let prefix = format!("{buffer}|");
        self.live.retain(|k, _| !k.starts_with(&prefix));
    }

    /// `buffer` read from memory: the stores to it so far are needed.
    fn memory_read(&mut self, buffer: &str) {
        for s in self.stores.iter_mut().filter(|s| s.buffer == buffer && !s.overwritten) {
            s.read_from_memory = true;
        }
    }

    /// A statement the cache does not see into: what it stores ends what is kept of
    /// those buffers, what it loads reads memory.
    fn opaque(&mut self, s: &Stmt) {
        let (mut stored, mut loaded) = (Vec::new(), Vec::new());
        buffers_of(s, &mut stored, &mut loaded);
        loaded.into_iter().for_each(|b| self.memory_read(b));
        stored.into_iter().for_each(|b| self.invalidate(b));
    }

    /// One lane loop's body (ordinal `o`, `trips` per lane), statements in order.
    fn lane_loop(
        &mut self,
        k: &Kernel,
        o: usize,
        var: &str,
        lo: &Affine,
        trips: i64,
        body: &[Stmt],
    ) {
        // Elements this loop stored: a load of one after its store in the same loop reads
        // memory (this thread's own store), not an earlier loop's register.
        let mut stored_here: BTreeSet<String> = BTreeSet::new();
        for s in body {
            match s {
                Stmt::Let { value: Expr::Load { buffer, index }, .. } => {
                    let (Some(b), Some(key)) =
                        (k.buffer(buffer), key(buffer, index, var, lo, trips))
                    else {
                        self.memory_read(buffer);
                        continue;
                    };
                    match self.live.get(&key) {
                        Some(src) if src.0 != o && !stored_here.contains(&key) => {
                            self.reads.push((o, key, *src))
                        }
                        Some(_) => self.memory_read(buffer),
                        None => {
                            self.memory_read(buffer);
                            self.live.insert(key, (o, false, b.elem.compute(), trips));
                        }
                    }
                }
                Stmt::Store { buffer, index, .. } => {
                    self.invalidate(buffer);
                    let (Some(b), Some(key)) =
                        (k.buffer(buffer), key(buffer, index, var, lo, trips))
                    else {
                        continue;
                    };
                    for rec in self.stores.iter_mut().filter(|r| r.key == key && !r.overwritten) {
                        rec.overwritten = rec.ordinal != o;
                    }
                    // A second store of the element in this loop: the first store's entry
                    // went with the invalidation above, and the second is not kept either.
                    if stored_here.insert(key.clone()) {
                        self.live.insert(key.clone(), (o, true, b.elem.compute(), trips));
                        self.stores.push(StoreRec {
                            ordinal: o,
                            key,
                            buffer: buffer.clone(),
                            overwritten: false,
                            read_from_memory: false,
                        });
                    }
                }
                other => self.opaque(other),
            }
        }
    }
}

/// The buffers stored and loaded anywhere under `s`.
fn buffers_of<'s>(s: &'s Stmt, stored: &mut Vec<&'s str>, loaded: &mut Vec<&'s str>) {
    match s {
        Stmt::Store { buffer, .. } => stored.push(buffer),
        Stmt::Let { value: Expr::Load { buffer, .. }, .. } => loaded.push(buffer),
        Stmt::For { body, .. } | Stmt::Let { value: Expr::Reduce { body, .. }, .. } => {
            body.iter().for_each(|s| buffers_of(s, stored, loaded))
        }
        Stmt::Let { .. } | Stmt::Yield(_) => {}
    }
}

impl RowCache {
    /// The slots for `body` (a warp's iteration in `k`).
    pub fn plan(k: &Kernel, body: &[Stmt]) -> RowCache {
        let mut walk = Walk::default();
        let mut ordinal = 0;
        for s in body {
            let trips = as_lane_loop(s).map(|(var, lo, hi, inner)| {
                (var, lo, inner, lane_trips(lo, hi).filter(|t| *t <= MAX_CACHED_TRIPS))
            });
            match trips {
                Some((var, lo, inner, Some(trips))) => {
                    walk.lane_loop(k, ordinal, var, lo, trips, inner);
                    ordinal += 1;
                }
                Some((_, _, _, None)) | None => {
                    if trips.is_some() {
                        ordinal += 1;
                    }
                    walk.opaque(s);
                }
            }
        }
        let mut cache = RowCache::default();
        let read_sources: BTreeSet<(usize, String, bool)> =
            walk.reads.iter().map(|(_, key, (o, store, ..))| (*o, key.clone(), *store)).collect();
        // Sources in the order first read; a slot each, up to MAX_SLOTS.
        let mut slot_of: HashMap<(usize, String, bool), usize> = HashMap::new();
        for (reader, key, (o, store, ty, trips)) in std::mem::take(&mut walk.reads) {
            let source = (o, key.clone(), store);
            let slot = match slot_of.get(&source) {
                Some(&slot) => slot,
                None if cache.declared.len() < MAX_SLOTS => {
                    let slot = cache.declared.len();
                    cache.declared.push((ty, trips));
                    slot_of.insert(source.clone(), slot);
                    let fill = if store { Use::Forward(slot) } else { Use::Fill(slot) };
                    cache.uses.insert(source, fill);
                    cache.touching.insert(o);
                    slot
                }
                None => continue,
            };
            cache.uses.insert((reader, key, false), Use::Read(slot));
            cache.touching.insert(reader);
        }
        // A store overwritten by a later loop with nothing reading memory in between goes
        // only to its register (or nowhere, when nothing reads it): its readers, if any,
        // all have the slot.
        for rec in walk.stores.iter().filter(|r| r.overwritten && !r.read_from_memory) {
            let source = (rec.ordinal, rec.key.clone(), true);
            let has_readers = read_sources.contains(&source);
            match cache.uses.get(&source).copied() {
                Some(Use::Forward(slot)) => {
                    cache.uses.insert(source, Use::ForwardOnly(slot));
                }
                None if !has_readers => {
                    cache.uses.insert(source, Use::Elide);
                }
                _ => {}
            }
        }
        cache
    }

    /// What lane loop `ordinal` does with the element `key` it loads (`store` false) or
    /// stores (`store` true), if it is kept.
    pub fn use_of(&self, ordinal: usize, key: &str, store: bool) -> Option<Use> {
        self.uses.get(&(ordinal, key.to_string(), store)).copied()
    }
}
