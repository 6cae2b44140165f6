//! Where an iteration's nodes live: a generational slot map whose generation is the iteration.
//!
//! A node's id is its index and the epoch it was made in, and each node records its epoch, so
//! a lookup is a bounds check against this iteration's slots and one compare: a slot written
//! since holds a newer epoch than an old id's, and a freed node's epoch is marked dead. Ending
//! the iteration (or rolling a nested scope back, [`NodeStore::rollback`]) bumps the store's
//! epoch — O(1) in the nodes, where a map with one version per slot
//! must touch every slot to bump it (with `slotmap`, clearing 10,000 nodes cost about 8 ns per
//! node, an eighth of a tiny op's whole forward and backward).
//!
//! Slots are kept across iterations and written over in place: a new node's fields are stored
//! where they live rather than built on the stack and copied in. Only the few nodes that hold
//! heap memory (an `Arc` in their op, an input list or shape too long to sit inline) are visited
//! at the reset, to let go of it.
//!
//! Freed slots are not reused within an iteration, except by a scope's rollback, which hands
//! back every slot made since its mark: nodes are a few words and backward frees only its own
//! temporaries, so an iteration's node count is bounded by what it creates, and all are
//! reclaimed at the reset. Epochs are 32 bits: an id stays stale for 2³² − 1 iterations
//! before its epoch could come round again (the arena's buffer handles make the same trade).

use std::num::{NonZeroU32, NonZeroU64};

use crate::graph::Node;

/// A node of the current iteration. Generational: after the iteration ends (or the node is
/// freed) the id no longer resolves, so it can never name another node's data.
///
/// The slot index and the iteration's epoch share one `u64` (the epoch in the high half, never
/// zero, so that an `Option<NodeId>` is as small as an id): an id is built, copied and compared
/// as one word, never assembled from two narrow stores and read back by a wide load (which the
/// CPU cannot forward; see `BufId`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(NonZeroU64);

impl std::fmt::Debug for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeId")
            .field("idx", &self.idx())
            .field("epoch", &self.epoch())
            .finish()
    }
}

/// [`Node::epoch`] of a freed node: never an iteration's.
const DEAD: u32 = 0;

impl NodeId {
    #[inline(always)]
    fn new(idx: u32, epoch: NonZeroU32) -> Self {
        // Non-zero, as the epoch is.
        Self::from_bits(u64::from(epoch.get()) << 32 | u64::from(idx))
    }

    /// The slot index.
    #[inline(always)]
    fn idx(self) -> u32 {
        self.0.get() as u32
    }

    /// The iteration the id was made in.
    #[inline(always)]
    fn epoch(self) -> u32 {
        (self.0.get() >> 32) as u32
    }

    /// The id as one integer (what the ops' register-returned cores carry).
    #[inline(always)]
    pub(crate) fn to_bits(self) -> u64 {
        self.0.get()
    }

    /// The id back from [`NodeId::to_bits`].
    #[inline(always)]
    pub(crate) fn from_bits(bits: u64) -> Self {
        // Only ever called on non-zero bits (`to_bits`'s output, or `new`'s).
        NodeId(NonZeroU64::new(bits).unwrap_or(NonZeroU64::MAX))
    }
}

/// A point to roll a [`NodeStore`] back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreMark {
    used: usize,
    heavy: usize,
}

/// The nodes of one iteration (see the module documentation).
pub(crate) struct NodeStore {
    /// `nodes[..used]` are this iteration's; the rest are slots of earlier iterations, kept to be
    /// written over (a node is built where it lies, never copied in).
    nodes: Vec<Node>,
    used: usize,
    epoch: NonZeroU32,
    live: usize,
    /// This iteration's nodes that hold heap memory (an `Arc` in their op, inputs or shape
    /// spilled out of line): the reset lets go of it, so nothing outlives the iteration.
    heavy: Vec<u32>,
}

impl NodeStore {
    pub fn new() -> Self {
        NodeStore {
            nodes: Vec::new(),
            used: 0,
            epoch: NonZeroU32::MIN,
            live: 0,
            heavy: Vec::new(),
        }
    }

    /// Adds a node written by `fill`, which must set every field of the slot it is given (a
    /// blank node or one of an earlier iteration: either way one that holds no heap memory, as
    /// [`NodeStore::clear`] lets go of all of it), and returns its id.
    #[inline(always)]
    pub fn insert_with(&mut self, fill: impl FnOnce(&mut Node)) -> NodeId {
        let idx = u32::try_from(self.used).expect("invariant: fewer than 2^32 nodes");
        if self.used == self.nodes.len() {
            self.nodes.push(Node::BLANK);
        }
        let n = &mut self.nodes[self.used];
        fill(n);
        n.epoch = self.epoch.get();
        if n.holds_heap() {
            self.heavy.push(idx);
        }
        self.used += 1;
        self.live += 1;
        NodeId::new(idx, self.epoch)
    }

    /// The node, if the id is of this iteration and the node is not freed. (Slots past `used`
    /// hold nodes of earlier iterations, which still match their own old ids; an id of this
    /// iteration never points past `used`.)
    #[inline(always)]
    pub fn get(&self, id: NodeId) -> Option<&Node> {
        match self.nodes[..self.used].get(id.idx() as usize) {
            Some(n) if n.epoch == id.epoch() => Some(n),
            _ => None,
        }
    }

    /// Starts bringing node `id`'s slot (all three cache lines it may span) into cache, for a
    /// read soon. No check: a prefetch is a hint, harmless for any address.
    #[inline(always)]
    pub fn prefetch(&self, id: NodeId) {
        let p = self.nodes.as_ptr().wrapping_add(id.idx() as usize);
        arenagrad_exec::cpu::prefetch(p);
        arenagrad_exec::cpu::prefetch(p.cast::<u8>().wrapping_add(64));
        arenagrad_exec::cpu::prefetch(p.cast::<u8>().wrapping_add(128));
    }

    /// [`NodeStore::get`], mutable.
    #[inline(always)]
    pub fn get_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        find_mut(&mut self.nodes[..self.used], id)
    }

    /// Gives a node of this iteration a new op (one that may hold heap memory).
    pub fn set_op(&mut self, id: NodeId, op: crate::ops::Op) {
        if let Some(n) = self.get_mut(id) {
            n.op = op;
            if n.holds_heap() {
                self.heavy.push(id.idx());
            }
        }
    }

    /// Whether the id resolves.
    pub fn contains_key(&self, id: NodeId) -> bool {
        self.get(id).is_some()
    }

    /// Frees a node: its id goes stale at once, its slot at the next [`NodeStore::clear`].
    /// Returns the node as it was, or `None` if the id did not resolve.
    pub fn remove(&mut self, id: NodeId) -> Option<&Node> {
        let n = find_mut(&mut self.nodes[..self.used], id)?;
        n.epoch = DEAD;
        self.live -= 1;
        Some(n)
    }

    /// Room for `more` nodes in this iteration, reserved fallibly: `false` when that would pass
    /// the 2³² nodes an iteration can number or the host cannot hold their slots. An op about to
    /// make a node per piece or per step asks first, so that a count it cannot reach is an error
    /// before any work, not an abort (or the panic at the 2³²nd node) hours into it.
    pub fn try_reserve(&mut self, more: usize) -> bool {
        match self.used.checked_add(more) {
            Some(total) if total <= u32::MAX as usize => self
                .nodes
                .try_reserve(total.saturating_sub(self.nodes.len()))
                .is_ok(),
            _ => false,
        }
    }

    /// Live nodes.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Where the store stands, to [`NodeStore::rollback`] to.
    pub fn mark(&self) -> StoreMark {
        StoreMark {
            used: self.used,
            heavy: self.heavy.len(),
        }
    }

    /// The nodes made since `mark` that are still live, oldest first.
    pub fn live_since(&self, mark: StoreMark) -> impl Iterator<Item = &Node> {
        self.nodes[mark.used.min(self.used)..self.used]
            .iter()
            .filter(|n| n.epoch != DEAD)
    }

    /// Frees every node made since `mark` (a nested scope's end): their ids go stale, their
    /// heap memory is let go, and their slots serve the next nodes, under a newer epoch so that
    /// no old id resolves to them. Nodes made before the mark keep their ids.
    pub fn rollback(&mut self, mark: StoreMark) {
        if mark.used > self.used {
            return;
        }
        let gone = self.live_since(mark).count();
        self.live -= gone;
        let start = mark.heavy.min(self.heavy.len());
        let mut keep = start;
        for k in start..self.heavy.len() {
            let idx = self.heavy[k];
            if (idx as usize) >= mark.used {
                self.nodes[idx as usize].release_heap();
            } else {
                // An older node given a heavy op during the scope: still this iteration's.
                self.heavy[keep] = idx;
                keep += 1;
            }
        }
        self.heavy.truncate(keep);
        for n in &mut self.nodes[mark.used..self.used] {
            n.epoch = DEAD;
        }
        self.used = mark.used;
        self.epoch = self.epoch.checked_add(1).unwrap_or(NonZeroU32::MIN);
    }

    /// Ends the iteration: every id made so far goes stale, and the heap memory its nodes held
    /// is dropped. O(1) in the number of nodes that held none.
    pub fn clear(&mut self) {
        for &idx in &self.heavy {
            self.nodes[idx as usize].release_heap();
        }
        self.heavy.clear();
        self.used = 0;
        self.live = 0;
        self.epoch = self.epoch.checked_add(1).unwrap_or(NonZeroU32::MIN);
    }
}

/// The live node `id` names among this iteration's `nodes` (a function of the fields, so that
/// [`NodeStore::remove`] can update its count while it holds the node).
#[inline(always)]
fn find_mut(nodes: &mut [Node], id: NodeId) -> Option<&mut Node> {
    nodes
        .get_mut(id.idx() as usize)
        .filter(|n| n.epoch == id.epoch())
}

impl std::ops::Index<NodeId> for NodeStore {
    type Output = Node;
    #[inline(always)]
    fn index(&self, id: NodeId) -> &Node {
        self.get(id).expect("invariant: the id is of a live node")
    }
}

impl std::ops::IndexMut<NodeId> for NodeStore {
    #[inline(always)]
    fn index_mut(&mut self, id: NodeId) -> &mut Node {
        self.get_mut(id)
            .expect("invariant: the id is of a live node")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_pack_index_and_epoch_in_one_word() {
        for (i, e) in [
            (0u32, 1u32),
            (5, 9),
            (u32::MAX, u32::MAX),
            (0, u32::MAX),
            (u32::MAX, 1),
        ] {
            let id = NodeId::new(i, NonZeroU32::new(e).unwrap());
            assert_eq!((id.idx(), id.epoch()), (i, e));
            assert_eq!(NodeId::from_bits(id.to_bits()), id);
            assert_eq!(
                format!("{id:?}"),
                format!("NodeId {{ idx: {i}, epoch: {e} }}")
            );
        }
        assert_eq!(std::mem::size_of::<Option<NodeId>>(), 8);
    }

    #[test]
    fn ids_go_stale_when_freed_and_when_the_iteration_ends() {
        let mut s = NodeStore::new();
        let a = s.insert_with(|n| *n = Node::BLANK);
        let b = s.insert_with(|n| *n = Node::BLANK);
        assert!(s.contains_key(a) && s.contains_key(b));
        assert_eq!(s.len(), 2);
        assert!(s.remove(a).is_some());
        assert!(s.get(a).is_none() && s.remove(a).is_none());
        assert!(s.contains_key(b));
        assert_eq!(s.len(), 1);
        s.clear();
        assert_eq!(s.len(), 0);
        // Slot 1 still holds b's node, under b's epoch, but lies past this iteration's nodes.
        assert!(s.get(b).is_none() && s.remove(b).is_none());
        // The next iteration reuses index 0 under a new epoch: the old ids name nothing.
        let c = s.insert_with(|n| *n = Node::BLANK);
        assert_eq!(c.idx(), a.idx());
        assert!(s.get(a).is_none() && s.get(b).is_none());
        let d = s.insert_with(|n| *n = Node::BLANK);
        assert_eq!(d.idx(), b.idx());
        assert!(s.get(b).is_none() && s.contains_key(d));
        assert!(s.contains_key(c));
        assert_eq!(NodeId::from_bits(c.to_bits()), c);
    }

    #[test]
    fn the_epoch_skips_the_dead_mark_when_it_wraps() {
        let mut s = NodeStore::new();
        s.epoch = NonZeroU32::MAX;
        let a = s.insert_with(|n| *n = Node::BLANK);
        s.clear();
        assert_eq!(s.epoch, NonZeroU32::MIN);
        let b = s.insert_with(|n| *n = Node::BLANK);
        assert!(s.get(a).is_none() && s.contains_key(b));
    }
}
