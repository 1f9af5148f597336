//! Engines whose blocks are larger than ours, by a whole factor: vLLM gives a hybrid model's
//! attention layers blocks as large as a Mamba layer's state (hundreds of tokens), and its
//! events then name one hash per large block. Each engine block is hashed into the run of our
//! blocks it holds, which it holds or drops together.

use super::{Chunks, Kind, add_copy};
use crate::ingest::{IngestStats, Naming};
use crate::wire::EngineHash;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::flat::U64Map;
use switchyard_core::worker::Tier;

/// One engine block: where its run of our hashes is, and its copies per tier (as
/// `ingest::Block`'s).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Bundle {
    at: u32,
    copies: [u16; 3],
}

/// The blocks of one engine, and our hashes of each.
#[derive(Debug)]
pub(in crate::ingest) struct Bundles {
    engine_block: usize,
    per_bundle: usize,
    /// Engine hash -> its run of our hashes.
    table: U64Map<Bundle>,
    runs: Chunks<SequenceHash>,
}

impl Bundles {
    /// Engine blocks of `engine_block` tokens over our `block_size`, if it divides them.
    pub(super) fn new(engine_block: usize, block_size: usize) -> Option<Bundles> {
        (engine_block > block_size && engine_block.is_multiple_of(block_size)).then(|| Bundles {
            engine_block,
            per_bundle: engine_block / block_size,
            table: U64Map::new(),
            runs: Chunks::new(engine_block / block_size),
        })
    }

    pub(super) fn engine_block(&self) -> usize {
        self.engine_block
    }

    /// Store engine blocks (`engine_block` tokens each) under `parent`: our hashes of the
    /// blocks `tier` did not hold. Under a parent we do not know, the store is left out.
    #[allow(
        clippy::too_many_arguments,
        reason = "the ingestor's fields it updates, borrowed one by one beside `self`"
    )]
    pub(super) fn store(
        &mut self,
        hasher: &BlockHasher,
        blocks: &[EngineHash],
        parent: Option<EngineHash>,
        tokens: &[u32],
        tier: Tier,
        naming: &mut Option<Naming>,
        stats: &mut IngestStats,
    ) -> Vec<SequenceHash> {
        let before = match parent {
            None => None,
            Some(parent) => match self.table.get(parent.0) {
                Some(bundle) => self.ours(bundle).last().copied(),
                None => {
                    stats.skipped_unknown_parent += 1;
                    return Vec::new();
                }
            },
        };
        let hashes = hasher.sequence_from(before, &hasher.locals(tokens));
        let mut stored = Vec::new();
        for (block, run) in blocks.iter().zip(hashes.chunks_exact(self.per_bundle)) {
            // A known engine hash names the same tokens and prefix: its first run stays.
            if !self.table.contains_key(block.0) {
                let at = self.runs.keep(run);
                self.table
                    .get_or_insert(block.0, Bundle { at, copies: [0; 3] });
            }
            add_copy(self, *block, tier, naming, &mut stored);
        }
        stored
    }

    /// Forget every engine block.
    pub(super) fn clear(&mut self) {
        self.table.clear();
        self.runs.clear();
    }
}

impl Kind for Bundles {
    type Record = Bundle;

    fn records(&self) -> &U64Map<Bundle> {
        &self.table
    }

    fn records_mut(&mut self) -> &mut U64Map<Bundle> {
        &mut self.table
    }

    fn copies(bundle: &mut Bundle) -> &mut [u16; 3] {
        &mut bundle.copies
    }

    fn ours<'a>(&'a self, bundle: &'a Bundle) -> &'a [SequenceHash] {
        self.runs.get(bundle.at)
    }

    fn forget(&mut self, bundle: &Bundle) {
        self.runs.free(bundle.at);
    }
}
