//! The KV cache's materialized blocks, in fixed-size chunks that engine copies can share.
//!
//! A fork of the twin's restored engine used to copy every materialized block (~11k blocks,
//! 180 kB, 128 times a question) although it writes few of them. Here [`Blocks::freeze`]
//! moves every chunk into a *base* shared through one `Arc`; a copy of a frozen store then
//! clones only its chunk table (a null entry per chunk: "still the base's") and the `Arc`,
//! and a write to a base chunk first copies that chunk alone into one the copy owns. A
//! store never frozen (the offline run) owns every chunk and writes it in place; a copy of a
//! store copies the chunks it owns, so copies never alias a written block.
//!
//! The crate forbids `unsafe`: an owned chunk is a `Box` (an `Arc` known to be unique would
//! cost an atomic read-modify-write per write through `Arc::get_mut`), and the base is one
//! `Arc` for all chunks (one per chunk would cost an atomic count per chunk per copy, on
//! counters the threads answering one question all touch).

use std::sync::Arc;

use super::block::Block;

/// Blocks per chunk, as a power of two (picked by measurement: docs/performance.md).
const CHUNK_SHIFT: u32 = 6;
/// Blocks per chunk.
const CHUNK: usize = 1 << CHUNK_SHIFT;
/// A block's index within its chunk.
const MASK: usize = CHUNK - 1;

/// One chunk's blocks.
type Slab = [Block; CHUNK];

/// The materialized blocks `0..len()` of a cache, indexed by block id: one flat vector
/// until frozen, chunks shared with a frozen base after. An access tests the id against the
/// flat vector's length, the test indexing a vector makes anyway, so a store never frozen
/// (the offline run's) costs what a plain vector does; a frozen one's accesses go out of
/// line to the chunks.
#[derive(Debug)]
pub(super) struct Blocks {
    /// Every block while never frozen (with room for them all); empty once frozen.
    flat: Vec<Block>,
    /// The blocks once frozen (no chunk before: then the store is flat).
    chunked: Chunked,
}

impl Clone for Blocks {
    /// A flat store is copied whole, with its room; a chunked one copies the chunks it owns
    /// and shares the base.
    fn clone(&self) -> Self {
        Self {
            flat: crate::sim::state::clone_with_capacity(&self.flat),
            chunked: self.chunked.clone(),
        }
    }
}

impl Blocks {
    /// No block yet, with room for `total` blocks.
    pub(super) fn with_capacity(total: u32) -> Self {
        // Room for every block (untouched until used), so materializing never regrows.
        Self {
            flat: Vec::with_capacity(total as usize),
            chunked: Chunked {
                chunks: Vec::new(),
                base: Arc::new([]),
                frozen: 0,
                tail: Vec::new(),
            },
        }
    }

    /// True until frozen (see [`Access`]).
    #[inline(always)]
    pub(super) fn is_flat(&self) -> bool {
        self.chunked.chunks.is_empty()
    }

    /// Materialized blocks.
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        if self.is_flat() {
            self.flat.len()
        } else {
            self.chunked.len()
        }
    }

    /// Materializes one more block (id `len()`).
    #[inline(always)]
    pub(super) fn push(&mut self, block: Block) {
        if self.is_flat() {
            self.flat.push(block);
        } else {
            self.chunked.tail.push(block);
        }
    }

    /// Materializes `count` more blocks, the `i`-th of them `block(i)`.
    #[inline]
    pub(super) fn extend_with(&mut self, count: u32, block: impl FnMut(u32) -> Block) {
        if self.is_flat() {
            self.flat.extend((0..count).map(block));
        } else {
            self.chunked.tail.extend((0..count).map(block));
        }
    }

    /// Makes every block part of a shared base, so that copies of this store clone only a
    /// chunk table and copy a chunk when they first write it.
    pub(super) fn freeze(&mut self) {
        if !self.is_flat() {
            // (Freezing a copy of a frozen store: rare, so simply flattened first.)
            let mut flat = Vec::with_capacity(self.flat.capacity().max(self.len()));
            flat.extend(self.iter().copied());
            self.flat = flat;
            self.chunked.chunks.clear();
            self.chunked.tail = Vec::new();
        }
        let base: Arc<[Slab]> = self
            .flat
            .chunks(CHUNK)
            .map(|blocks| {
                let mut slab = [Block::held(0); CHUNK];
                slab[..blocks.len()].copy_from_slice(blocks);
                slab
            })
            .collect();
        let mut chunks = Vec::with_capacity(self.flat.capacity().div_ceil(CHUNK));
        chunks.resize(base.len(), None);
        self.chunked = Chunked {
            chunks,
            base,
            frozen: self.flat.len(),
            // Room for every block left (untouched until used), as the flat store had:
            // copies keep it, so a fork's new blocks never regrow the vector.
            tail: Vec::with_capacity(self.flat.capacity() - self.flat.len()),
        };
        self.flat = Vec::new();
    }

    /// Chunks still read from the shared base (for tests).
    pub(super) fn shared_chunks(&self) -> usize {
        let chunks = &self.chunked.chunks;
        chunks.iter().filter(|chunk| chunk.is_none()).count()
    }

    /// Every materialized block, in id order.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = &Block> + '_> {
        if self.is_flat() {
            return Box::new(self.flat.iter());
        }
        let chunked = &self.chunked;
        Box::new(
            (0..chunked.chunks.len())
                .flat_map(|chunk| chunked.slab(chunk).iter())
                .take(chunked.frozen)
                .chain(&chunked.tail),
        )
    }

    /// Block `id` of a frozen store.
    #[inline(never)]
    fn chunked(&self, id: usize) -> &Block {
        self.chunked.get(id)
    }

    /// Block `id` of a frozen store, for writing.
    #[inline(never)]
    fn chunked_mut(&mut self, id: usize) -> &mut Block {
        self.chunked.get_mut(id)
    }
}

/// How the KV cache's hot paths reach blocks: [`Flat`] or [`Shared`], picked once per
/// public call by [`Blocks::is_flat`], so a store never frozen (the offline run's) is
/// accessed as a plain vector is, with no per-access test of its form.
pub(super) trait Access {
    /// Materialized blocks.
    fn len(blocks: &Blocks) -> usize;
    /// Block `id`.
    fn at(blocks: &Blocks, id: usize) -> &Block;
    /// Block `id`, for writing.
    fn at_mut(blocks: &mut Blocks, id: usize) -> &mut Block;
}

/// A store never frozen: the flat vector.
pub(super) enum Flat {}

impl Access for Flat {
    #[inline(always)]
    fn len(blocks: &Blocks) -> usize {
        blocks.flat.len()
    }

    #[inline(always)]
    fn at(blocks: &Blocks, id: usize) -> &Block {
        &blocks.flat[id]
    }

    #[inline(always)]
    fn at_mut(blocks: &mut Blocks, id: usize) -> &mut Block {
        &mut blocks.flat[id]
    }
}

/// A frozen store (or a copy of one): the chunks.
pub(super) enum Shared {}

impl Access for Shared {
    #[inline(always)]
    fn len(blocks: &Blocks) -> usize {
        blocks.chunked.len()
    }

    #[inline(always)]
    fn at(blocks: &Blocks, id: usize) -> &Block {
        blocks.chunked.get(id)
    }

    #[inline(always)]
    fn at_mut(blocks: &mut Blocks, id: usize) -> &mut Block {
        blocks.chunked.get_mut(id)
    }
}

/// The chunked form of [`Blocks`].
#[derive(Debug)]
pub(super) struct Chunked {
    /// Chunk `c`'s blocks when this copy owns them; `None` while it is still the frozen
    /// `base[c]` (a copy of an owned chunk copies it: copies never alias a written block).
    chunks: Vec<Option<Box<Slab>>>,
    /// The chunks as they were frozen, shared by every copy (one reference count a copy).
    base: Arc<[Slab]>,
    /// Blocks materialized when frozen: ids `0..frozen`, in the chunks (the last chunk's
    /// slots from `frozen` on are unused).
    frozen: usize,
    /// Blocks materialized since: ids from `frozen` on, in one vector (a fork's new blocks
    /// go onto a plain vector's end, not into fresh chunks).
    tail: Vec<Block>,
}

impl Clone for Chunked {
    /// Copies the chunks this store owns and the table's room; shares the base.
    fn clone(&self) -> Self {
        let mut chunks = Vec::with_capacity(self.chunks.capacity());
        chunks.extend(self.chunks.iter().cloned());
        Self {
            chunks,
            base: Arc::clone(&self.base),
            frozen: self.frozen,
            tail: crate::sim::state::clone_with_capacity(&self.tail),
        }
    }
}

impl Chunked {
    /// Materialized blocks.
    #[inline(always)]
    fn len(&self) -> usize {
        self.frozen + self.tail.len()
    }

    /// Block `id`.
    #[inline(always)]
    fn get(&self, id: usize) -> &Block {
        if id < self.frozen {
            &self.slab(id >> CHUNK_SHIFT)[id & MASK]
        } else {
            &self.tail[id - self.frozen]
        }
    }

    /// Block `id`, for writing.
    #[inline(always)]
    fn get_mut(&mut self, id: usize) -> &mut Block {
        if id < self.frozen {
            &mut self.slab_mut(id >> CHUNK_SHIFT)[id & MASK]
        } else {
            &mut self.tail[id - self.frozen]
        }
    }

    /// Chunk `chunk`'s blocks, for reading.
    #[inline(always)]
    fn slab(&self, chunk: usize) -> &Slab {
        match &self.chunks[chunk] {
            Some(slab) => slab,
            None => &self.base[chunk],
        }
    }

    /// Chunk `chunk`'s blocks, for writing: a base chunk is copied first.
    #[inline(always)]
    fn slab_mut(&mut self, chunk: usize) -> &mut Slab {
        if self.chunks[chunk].is_none() {
            self.own(chunk);
        }
        match &mut self.chunks[chunk] {
            Some(slab) => slab,
            None => unreachable!("the chunk was just copied"),
        }
    }

    /// Copies base chunk `chunk` into this store's own.
    #[cold]
    #[inline(never)]
    fn own(&mut self, chunk: usize) {
        let mut slab = fresh_slab();
        *slab = self.base[chunk];
        self.chunks[chunk] = Some(slab);
    }
}

/// A chunk's room, every slot an unused placeholder (built in place, not on the stack).
fn fresh_slab() -> Box<Slab> {
    vec![Block::held(0); CHUNK]
        .into_boxed_slice()
        .try_into()
        .expect("a chunk's length")
}

impl std::ops::Index<usize> for Blocks {
    type Output = Block;

    #[inline(always)]
    fn index(&self, id: usize) -> &Block {
        match self.flat.get(id) {
            Some(block) => block,
            None => self.chunked(id),
        }
    }
}

impl std::ops::IndexMut<usize> for Blocks {
    #[inline(always)]
    fn index_mut(&mut self, id: usize) -> &mut Block {
        if id < self.flat.len() {
            &mut self.flat[id]
        } else {
            self.chunked_mut(id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(count: u32) -> Blocks {
        let mut blocks = Blocks::with_capacity(count);
        blocks.extend_with(count, Block::held);
        blocks
    }

    #[test]
    fn blocks_are_indexed_across_chunks() {
        let count = 3 * CHUNK as u32 + 5;
        let blocks = store(count);
        assert_eq!(blocks.len(), count as usize);
        for id in 0..count {
            assert_eq!(blocks[id as usize].ref_cnt(), id);
        }
        let counts: Vec<u32> = blocks.iter().map(Block::ref_cnt).collect();
        assert_eq!(counts, (0..count).collect::<Vec<_>>());
        // Frozen, then grown by a run crossing two chunk boundaries and one block more.
        let mut frozen = blocks.clone();
        frozen.freeze();
        frozen.extend_with(2 * CHUNK as u32, |index| Block::held(count + index));
        frozen.push(Block::held(count + 2 * CHUNK as u32));
        let total = count + 2 * CHUNK as u32 + 1;
        assert_eq!(frozen.len(), total as usize);
        for id in 0..total {
            assert_eq!(frozen[id as usize].ref_cnt(), id);
        }
        let counts: Vec<u32> = frozen.iter().map(Block::ref_cnt).collect();
        assert_eq!(counts, (0..total).collect::<Vec<_>>());
    }

    #[test]
    fn a_copy_of_a_frozen_store_shares_until_written_and_writes_stay_private() {
        let mut base = store(2 * CHUNK as u32 + 1);
        assert_eq!(base.shared_chunks(), 0, "a flat store shares nothing");
        base.freeze();
        assert_eq!(base.shared_chunks(), 3);
        base.freeze();
        assert_eq!(base.shared_chunks(), 3, "freezing twice changes nothing");
        let mut fork = base.clone();
        assert_eq!(fork.shared_chunks(), 3);
        fork[CHUNK + 1].add_holder();
        assert_eq!(fork.shared_chunks(), 2, "only the written chunk was copied");
        fork.push(Block::held(9));
        assert_eq!(
            fork.shared_chunks(),
            2,
            "new blocks go to the tail, not a chunk"
        );
        assert_eq!(fork[CHUNK + 1].ref_cnt(), CHUNK as u32 + 2);
        assert_eq!(
            base[CHUNK + 1].ref_cnt(),
            CHUNK as u32 + 1,
            "the base is unchanged"
        );
        assert_eq!(base.len(), 2 * CHUNK + 1);
        assert_eq!(fork.len(), 2 * CHUNK + 2);
        // A copy of the fork copies its owned chunk: its writes do not reach the fork.
        let mut copy = fork.clone();
        copy[CHUNK + 1].add_holder();
        assert_eq!(fork[CHUNK + 1].ref_cnt(), CHUNK as u32 + 2);
        assert_eq!(copy[CHUNK + 1].ref_cnt(), CHUNK as u32 + 3);
    }
}
