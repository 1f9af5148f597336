//! Engines whose blocks are not ours but a whole fraction ([`pages`]) or multiple ([`bundles`])
//! of them: each keeps its own table, beside the ingestor's, and an event goes to it when its
//! first hash is one of its blocks.

mod bundles;
mod pages;

use super::{IngestStats, Naming, add_copies, name};
use crate::wire::EngineHash;
use bundles::Bundles;
use pages::Pages;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::flat::U64Map;
use switchyard_core::worker::Tier;

/// What both kinds keep per engine block, for the copy counting they share.
trait Kind {
    type Record: Copy + Default;

    fn records(&self) -> &U64Map<Self::Record>;

    fn records_mut(&mut self) -> &mut U64Map<Self::Record>;

    /// The record's copies per tier, as `ingest::Block`'s.
    fn copies(record: &mut Self::Record) -> &mut [u16; 3];

    /// Our blocks the engine block holds whole: a page's, the one it ends (if it ends one); a
    /// large block's, its run.
    fn ours<'a>(&'a self, record: &'a Self::Record) -> &'a [SequenceHash];

    /// The engine block left every tier: free what its record kept beside it.
    fn forget(&mut self, record: &Self::Record);
}

/// Count one more copy of `block` in `tier`; if the tier did not hold it, the blocks of ours it
/// holds go to `stored` (and are named). False if the block is unknown.
fn add_copy<K: Kind>(
    kind: &mut K,
    block: EngineHash,
    tier: Tier,
    naming: &mut Option<Naming>,
    stored: &mut Vec<SequenceHash>,
) -> bool {
    let Some(record) = kind.records_mut().get_mut(block.0) else {
        return false;
    };
    if add_copies(K::copies(record), tier) {
        let record = *record;
        for &ours in kind.ours(&record) {
            name(naming, Some(ours), block);
            stored.push(ours);
        }
    }
    true
}

/// Token-less copies of known engine blocks (an offload): our blocks `tier` gained.
fn copy<K: Kind>(
    kind: &mut K,
    blocks: &[EngineHash],
    tier: Tier,
    naming: &mut Option<Naming>,
    stats: &mut IngestStats,
) -> Vec<SequenceHash> {
    let mut stored = Vec::new();
    for block in blocks {
        if !add_copy(kind, *block, tier, naming, &mut stored) {
            stats.skipped_unknown_hash += 1;
        }
    }
    stored
}

/// Drop one copy of each engine block in `tier`: our blocks that left it with them. An engine
/// block no tier holds is forgotten.
fn remove<K: Kind>(
    kind: &mut K,
    blocks: &[EngineHash],
    tier: Tier,
    naming: &mut Option<Naming>,
    stats: &mut IngestStats,
) -> Vec<SequenceHash> {
    let mut removed = Vec::new();
    for block in blocks {
        let Some(record) = kind.records_mut().get_mut(block.0) else {
            stats.skipped_unknown_hash += 1;
            continue;
        };
        let copies = K::copies(record);
        if copies[tier as usize] == 0 {
            stats.skipped_unknown_hash += 1;
            continue;
        }
        copies[tier as usize] -= 1;
        let (left, gone) = (copies[tier as usize] == 0, *copies == [0; 3]);
        let record = *record;
        if left {
            removed.extend_from_slice(kind.ours(&record));
        }
        if gone {
            if let Some(naming) = naming.as_mut() {
                let names = kind.ours(&record).iter().map(|ours| (ours.0, None));
                naming.pending.extend(names);
            }
            kind.records_mut().remove(block.0);
            kind.forget(&record);
        }
    }
    removed
}

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
            Resized::Pages(pages) => copy(pages, blocks, tier, naming, stats),
            Resized::Bundles(bundles) => copy(bundles, blocks, tier, naming, stats),
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
            Resized::Pages(pages) => remove(pages, blocks, tier, naming, stats),
            Resized::Bundles(bundles) => remove(bundles, blocks, tier, naming, stats),
        }
    }

    pub(super) fn holds(&self, block: EngineHash) -> bool {
        match self {
            Resized::Pages(pages) => pages.records().contains_key(block.0),
            Resized::Bundles(bundles) => bundles.records().contains_key(block.0),
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
