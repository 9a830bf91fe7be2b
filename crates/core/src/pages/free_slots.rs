//! Free slots of the `pages` file.

/// Free slots of the `pages` file, one bit each: a list of `u32` would cost 4 bytes per free
/// slot, and a shadow-paged file keeps many (docs/BENCHMARKS.md, "Figures the design refers to").
#[derive(Debug, Default)]
pub(super) struct FreeSlots {
    words: Vec<u64>,
    pub(super) count: u64,
    /// No word below this one has a bit set.
    lowest_word: usize,
}

impl FreeSlots {
    pub(super) fn insert(&mut self, slot: u32) {
        let (word, bit) = (slot as usize / 64, slot % 64);
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        assert!(
            self.words[word] & (1 << bit) == 0,
            "slot {slot} freed twice"
        );
        self.words[word] |= 1 << bit;
        self.count += 1;
        self.lowest_word = self.lowest_word.min(word);
    }

    /// Takes `slot` out of the free slots; false if it was not free.
    pub(super) fn remove(&mut self, slot: u32) -> bool {
        let (word, bit) = (slot as usize / 64, slot % 64);
        match self.words.get_mut(word) {
            Some(bits) if *bits & (1 << bit) != 0 => {
                *bits &= !(1 << bit);
                self.count -= 1;
                true
            }
            _ => false,
        }
    }

    /// Takes the lowest free slot, so the file stays dense.
    pub(super) fn take_lowest(&mut self) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        while self.words[self.lowest_word] == 0 {
            self.lowest_word += 1;
        }
        let word = &mut self.words[self.lowest_word];
        let bit = word.trailing_zeros();
        *word &= !(1 << bit);
        self.count -= 1;
        Some((self.lowest_word * 64) as u32 + bit)
    }

    pub(super) fn memory_bytes(&self) -> usize {
        self.words.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the free-slot bitmap hands out the lowest free slot and counts what it holds.
    #[test]
    fn free_slots_lowest_first() {
        let mut free = FreeSlots::default();
        for slot in [130, 3, 64, 65] {
            free.insert(slot);
        }
        assert_eq!(free.count, 4);
        assert_eq!(free.take_lowest(), Some(3));
        assert_eq!(free.take_lowest(), Some(64));
        free.insert(1);
        assert_eq!(free.take_lowest(), Some(1));
        assert_eq!(free.take_lowest(), Some(65));
        assert_eq!(free.take_lowest(), Some(130));
        assert_eq!(free.take_lowest(), None);
        assert_eq!(free.count, 0);
    }
}
