//! One record of the KV cache's block arena, in 16 bytes: a fork of a KV cache copies every
//! record, so it is packed. A record is an *identified* block (one whose id a block table or
//! the key map holds: shareable content, prefix hits), either *held* (its refcount) or *free*
//! (its free-list links), or a *run node*: a free-list entry standing for a run of anonymous
//! private blocks (see `super::free_list`). Held and free never coexist, so the refcount and the
//! previous link share a word, and the keying and the free flag ride in the top bits of the
//! next link.

/// No block (an end of the free list).
pub(super) const NIL: u32 = u32::MAX;

/// Bits of `tag`: the keying (2 bits), the free flag, then the next free block.
const KEYING_SHIFT: u32 = 30;
const FREE_BIT: u32 = 1 << 29;
const LINK_MASK: u32 = FREE_BIT - 1;

/// Most blocks a cache can hold: ids must fit the link bits (one value is the end mark).
pub const MAX_BLOCKS: u32 = LINK_MASK;

/// Whether a record holds a content key, or stands for a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Keying {
    /// Not full yet, prefix caching off, or a duplicate of content cached elsewhere.
    Unkeyed = 0,
    /// Keyed and in the lookup map.
    Mapped = 1,
    /// Not a block: a free-list node for a run of anonymous blocks, whose `key` is the run's
    /// slot in [`super::KvCache`]'s run table.
    Run = 2,
}

/// One arena record: an identified GPU block or a run node.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    /// Content key, meaningful when `Mapped`; a run node's slot when `Run`.
    pub(super) key: u64,
    /// Held: the requests holding it. Free: the previous node on the free list.
    count_or_prev: u32,
    /// Keying (top 2 bits), free flag, next node on the free list (free records only).
    tag: u32,
}

impl Block {
    /// An unkeyed block held by `count` requests (0: just materialized, off the list).
    pub(super) const fn held(count: u32) -> Self {
        Self {
            key: 0,
            count_or_prev: count,
            tag: LINK_MASK,
        }
    }

    /// A run node for run slot `slot`, not linked yet (the caller links it).
    #[inline]
    pub(super) const fn run_node(slot: u32) -> Self {
        Self {
            key: slot as u64,
            count_or_prev: NIL,
            tag: LINK_MASK | FREE_BIT | ((Keying::Run as u32) << KEYING_SHIFT),
        }
    }

    /// The content key, if the block has one.
    pub(super) fn key(&self) -> Option<u64> {
        match self.keying() {
            Keying::Mapped => Some(self.key),
            Keying::Unkeyed | Keying::Run => None,
        }
    }

    /// How the record is keyed.
    #[inline]
    pub(super) fn keying(&self) -> Keying {
        match self.tag >> KEYING_SHIFT {
            0 => Keying::Unkeyed,
            1 => Keying::Mapped,
            _ => Keying::Run,
        }
    }

    /// True if the block is keyed (`Mapped`; one shift, for the hot paths).
    #[inline]
    pub(super) fn is_keyed(&self) -> bool {
        self.tag >> KEYING_SHIFT == Keying::Mapped as u32
    }

    /// True if the record is a run node.
    #[inline]
    pub(super) fn is_run(&self) -> bool {
        self.tag >> KEYING_SHIFT == Keying::Run as u32
    }

    /// The run slot of a run node.
    #[inline]
    pub(super) fn run_slot(&self) -> usize {
        debug_assert!(self.is_run(), "only run nodes have a run slot");
        self.key as usize
    }

    /// Sets how the block is keyed.
    #[inline]
    pub(super) fn set_keying(&mut self, keying: Keying) {
        self.tag = (self.tag & !(3 << KEYING_SHIFT)) | ((keying as u32) << KEYING_SHIFT);
    }

    /// True if the block is on the free list.
    #[inline]
    pub(super) fn is_free(&self) -> bool {
        self.tag & FREE_BIT != 0
    }

    /// Requests holding the block (0 when free).
    #[inline]
    pub(super) fn ref_cnt(&self) -> u32 {
        if self.is_free() {
            0
        } else {
            self.count_or_prev
        }
    }

    /// Holds the block by `count` requests, off the free list, keeping its key.
    #[inline]
    pub(super) fn set_held(&mut self, count: u32) {
        self.count_or_prev = count;
        self.tag = (self.tag & (3 << KEYING_SHIFT)) | LINK_MASK;
    }

    /// One more holder of a held block.
    #[inline]
    pub(super) fn add_holder(&mut self) {
        debug_assert!(
            !self.is_free(),
            "a free block gains a holder through set_held"
        );
        self.count_or_prev += 1;
    }

    /// One holder fewer; true if none is left (the caller puts it on the free list).
    #[inline]
    pub(super) fn drop_holder(&mut self) -> bool {
        debug_assert!(
            !self.is_free() && self.count_or_prev > 0,
            "double free of a block"
        );
        self.count_or_prev -= 1;
        self.count_or_prev == 0
    }

    /// The previous block on the free list (free blocks only).
    #[inline]
    pub(super) fn prev(&self) -> u32 {
        debug_assert!(self.is_free(), "only free blocks are linked");
        self.count_or_prev
    }

    /// The next block on the free list (free blocks only).
    #[inline]
    pub(super) fn next(&self) -> u32 {
        let link = self.tag & LINK_MASK;
        if link == LINK_MASK { NIL } else { link }
    }

    /// Puts the block on the free list between `prev` and `next`, keeping its key.
    #[inline]
    pub(super) fn set_free(&mut self, prev: u32, next: u32) {
        self.count_or_prev = prev;
        self.tag = (self.tag & (3 << KEYING_SHIFT)) | FREE_BIT | (next & LINK_MASK);
    }

    /// Sets the previous block of a free block.
    #[inline]
    pub(super) fn set_prev(&mut self, prev: u32) {
        debug_assert!(self.is_free(), "only free blocks are linked");
        self.count_or_prev = prev;
    }

    /// Sets the next block of a free block.
    #[inline]
    pub(super) fn set_next(&mut self, next: u32) {
        debug_assert!(self.is_free(), "only free blocks are linked");
        self.tag = (self.tag & !LINK_MASK) | (next & LINK_MASK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_16_bytes_and_its_fields_do_not_overlap() {
        assert_eq!(std::mem::size_of::<Block>(), 16);
        let mut block = Block::held(1);
        block.key = 7;
        block.set_keying(Keying::Mapped);
        assert_eq!(
            (block.ref_cnt(), block.keying(), block.key()),
            (1, Keying::Mapped, Some(7))
        );
        block.set_free(NIL, MAX_BLOCKS - 1);
        assert!(block.is_free());
        assert_eq!(
            (block.ref_cnt(), block.prev(), block.next()),
            (0, NIL, MAX_BLOCKS - 1)
        );
        assert_eq!(block.keying(), Keying::Mapped);
        block.set_next(NIL);
        block.set_prev(3);
        assert_eq!(
            (block.prev(), block.next(), block.keying()),
            (3, NIL, Keying::Mapped)
        );
        block.set_held(2);
        assert!(!block.is_free());
        assert_eq!(
            (block.ref_cnt(), block.keying(), block.next()),
            (2, Keying::Mapped, NIL)
        );
        assert!(!block.drop_holder());
        assert!(block.drop_holder());
        block.set_keying(Keying::Unkeyed);
        assert_eq!(block.key(), None);
        let mut node = Block::run_node(5);
        assert!(node.is_free() && node.is_run() && !node.is_keyed());
        node.set_free(4, 9);
        assert_eq!((node.prev(), node.next(), node.run_slot()), (4, 9, 5));
        assert_eq!(node.key(), None);
    }
}
