//! Building blocks shared by the cache policies: a fixed-capacity *slab* of linked nodes,
//! doubly linked *lists* threaded through node storage, an open-addressing *slot table* that
//! finds a slab node from a 64-bit hash, and the *resident table*, an open-addressing table
//! whose slots are themselves the list nodes of the cached entries.
//!
//! Everything is allocated once, at the entry limit, so a cache's memory is known exactly
//! when it is built and never grows afterwards (the memory budget is a hard limit). Nodes are
//! named by `u32` indices instead of pointers: half the size, and no unsafe code.
//!
//! **Why the resident table holds the entries.** A cached lookup over a working set larger
//! than the processor's caches is bound by memory latency. With a table of indices into a
//! slab, a hit costs two dependent misses (the slot, then the node). With the entry in the
//! slot, it costs one: the home slot and, for a short probe run, the lines right after it.
//! The price is that deletion by backward shift moves entries between slots, so the list
//! links pointing at a moved entry are rewritten by one routine,
//! [`ResidentTable::relocate`].

use crate::fingerprint::Fingerprint;

/// The "no node" index.
pub(crate) const NIL: u32 = u32::MAX;

/// Largest number of nodes in one slab or resident table (indices must stay below [`NIL`]).
pub(crate) const SLAB_NODES_MAX: usize = (NIL - 1) as usize;

/// Node storage that lists can be threaded through: each node has a previous and a next link.
pub(crate) trait Links {
    fn previous_of(&self, index: u32) -> u32;
    fn next_of(&self, index: u32) -> u32;
    fn set_previous(&mut self, index: u32, previous: u32);
    fn set_next(&mut self, index: u32, next: u32);
}

/// A node of a [`Slab`]: an item and the links of the one list it belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node<T> {
    pub(crate) item: T,
    pub(crate) previous: u32,
    pub(crate) next: u32,
}

/// Fixed-capacity storage of nodes. Released nodes are chained through `next` and reused.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    nodes: Vec<Node<T>>,
    free_head: u32,
    used: usize,
}

impl<T: Copy> Slab<T> {
    /// A slab that holds at most `capacity` nodes; all memory is reserved now.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        assert!(
            capacity <= SLAB_NODES_MAX,
            "slab capacity {capacity} too large"
        );
        Slab {
            nodes: Vec::with_capacity(capacity),
            free_head: NIL,
            used: 0,
        }
    }

    /// Bytes of memory held by `capacity` nodes of this type.
    pub(crate) const fn bytes_for(capacity: usize) -> usize {
        capacity * std::mem::size_of::<Node<T>>()
    }

    /// Bytes of memory held now.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node<T>>()
    }

    /// Nodes in use.
    pub(crate) fn len(&self) -> usize {
        self.used
    }

    /// Stores `item` in a free node (unlinked) and returns its index. The caller keeps the
    /// number of nodes within the capacity; exceeding it is a programming error.
    pub(crate) fn allocate(&mut self, item: T) -> u32 {
        let node = Node {
            item,
            previous: NIL,
            next: NIL,
        };
        self.used += 1;
        if self.free_head != NIL {
            let index = self.free_head;
            self.free_head = self.nodes[index as usize].next;
            self.nodes[index as usize] = node;
            return index;
        }
        assert!(
            self.nodes.len() < self.nodes.capacity(),
            "slab of {} nodes is full",
            self.nodes.capacity()
        );
        self.nodes.push(node);
        (self.nodes.len() - 1) as u32
    }

    /// Returns node `index` (already unlinked from its list) to the free chain.
    pub(crate) fn release(&mut self, index: u32) {
        assert!(self.used > 0);
        self.used -= 1;
        let node = &mut self.nodes[index as usize];
        node.previous = NIL;
        node.next = self.free_head;
        self.free_head = index;
    }

    /// Forgets every node, keeping the memory.
    pub(crate) fn clear(&mut self) {
        self.nodes.clear();
        self.free_head = NIL;
        self.used = 0;
    }

    #[inline]
    pub(crate) fn item(&self, index: u32) -> &T {
        &self.nodes[index as usize].item
    }

    #[inline]
    pub(crate) fn item_mut(&mut self, index: u32) -> &mut T {
        &mut self.nodes[index as usize].item
    }
}

impl<T> Links for Slab<T> {
    #[inline]
    fn previous_of(&self, index: u32) -> u32 {
        self.nodes[index as usize].previous
    }
    #[inline]
    fn next_of(&self, index: u32) -> u32 {
        self.nodes[index as usize].next
    }
    #[inline]
    fn set_previous(&mut self, index: u32, previous: u32) {
        self.nodes[index as usize].previous = previous;
    }
    #[inline]
    fn set_next(&mut self, index: u32, next: u32) {
        self.nodes[index as usize].next = next;
    }
}

/// A doubly linked list of nodes of one node storage ([`Slab`] or [`ResidentTable`]). The
/// *front* is the most recently inserted or touched node, the *back* the least recent one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct List {
    front: u32,
    back: u32,
    len: u32,
}

impl Default for List {
    fn default() -> Self {
        List {
            front: NIL,
            back: NIL,
            len: 0,
        }
    }
}

impl List {
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn back(&self) -> Option<u32> {
        (self.back != NIL).then_some(self.back)
    }

    pub(crate) fn front(&self) -> Option<u32> {
        (self.front != NIL).then_some(self.front)
    }

    /// Links the unlinked node `index` at the front.
    #[inline]
    pub(crate) fn push_front(&mut self, nodes: &mut impl Links, index: u32) {
        let old_front = self.front;
        nodes.set_previous(index, NIL);
        nodes.set_next(index, old_front);
        if old_front == NIL {
            self.back = index;
        } else {
            nodes.set_previous(old_front, index);
        }
        self.front = index;
        self.len += 1;
    }

    /// Links the unlinked node `index` right after node `after` of this list.
    pub(crate) fn insert_after(&mut self, nodes: &mut impl Links, after: u32, index: u32) {
        let following = nodes.next_of(after);
        nodes.set_previous(index, after);
        nodes.set_next(index, following);
        nodes.set_next(after, index);
        if following == NIL {
            self.back = index;
        } else {
            nodes.set_previous(following, index);
        }
        self.len += 1;
    }

    /// Unlinks node `index`, which must belong to this list.
    #[inline]
    pub(crate) fn unlink(&mut self, nodes: &mut impl Links, index: u32) {
        assert!(self.len > 0, "unlink from an empty list");
        let previous = nodes.previous_of(index);
        let next = nodes.next_of(index);
        if previous == NIL {
            debug_assert_eq!(self.front, index);
            self.front = next;
        } else {
            nodes.set_next(previous, next);
        }
        if next == NIL {
            debug_assert_eq!(self.back, index);
            self.back = previous;
        } else {
            nodes.set_previous(next, previous);
        }
        self.len -= 1;
    }

    /// Moves node `index` of this list to the front.
    #[inline]
    pub(crate) fn move_to_front(&mut self, nodes: &mut impl Links, index: u32) {
        if self.front != index {
            self.unlink(nodes, index);
            self.push_front(nodes, index);
        }
    }

    /// Nodes from front to back (for tests and checks; allocates).
    #[cfg(test)]
    pub(crate) fn indices(&self, nodes: &impl Links) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len());
        let mut cursor = self.front;
        while cursor != NIL {
            out.push(cursor);
            cursor = nodes.next_of(cursor);
        }
        out
    }
}

/// A cached entry. `state` belongs to the policy (list membership, flags, frequency group).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resident {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) value: u64,
    pub(crate) state: u32,
}

/// The lists a policy threads through a [`ResidentTable`], found from an entry's `state`, so
/// that [`ResidentTable::relocate`] can repoint a list's front or back at a moved entry.
pub(crate) trait ResidentLists {
    /// The list holding every entry whose state is `state`.
    fn list_of(&mut self, state: u32) -> &mut List;
}

/// A policy with a single list of residents (LRU).
impl ResidentLists for List {
    fn list_of(&mut self, _state: u32) -> &mut List {
        self
    }
}

/// Largest load of a [`ResidentTable`] (entries per slot): [`LOAD_NUMERATOR`] /
/// [`LOAD_DENOMINATOR`]. At 7/8 a successful lookup probes 4.5 slots on average when the
/// cache is full (Knuth's `(1 + 1/(1 - load)) / 2`) and far fewer below its limit.
pub(crate) const LOAD_NUMERATOR: usize = 7;
/// See [`LOAD_NUMERATOR`].
pub(crate) const LOAD_DENOMINATOR: usize = 8;

/// A slot of a [`ResidentTable`]: an entry, the links of its list, and whether it is used.
/// Flat rather than nesting a [`Resident`], so that it takes 56 bytes instead of 64.
#[derive(Clone, Copy, Debug)]
struct Slot {
    fingerprint: Fingerprint,
    value: u64,
    state: u32,
    previous: u32,
    next: u32,
    occupied: bool,
}

const EMPTY_SLOT: Slot = Slot {
    fingerprint: Fingerprint([0; crate::fingerprint::FINGERPRINT_BYTES]),
    value: 0,
    state: 0,
    previous: NIL,
    next: NIL,
    occupied: false,
};

const _: () = assert!(std::mem::size_of::<Slot>() == 56);

/// The resident entries of a cache: an open-addressing table (linear probing, backward-shift
/// deletion) whose slots hold the entries themselves and serve as the nodes of the policy's
/// lists (a node's index is its slot). The home slot of a fingerprint is its first eight bytes
/// scaled to the table size (fingerprints are uniform), so the table need not be a power of
/// two and its load stays close to [`LOAD_NUMERATOR`] / [`LOAD_DENOMINATOR`] when full.
///
/// Adding an entry never moves another. Deleting one may move later members of its probe run
/// back by a slot or more; [`relocate`](Self::relocate) then repoints the moved entries'
/// list neighbours (or their list's front and back). Slot indices held across a deletion are
/// therefore stale: callers look entries up again.
#[derive(Debug)]
pub(crate) struct ResidentTable {
    slots: Vec<Slot>,
    used: usize,
}

impl ResidentTable {
    /// Slots for `entries` entries: a load of at most [`LOAD_NUMERATOR`] /
    /// [`LOAD_DENOMINATOR`], and at least one slot always empty (probes stop there).
    pub(crate) const fn slots_for(entries: usize) -> usize {
        let wanted = (entries * LOAD_DENOMINATOR).div_ceil(LOAD_NUMERATOR);
        if wanted > entries {
            wanted
        } else {
            entries + 1
        }
    }

    /// Bytes of memory a table for `entries` entries holds.
    pub(crate) const fn bytes_for(entries: usize) -> usize {
        Self::slots_for(entries) * std::mem::size_of::<Slot>()
    }

    /// A table for at most `entries` entries; all memory is reserved now.
    pub(crate) fn for_entries(entries: usize) -> Self {
        let slots = Self::slots_for(entries);
        assert!(slots <= SLAB_NODES_MAX, "{entries} entries are too many");
        ResidentTable {
            slots: vec![EMPTY_SLOT; slots],
            used: 0,
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    /// Entries stored.
    pub(crate) fn len(&self) -> usize {
        self.used
    }

    /// Forgets every entry, keeping the memory.
    pub(crate) fn clear(&mut self) {
        self.slots.fill(EMPTY_SLOT);
        self.used = 0;
    }

    /// The home slot of `fingerprint`: its first eight bytes scaled to the slot count.
    #[inline]
    fn home(&self, fingerprint: &Fingerprint) -> usize {
        ((fingerprint.prefix_u64() as u128 * self.slots.len() as u128) >> 64) as usize
    }

    /// The slot after `position`, wrapping at the end of the table.
    #[inline]
    fn after(&self, position: usize) -> usize {
        if position + 1 == self.slots.len() {
            0
        } else {
            position + 1
        }
    }

    /// The slot holding `fingerprint`, if stored.
    #[inline]
    pub(crate) fn find(&self, fingerprint: &Fingerprint) -> Option<u32> {
        let mut position = self.home(fingerprint);
        loop {
            let slot = &self.slots[position];
            if !slot.occupied {
                return None;
            }
            if slot.fingerprint == *fingerprint {
                return Some(position as u32);
            }
            position = self.after(position);
        }
    }

    /// Adds an absent entry (unlinked) and returns its slot. The caller has checked that the
    /// fingerprint is absent and keeps the entries within the table's sizing.
    pub(crate) fn add(&mut self, fingerprint: &Fingerprint, value: u64, state: u32) -> u32 {
        assert!(
            self.used + 1 < self.slots.len(),
            "resident table of {} slots is full",
            self.slots.len()
        );
        let mut position = self.home(fingerprint);
        while self.slots[position].occupied {
            debug_assert!(self.slots[position].fingerprint != *fingerprint);
            position = self.after(position);
        }
        self.slots[position] = Slot {
            fingerprint: *fingerprint,
            value,
            state,
            previous: NIL,
            next: NIL,
            occupied: true,
        };
        self.used += 1;
        position as u32
    }

    /// Deletes the entry in slot `index`, already unlinked from its list, and returns it.
    /// Later members of its probe run move back to keep every lookup's probe unbroken;
    /// `lists` gives the list of each moved entry (see [`relocate`](Self::relocate)).
    pub(crate) fn delete(&mut self, index: u32, lists: &mut impl ResidentLists) -> Resident {
        let deleted = self.slots[index as usize];
        assert!(deleted.occupied, "deleting an empty slot");
        let entry = Resident {
            fingerprint: deleted.fingerprint,
            value: deleted.value,
            state: deleted.state,
        };
        self.slots[index as usize].occupied = false;
        let count = self.slots.len();
        // Backward shift: a later member of the run moves into the hole when the hole lies
        // between its home slot and its current slot (cyclically), so no probe stops early.
        let mut hole = index as usize;
        let mut cursor = hole;
        loop {
            cursor = self.after(cursor);
            if !self.slots[cursor].occupied {
                break;
            }
            let home = self.home(&self.slots[cursor].fingerprint);
            let distance_from_home = (cursor + count - home) % count;
            let distance_from_hole = (cursor + count - hole) % count;
            if distance_from_home >= distance_from_hole {
                self.relocate(cursor, hole, lists);
                hole = cursor;
            }
        }
        self.slots[hole] = EMPTY_SLOT;
        self.used -= 1;
        entry
    }

    /// Moves the entry of slot `from` into the empty slot `to` and repoints whatever links to
    /// it: its list neighbours, or its list's front and back when it has none on that side.
    /// The only place entries move, so the only place links are fixed up.
    fn relocate(&mut self, from: usize, to: usize, lists: &mut impl ResidentLists) {
        let moved = self.slots[from];
        assert!(moved.occupied && !self.slots[to].occupied);
        self.slots[to] = moved;
        self.slots[from].occupied = false;
        let (from_index, to_index) = (from as u32, to as u32);
        if moved.previous == NIL {
            let list = lists.list_of(moved.state);
            assert_eq!(list.front, from_index, "a node without previous is its front");
            list.front = to_index;
        } else {
            self.slots[moved.previous as usize].next = to_index;
        }
        if moved.next == NIL {
            let list = lists.list_of(moved.state);
            assert_eq!(list.back, from_index, "a node without next is its back");
            list.back = to_index;
        } else {
            self.slots[moved.next as usize].previous = to_index;
        }
    }

    #[cfg(test)]
    pub(crate) fn fingerprint(&self, index: u32) -> &Fingerprint {
        &self.slots[index as usize].fingerprint
    }

    #[inline]
    pub(crate) fn value(&self, index: u32) -> u64 {
        self.slots[index as usize].value
    }

    #[inline]
    pub(crate) fn set_value(&mut self, index: u32, value: u64) {
        self.slots[index as usize].value = value;
    }

    #[inline]
    pub(crate) fn state(&self, index: u32) -> u32 {
        self.slots[index as usize].state
    }

    #[inline]
    pub(crate) fn set_state(&mut self, index: u32, state: u32) {
        self.slots[index as usize].state = state;
    }
}

impl Links for ResidentTable {
    #[inline]
    fn previous_of(&self, index: u32) -> u32 {
        self.slots[index as usize].previous
    }
    #[inline]
    fn next_of(&self, index: u32) -> u32 {
        self.slots[index as usize].next
    }
    #[inline]
    fn set_previous(&mut self, index: u32, previous: u32) {
        self.slots[index as usize].previous = previous;
    }
    #[inline]
    fn set_next(&mut self, index: u32, next: u32) {
        self.slots[index as usize].next = next;
    }
}

/// An open-addressing hash table (linear probing, backward-shift deletion) from a 64-bit hash
/// to a node index. Each slot is one `u64`: the high 32 bits of the hash (the *tag*) and the
/// node index plus one (zero marks an empty slot). The home slot is derived from the tag, so
/// deletion can move entries without reading their keys; the tag also filters out almost
/// every probe before the caller compares full keys.
#[derive(Debug)]
pub(crate) struct SlotTable {
    slots: Vec<u64>,
    mask: u64,
}

impl SlotTable {
    /// Slots for `entries` entries: a power of two keeping the load at or below 3/4, so that
    /// probe sequences stay short.
    pub(crate) const fn slots_for(entries: usize) -> usize {
        let wanted = entries + entries.div_ceil(3);
        let slots = wanted.next_power_of_two();
        if slots < 8 {
            8
        } else {
            slots
        }
    }

    /// Bytes of memory a table for `entries` entries holds.
    pub(crate) const fn bytes_for(entries: usize) -> usize {
        Self::slots_for(entries) * std::mem::size_of::<u64>()
    }

    pub(crate) fn for_entries(entries: usize) -> Self {
        let slots = Self::slots_for(entries);
        assert!(
            slots as u64 <= 1 << 32,
            "a slot table addresses at most 2^32 slots"
        );
        SlotTable {
            slots: vec![0; slots],
            mask: slots as u64 - 1,
        }
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<u64>()
    }

    pub(crate) fn clear(&mut self) {
        self.slots.fill(0);
    }

    #[inline]
    fn tag(hash: u64) -> u64 {
        hash >> 32
    }

    /// The node index whose tag matches `hash` and for which `is_key(index)` holds.
    #[inline]
    pub(crate) fn find(&self, hash: u64, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = Self::tag(hash);
        let mut position = tag & self.mask;
        loop {
            let slot = self.slots[position as usize];
            if slot == 0 {
                return None;
            }
            if slot >> 32 == tag {
                let index = (slot as u32) - 1;
                if is_key(index) {
                    return Some(index);
                }
            }
            position = (position + 1) & self.mask;
        }
    }

    /// Adds node `index` under `hash`. The caller has checked that its key is absent and
    /// keeps the number of entries within the table's sizing.
    #[inline]
    pub(crate) fn insert(&mut self, hash: u64, index: u32) {
        assert!(index < NIL - 1);
        let tag = Self::tag(hash);
        let mut position = tag & self.mask;
        while self.slots[position as usize] != 0 {
            position = (position + 1) & self.mask;
        }
        self.slots[position as usize] = (tag << 32) | (index as u64 + 1);
    }

    /// Removes node `index`, stored under `hash`; it must be present.
    pub(crate) fn remove(&mut self, hash: u64, index: u32) {
        let wanted = (Self::tag(hash) << 32) | (index as u64 + 1);
        let mut hole = Self::tag(hash) & self.mask;
        while self.slots[hole as usize] != wanted {
            assert!(self.slots[hole as usize] != 0, "removing an absent node");
            hole = (hole + 1) & self.mask;
        }
        // Backward shift: pull later members of the probe run into the hole when the hole lies
        // between their home slot and their current slot, so no lookup ever stops early.
        let mut cursor = hole;
        loop {
            cursor = (cursor + 1) & self.mask;
            let slot = self.slots[cursor as usize];
            if slot == 0 {
                break;
            }
            let home = (slot >> 32) & self.mask;
            let distance_from_home = cursor.wrapping_sub(home) & self.mask;
            let distance_from_hole = cursor.wrapping_sub(hole) & self.mask;
            if distance_from_home >= distance_from_hole {
                self.slots[hole as usize] = slot;
                hole = cursor;
            }
        }
        self.slots[hole as usize] = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Goal: the slot table agrees with a HashMap under random inserts and removes, including
    /// colliding home slots. Method: keys with few distinct home slots, checked after each step.
    #[test]
    fn slot_table_matches_a_map() {
        let mut table = SlotTable::for_entries(48);
        let mut model: HashMap<u64, u32> = HashMap::new();
        let mut state = 7u64;
        for step in 0..20_000u32 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // Only 16 distinct tags' worth of home slots: long probe runs and wrap-around.
            let hash = ((state >> 60) << 32) | (state >> 40 & 0xff);
            match model.get(&hash) {
                Some(&index) if step % 3 != 0 => {
                    table.remove(hash, index);
                    model.remove(&hash);
                }
                Some(_) => {}
                None if model.len() < 48 => {
                    table.insert(hash, step);
                    model.insert(hash, step);
                }
                None => {}
            }
            for (&key, &index) in &model {
                assert_eq!(table.find(key, |candidate| candidate == index), Some(index));
            }
        }
    }

    /// Goal: lists keep front-to-back order through pushes, moves and unlinks.
    #[test]
    fn lists_keep_order() {
        let mut slab: Slab<u8> = Slab::with_capacity(8);
        let mut list = List::default();
        let nodes: Vec<u32> = (0..5).map(|item| slab.allocate(item)).collect();
        for &node in &nodes {
            list.push_front(&mut slab, node);
        }
        assert_eq!(list.indices(&slab), vec![4, 3, 2, 1, 0]);
        list.move_to_front(&mut slab, 1);
        list.unlink(&mut slab, 3);
        slab.release(3);
        let reused = slab_reuse(&mut slab);
        list.insert_after(&mut slab, 0, reused);
        assert_eq!(list.indices(&slab), vec![1, 4, 2, 0, 3]);
        assert_eq!(
            (list.front(), list.back(), list.len()),
            (Some(1), Some(3), 5)
        );
    }

    fn slab_reuse(slab: &mut Slab<u8>) -> u32 {
        let index = slab.allocate(9);
        assert_eq!(index, 3, "released nodes are reused first");
        index
    }
}
