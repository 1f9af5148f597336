//! Engines whose blocks are larger than ours, by a whole factor: vLLM gives a hybrid model's
//! attention layers blocks as large as a Mamba layer's state (hundreds of tokens), and its
//! events then name one hash per large block. Each engine block is hashed into the run of our
//! blocks it holds, which it holds or drops together.

use super::Chunks;
use crate::ingest::{IngestStats, Naming, add_copies, name};
use crate::wire::EngineHash;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::flat::U64Map;
use switchyard_core::worker::Tier;

/// One engine block: where its run of our hashes is, and its copies per tier (as
/// `ingest::Block`'s).
#[derive(Debug, Clone, Copy, Default)]
struct Bundle {
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

    fn ours(&self, bundle: Bundle) -> &[SequenceHash] {
        self.runs.get(bundle.at)
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
                Some(&bundle) => self.ours(bundle).last().copied(),
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
            self.add_copy(*block, tier, naming, &mut stored);
        }
        stored
    }

    /// Count one more copy of `block` in `tier`; if the tier did not hold it, its run goes to
    /// `stored`. False if the block is unknown.
    fn add_copy(
        &mut self,
        block: EngineHash,
        tier: Tier,
        naming: &mut Option<Naming>,
        stored: &mut Vec<SequenceHash>,
    ) -> bool {
        let Some(bundle) = self.table.get_mut(block.0) else {
            return false;
        };
        if add_copies(&mut bundle.copies, tier) {
            let bundle = *bundle;
            for &ours in self.ours(bundle) {
                name(naming, Some(ours), block);
                stored.push(ours);
            }
        }
        true
    }

    /// Token-less copies of known engine blocks (an offload): our blocks `tier` gained.
    pub(super) fn copy(
        &mut self,
        blocks: &[EngineHash],
        tier: Tier,
        naming: &mut Option<Naming>,
        stats: &mut IngestStats,
    ) -> Vec<SequenceHash> {
        let mut stored = Vec::new();
        for block in blocks {
            if !self.add_copy(*block, tier, naming, &mut stored) {
                stats.skipped_unknown_hash += 1;
            }
        }
        stored
    }

    /// Drop one copy of each engine block in `tier`: our blocks that left it. An engine block
    /// no tier holds is forgotten.
    pub(super) fn remove(
        &mut self,
        blocks: &[EngineHash],
        tier: Tier,
        naming: &mut Option<Naming>,
        stats: &mut IngestStats,
    ) -> Vec<SequenceHash> {
        let mut removed = Vec::new();
        for block in blocks {
            let Some(bundle) = self.table.get_mut(block.0) else {
                stats.skipped_unknown_hash += 1;
                continue;
            };
            let copies = &mut bundle.copies[tier as usize];
            if *copies == 0 {
                stats.skipped_unknown_hash += 1;
                continue;
            }
            *copies -= 1;
            let left = *copies == 0;
            let bundle = *bundle;
            if left {
                removed.extend_from_slice(self.ours(bundle));
            }
            if bundle.copies == [0; 3] {
                if let Some(naming) = naming.as_mut() {
                    let gone = self.ours(bundle).iter().map(|ours| (ours.0, None));
                    naming.pending.extend(gone);
                }
                self.table.remove(block.0);
                self.runs.free(bundle.at);
            }
        }
        removed
    }

    /// Whether `block` is one of this engine's.
    pub(super) fn holds(&self, block: EngineHash) -> bool {
        self.table.contains_key(block.0)
    }

    /// Forget every engine block.
    pub(super) fn clear(&mut self) {
        self.table.clear();
        self.runs.clear();
    }
}
