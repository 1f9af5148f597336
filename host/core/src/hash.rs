//! Block hashing compatible with Dynamo's tooling (engine-protocols.md section 2).
//!
//! Only full blocks are hashed. A *local* hash names a block's tokens alone; a *sequence* hash names
//! a block together with its whole prefix, so one sequence hash identifies one node of the global
//! prefix tree.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every block hash. LoRA adapters or tenants use another seed so they never share blocks.
pub const HASH_SEED: u64 = 1337;

/// Hash of one block's tokens, without its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalBlockHash(pub u64);

/// Hash of one block together with every block before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SequenceHash(pub u64);

/// Identity hasher for maps keyed by sequence hashes: they are already uniform 64-bit values, so
/// hashing them again (SipHash) only costs time on the routing path.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A map keyed by sequence hash, without rehashing the keys.
pub(crate) type HashMapByHash<V> = HashMap<SequenceHash, V, BuildHasherDefault<PassThrough>>;

/// Hashes token sequences into blocks of a fixed size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHasher {
    block_size: usize,
    seed: u64,
}

// === impl BlockHasher ===

impl BlockHasher {
    /// A hasher for `block_size`-token blocks with the default seed.
    ///
    /// # Panics
    /// If `block_size` is 0: a configuration error that validation rejects earlier.
    pub fn new(block_size: usize) -> Self {
        Self::with_seed(block_size, HASH_SEED)
    }

    /// A hasher whose seed separates adapters or tenants.
    pub fn with_seed(block_size: usize, seed: u64) -> Self {
        assert!(block_size > 0, "block size must be positive");
        Self { block_size, seed }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Local hash of one block of tokens (any length; callers pass full blocks).
    pub fn local(&self, tokens: &[u32]) -> LocalBlockHash {
        LocalBlockHash(xxh3_64_with_seed(&token_bytes(tokens), self.seed))
    }

    /// Local hashes of every full block of `tokens`; a trailing partial block is ignored. A block
    /// equal to the one before it takes its hash without hashing again (runs of repeated blocks:
    /// padding, synthetic prompts); elsewhere the comparison mostly ends at the first token.
    pub fn locals(&self, tokens: &[u32]) -> Vec<LocalBlockHash> {
        let mut previous: Option<(&[u32], LocalBlockHash)> = None;
        tokens
            .chunks_exact(self.block_size)
            .map(|block| {
                // The first tokens tell most blocks apart without a call to compare them whole.
                let local = match previous {
                    Some((before, local)) if before[0] == block[0] && before == block => local,
                    _ => self.local(block),
                };
                previous = Some((block, local));
                local
            })
            .collect()
    }

    /// Sequence hash of a block whose prefix ends in `parent` (`None` at the start of a sequence).
    pub fn chain(&self, parent: Option<SequenceHash>, local: LocalBlockHash) -> SequenceHash {
        match parent {
            None => SequenceHash(local.0),
            Some(parent) => {
                let mut bytes = [0u8; 16];
                bytes[..8].copy_from_slice(&parent.0.to_le_bytes());
                bytes[8..].copy_from_slice(&local.0.to_le_bytes());
                SequenceHash(xxh3_64_with_seed(&bytes, self.seed))
            }
        }
    }

    /// Sequence hashes of a chain of local hashes that continues after `parent`.
    pub fn sequence_from(
        &self,
        parent: Option<SequenceHash>,
        locals: &[LocalBlockHash],
    ) -> Vec<SequenceHash> {
        let mut prev = parent;
        locals
            .iter()
            .map(|&local| {
                let seq = self.chain(prev, local);
                prev = Some(seq);
                seq
            })
            .collect()
    }

    /// Sequence hashes of every full block of `tokens`.
    pub fn sequence(&self, tokens: &[u32]) -> Vec<SequenceHash> {
        self.sequence_from(None, &self.locals(tokens))
    }
}

/// `tokens` as their little-endian bytes, the form every hash of tokens reads them in: on a
/// little-endian machine their own memory, not a copy.
pub fn token_bytes(tokens: &[u32]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(tokens))
    } else {
        Cow::Owned(tokens.iter().flat_map(|t| t.to_le_bytes()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_full_blocks_are_hashed() {
        let h = BlockHasher::new(4);
        assert_eq!(h.locals(&[1, 2, 3]).len(), 0);
        assert_eq!(h.locals(&[1, 2, 3, 4, 5, 6, 7]).len(), 1);
        assert_eq!(h.sequence(&[0; 12]).len(), 3);
    }

    #[test]
    fn local_hash_is_xxh3_of_le_tokens_seed_1337() {
        let h = BlockHasher::new(2);
        let bytes = [1u8, 0, 0, 0, 0, 1, 0, 0];
        assert_eq!(h.local(&[1, 256]).0, xxh3_64_with_seed(&bytes, 1337));
    }

    #[test]
    fn sequence_hash_chains_the_prefix() {
        let h = BlockHasher::new(2);
        let seq = h.sequence(&[1, 2, 3, 4]);
        let locals = h.locals(&[1, 2, 3, 4]);
        assert_eq!(seq[0].0, locals[0].0);
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&seq[0].0.to_le_bytes());
        bytes.extend_from_slice(&locals[1].0.to_le_bytes());
        assert_eq!(seq[1].0, xxh3_64_with_seed(&bytes, 1337));
        // Same block after a different prefix: same local hash, different sequence hash.
        let other = h.sequence(&[9, 9, 3, 4]);
        assert_eq!(h.locals(&[9, 9, 3, 4])[1], locals[1]);
        assert_ne!(other[1], seq[1]);
    }

    #[test]
    fn long_blocks_hash_like_short_ones() {
        let tokens: Vec<u32> = (0..200).collect();
        let h = BlockHasher::new(100);
        let bytes: Vec<u8> = tokens[..100].iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(h.locals(&tokens)[0].0, xxh3_64_with_seed(&bytes, 1337));
    }

    #[test]
    fn repeated_blocks_hash_as_each_alone() {
        let h = BlockHasher::new(2);
        let tokens = [5, 6, 5, 6, 5, 6, 7, 8, 5, 6];
        let each: Vec<_> = tokens.chunks_exact(2).map(|block| h.local(block)).collect();
        assert_eq!(h.locals(&tokens), each);
        let seq = h.sequence(&tokens);
        assert_ne!(seq[0], seq[1], "the chain still tells the copies apart");
    }

    #[test]
    fn seeds_separate_tenants() {
        assert_ne!(
            BlockHasher::with_seed(2, 1).local(&[1, 2]),
            BlockHasher::new(2).local(&[1, 2])
        );
    }
}
