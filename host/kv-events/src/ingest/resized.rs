//! Engines whose blocks are not ours but a whole fraction ([`pages`]) or multiple ([`bundles`])
//! of them: each keeps its own table, beside the ingestor's, and an event goes to it when its
//! first hash is one of its blocks.

mod bundles;
mod pages;

use super::{IngestStats, Naming};
use crate::wire::EngineHash;
use bundles::Bundles;
use pages::Pages;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::worker::Tier;

/// An engine's blocks that are a whole fraction ([`Pages`]) or multiple ([`Bundles`]) of ours.
#[derive(Debug)]
pub(super) enum Resized {
    Pages(Pages),
    Bundles(Bundles),
}

impl Resized {
    pub(super) fn new(engine_block: usize, block_size: usize) -> Option<Resized> {
        Pages::new(engine_block, block_size)
            .map(Resized::Pages)
            .or_else(|| Bundles::new(engine_block, block_size).map(Resized::Bundles))
    }

    pub(super) fn engine_block(&self) -> usize {
        match self {
            Resized::Pages(pages) => pages.page_size(),
            Resized::Bundles(bundles) => bundles.engine_block(),
        }
    }

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
        match self {
            Resized::Pages(p) => p.store(hasher, blocks, parent, tokens, tier, naming, stats),
            Resized::Bundles(b) => b.store(hasher, blocks, parent, tokens, tier, naming, stats),
        }
    }

    pub(super) fn copy(
        &mut self,
        blocks: &[EngineHash],
        tier: Tier,
        naming: &mut Option<Naming>,
        stats: &mut IngestStats,
    ) -> Vec<SequenceHash> {
        match self {
            Resized::Pages(pages) => pages.copy(blocks, tier, naming, stats),
            Resized::Bundles(bundles) => bundles.copy(blocks, tier, naming, stats),
        }
    }

    pub(super) fn remove(
        &mut self,
        blocks: &[EngineHash],
        tier: Tier,
        naming: &mut Option<Naming>,
        stats: &mut IngestStats,
    ) -> Vec<SequenceHash> {
        match self {
            Resized::Pages(pages) => pages.remove(blocks, tier, naming, stats),
            Resized::Bundles(bundles) => bundles.remove(blocks, tier, naming, stats),
        }
    }

    pub(super) fn holds(&self, block: EngineHash) -> bool {
        match self {
            Resized::Pages(pages) => pages.holds(block),
            Resized::Bundles(bundles) => bundles.holds(block),
        }
    }

    pub(super) fn clear(&mut self) {
        match self {
            Resized::Pages(pages) => pages.clear(),
            Resized::Bundles(bundles) => bundles.clear(),
        }
    }
}

/// Runs of `len` values each, reused once freed: the tokens of pages, our hashes of large
/// blocks (see [`Resized`]).
#[derive(Debug)]
struct Chunks<T> {
    len: usize,
    values: Vec<T>,
    free: Vec<u32>,
}

impl<T: Copy> Chunks<T> {
    fn new(len: usize) -> Self {
        Chunks {
            len,
            values: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Keep `chunk` (`len` values); its index.
    fn keep(&mut self, chunk: &[T]) -> u32 {
        match self.free.pop() {
            Some(at) => {
                let start = at as usize * self.len;
                self.values[start..start + self.len].copy_from_slice(chunk);
                at
            }
            None => {
                self.values.extend_from_slice(chunk);
                (self.values.len() / self.len - 1) as u32
            }
        }
    }

    fn get(&self, at: u32) -> &[T] {
        let start = at as usize * self.len;
        &self.values[start..start + self.len]
    }

    fn free(&mut self, at: u32) {
        self.free.push(at);
    }

    fn clear(&mut self) {
        self.values.clear();
        self.free.clear();
    }
}

/// The engine's resized blocks, if an event's hashes name them (its first one says: an event
/// names resized blocks or ours, not both).
pub(super) fn resized_of<'a>(
    resized: &'a mut Option<Resized>,
    hashes: &[EngineHash],
) -> Option<&'a mut Resized> {
    let first = *hashes.first()?;
    resized.as_mut().filter(|resized| resized.holds(first))
}
