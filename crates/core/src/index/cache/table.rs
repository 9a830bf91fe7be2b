//! Building blocks shared by the cache policies: a fixed-capacity *slab* of linked nodes,
//! doubly linked *lists* threaded through a slab, and an open-addressing *slot table* that
//! finds a node from a 64-bit hash.
//!
//! Everything is allocated once, at the entry limit, so a cache's memory is known exactly
//! when it is built and never grows afterwards (the memory budget is a hard limit). Nodes are
//! named by `u32` indices instead of pointers: half the size, and no unsafe code.

/// The "no node" index.
pub(crate) const NIL: u32 = u32::MAX;

/// Largest number of nodes in one slab (indices must stay below [`NIL`]).
pub(crate) const SLAB_NODES_MAX: usize = (NIL - 1) as usize;

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

    /// The node after `index` in its list ([`NIL`] at the back).
    #[inline]
    pub(crate) fn next_of(&self, index: u32) -> u32 {
        self.nodes[index as usize].next
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

/// A doubly linked list of nodes of one [`Slab`]. The *front* is the most recently inserted or
/// touched node, the *back* the least recent one.
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
    pub(crate) fn push_front<T: Copy>(&mut self, slab: &mut Slab<T>, index: u32) {
        let old_front = self.front;
        {
            let node = &mut slab.nodes[index as usize];
            node.previous = NIL;
            node.next = old_front;
        }
        if old_front == NIL {
            self.back = index;
        } else {
            slab.nodes[old_front as usize].previous = index;
        }
        self.front = index;
        self.len += 1;
    }

    /// Links the unlinked node `index` right after node `after` of this list.
    pub(crate) fn insert_after<T: Copy>(&mut self, slab: &mut Slab<T>, after: u32, index: u32) {
        let following = slab.nodes[after as usize].next;
        {
            let node = &mut slab.nodes[index as usize];
            node.previous = after;
            node.next = following;
        }
        slab.nodes[after as usize].next = index;
        if following == NIL {
            self.back = index;
        } else {
            slab.nodes[following as usize].previous = index;
        }
        self.len += 1;
    }

    /// Unlinks node `index`, which must belong to this list.
    #[inline]
    pub(crate) fn unlink<T: Copy>(&mut self, slab: &mut Slab<T>, index: u32) {
        assert!(self.len > 0, "unlink from an empty list");
        let Node { previous, next, .. } = slab.nodes[index as usize];
        if previous == NIL {
            debug_assert_eq!(self.front, index);
            self.front = next;
        } else {
            slab.nodes[previous as usize].next = next;
        }
        if next == NIL {
            debug_assert_eq!(self.back, index);
            self.back = previous;
        } else {
            slab.nodes[next as usize].previous = previous;
        }
        self.len -= 1;
    }

    /// Moves node `index` of this list to the front.
    #[inline]
    pub(crate) fn move_to_front<T: Copy>(&mut self, slab: &mut Slab<T>, index: u32) {
        if self.front != index {
            self.unlink(slab, index);
            self.push_front(slab, index);
        }
    }

    /// Nodes from front to back (allocates).
    pub(crate) fn indices<T: Copy>(&self, slab: &Slab<T>) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len());
        let mut cursor = self.front;
        while cursor != NIL {
            out.push(cursor);
            cursor = slab.nodes[cursor as usize].next;
        }
        out
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

    /// Starts loading the home slot of `hash` into the processor's caches
    /// ([`warm`](crate::index::warm)).
    #[inline]
    pub(crate) fn warm(&self, hash: u64) {
        crate::index::warm::warm(&self.slots[(Self::tag(hash) & self.mask) as usize]);
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
