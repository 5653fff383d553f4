//! A request's block table: the ids of its identified blocks, then a count of anonymous
//! (private) ones, whose keys derive from the owner's seed and their index.

/// The blocks a request holds, in token order: identified ones, then anonymous ones.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BlockTable {
    /// Ids of the identified blocks, block `i` holding tokens `i*block_size ..
    /// (i+1)*block_size`: prefix hits and shareable content, always leading.
    pub ids: Vec<u32>,
    /// How many leading blocks have been keyed (registered for prefix hits).
    pub num_keyed: u32,
    /// Anonymous (private) blocks after the identified ones.
    pub(super) anon: u32,
    /// The owner's private seed: anonymous block `i`'s latent key is `seed ^ i`.
    pub(super) seed: u64,
    /// Anonymous indices below `num_keyed` left unkeyed, ascending: their key was already
    /// cached elsewhere (a preempted request's own content), so they are duplicates.
    pub(super) dups: Vec<u32>,
}

impl Clone for BlockTable {
    /// Keeps the reserved room (a forked request grows its table without reallocating).
    fn clone(&self) -> Self {
        Self {
            ids: clone_with_capacity(&self.ids),
            num_keyed: self.num_keyed,
            anon: self.anon,
            seed: self.seed,
            dups: self.dups.clone(),
        }
    }
}

impl BlockTable {
    /// Number of blocks held.
    #[inline]
    pub fn len(&self) -> u32 {
        self.ids.len() as u32 + self.anon
    }

    /// True if the request holds no block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Anonymous blocks held (after the identified ones).
    pub fn anonymous(&self) -> u32 {
        self.anon
    }

    /// Heap bytes held (the id and duplicate lists' room).
    pub fn memory_bytes(&self) -> usize {
        (self.ids.capacity() + self.dups.capacity()) * std::mem::size_of::<u32>()
    }

    /// True if anonymous block `index` holds its latent key.
    pub(super) fn anon_keyed(&self, index: u32) -> bool {
        index < self.num_keyed && self.dups.binary_search(&index).is_err()
    }
}

/// A copy of `items` with the same reserved room.
pub(super) fn clone_with_capacity<T: Copy>(items: &Vec<T>) -> Vec<T> {
    let mut copy = Vec::with_capacity(items.capacity());
    copy.extend_from_slice(items);
    copy
}
