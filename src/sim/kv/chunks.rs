//! The GPU blocks of a KV cache in copy-on-write chunks.
//!
//! A fork of an engine copies its KV cache, and a mirrored instance has materialized tens of
//! thousands of blocks: copying them all made a fork cost what the whole cache holds, however
//! little the fork then changed. Here the blocks live in fixed-size chunks behind `Arc`s: a
//! copy shares every chunk, and the first write to a chunk in a copy copies that chunk alone,
//! so a fork costs what it changes. An engine that is never copied (an offline run) holds
//! every chunk alone and writes in place.

use std::ops::{Index, IndexMut};
use std::sync::Arc;

/// Blocks per chunk (a power of two).
const CHUNK_SHIFT: usize = 6;
const CHUNK: usize = 1 << CHUNK_SHIFT;
const MASK: usize = CHUNK - 1;

/// A growable sequence of `T` in copy-on-write chunks of [`CHUNK`] items.
#[derive(Clone, Debug)]
pub(super) struct Chunked<T: Copy> {
    chunks: Vec<Arc<[T; CHUNK]>>,
    len: usize,
    /// What fills a chunk's unused tail.
    filler: T,
}

impl<T: Copy> Chunked<T> {
    /// Empty, with room for the chunk pointers of `capacity` items.
    pub(super) fn with_capacity(capacity: usize, filler: T) -> Self {
        Self {
            chunks: Vec::with_capacity(capacity.div_ceil(CHUNK)),
            len: 0,
            filler,
        }
    }

    /// Items held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Appends `item`.
    pub(super) fn push(&mut self, item: T) {
        if self.len & MASK == 0 {
            self.chunks.push(Arc::new([self.filler; CHUNK]));
        }
        let index = self.len;
        self.len += 1;
        self[index] = item;
    }

    /// Appends `count` copies of `item`.
    pub(super) fn extend_repeat(&mut self, item: T, count: usize) {
        for _ in 0..count {
            self.push(item);
        }
    }

    /// The items in order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len).map(move |index| &self[index])
    }
}

impl<T: Copy> Index<usize> for Chunked<T> {
    type Output = T;

    fn index(&self, index: usize) -> &T {
        debug_assert!(index < self.len, "block {index} of {}", self.len);
        &self.chunks[index >> CHUNK_SHIFT][index & MASK]
    }
}

impl<T: Copy> IndexMut<usize> for Chunked<T> {
    /// Copies the item's chunk first if a fork shares it.
    fn index_mut(&mut self, index: usize) -> &mut T {
        debug_assert!(index < self.len, "block {index} of {}", self.len);
        &mut Arc::make_mut(&mut self.chunks[index >> CHUNK_SHIFT])[index & MASK]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_shares_until_written_and_writes_stay_apart() {
        let mut original = Chunked::with_capacity(1000, 0u64);
        for value in 0..200 {
            original.push(value);
        }
        original.extend_repeat(7, 3);
        assert_eq!(original.len(), 203);
        let mut copy = original.clone();
        assert!(Arc::ptr_eq(&original.chunks[1], &copy.chunks[1]));
        copy[70] = 1000;
        assert!(!Arc::ptr_eq(&original.chunks[1], &copy.chunks[1]));
        assert!(Arc::ptr_eq(&original.chunks[0], &copy.chunks[0]));
        assert_eq!((original[70], copy[70]), (70, 1000));
        copy.push(5);
        assert_eq!((original.len(), copy.len(), copy[203]), (203, 204, 5));
        let all: Vec<u64> = original.iter().copied().collect();
        assert_eq!(&all[..3], &[0, 1, 2]);
        assert_eq!(&all[200..], &[7, 7, 7]);
    }
}
