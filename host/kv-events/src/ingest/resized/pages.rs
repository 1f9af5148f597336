//! Engines whose blocks ("pages") are smaller than ours, by a whole factor: SGLang's default page
//! is one token, where the router hashes 16-token blocks. Every `per_block` pages of a chain
//! make one of our blocks, which exists once the page that ends it is stored; its tokens are
//! gathered from the pages before it, which may have come in earlier stores (SGLang stores each
//! radix node's pages as one event, and nodes split anywhere).
//!
//! Each page costs a table entry (40 bytes) and, unless it ends a block, its tokens: about
//! 60 bytes per cached token at one-token pages, where an engine of our block size costs 2.
//!
//! A block is held in a tier while the page that ends it is. Engines evict a chain from its
//! leaf (vLLM's and SGLang's caches free a sequence tail first), so the page that ends a block
//! goes no later than the pages before it; an engine that dropped a block's earlier page and
//! kept its last would keep it indexed.

use super::{Chunks, Kind, add_copy};
use crate::ingest::{IngestStats, Naming};
use crate::wire::EngineHash;
use switchyard_core::hash::{BlockHasher, SequenceHash};
use switchyard_core::index::flat::U64Map;
use switchyard_core::worker::Tier;

/// No chunk of `Pages::tokens`.
const NO_TOKENS: u32 = u32::MAX;

/// One engine page.
#[derive(Debug, Clone, Copy)]
pub(super) struct Page {
    /// Our hash of the block this page ends (`pos == per_block - 1`); for the other pages, of
    /// the last whole block before them, if any (`has_hash`).
    hash: SequenceHash,
    has_hash: bool,
    /// Its place in our block, `0..per_block`.
    pos: u32,
    /// Its tokens' chunk in `Pages::tokens`, for a page that does not end a block.
    tokens: u32,
    /// The engine hash of the page before it, for a page that is not its block's first (those
    /// are walked back from: `Pages::gather`).
    parent: u64,
    /// Copies per tier, as `ingest::Block`'s.
    copies: [u16; 3],
}

impl Default for Page {
    fn default() -> Self {
        Page {
            hash: SequenceHash(0),
            has_hash: false,
            pos: 0,
            tokens: NO_TOKENS,
            parent: 0,
            copies: [0; 3],
        }
    }
}

/// The pages of one engine, and the tokens of those that do not end one of our blocks.
#[derive(Debug)]
pub(in crate::ingest) struct Pages {
    page_size: usize,
    per_block: u32,
    /// Engine hash -> page.
    table: U64Map<Page>,
    /// The tokens of pages that do not end a block.
    tokens: Chunks<u32>,
    /// A block's tokens while it is gathered.
    run: Vec<u32>,
}

impl Pages {
    /// Pages of `page_size` tokens under our `block_size`, if they divide it.
    pub(super) fn new(page_size: usize, block_size: usize) -> Option<Pages> {
        (page_size > 0 && page_size < block_size && block_size.is_multiple_of(page_size)).then(
            || Pages {
                page_size,
                per_block: (block_size / page_size) as u32,
                table: U64Map::new(),
                tokens: Chunks::new(page_size),
                run: Vec::with_capacity(block_size),
            },
        )
    }

    pub(super) fn page_size(&self) -> usize {
        self.page_size
    }

    /// Store `pages` (their tokens `page_size` each) under `parent`: our hashes of the blocks
    /// they end that `tier` did not hold. A parent we do not know, or whose block's earlier
    /// pages we lack, leaves the store out (counted as an unknown parent).
    #[allow(
        clippy::too_many_arguments,
        reason = "the ingestor's fields it updates, borrowed one by one beside `self`"
    )]
    pub(super) fn store(
        &mut self,
        hasher: &BlockHasher,
        pages: &[EngineHash],
        parent: Option<EngineHash>,
        tokens: &[u32],
        tier: Tier,
        naming: &mut Option<Naming>,
        stats: &mut IngestStats,
    ) -> Vec<SequenceHash> {
        let last = self.per_block - 1;
        // Where the chain stands before the first page: the last page's place, and our hash of
        // the last whole block.
        let (mut pos, mut whole) = match parent {
            None => (last, None),
            Some(parent) => match self.table.get(parent.0) {
                Some(page) => (page.pos, page.has_hash.then_some(page.hash)),
                None => {
                    stats.skipped_unknown_parent += 1;
                    return Vec::new();
                }
            },
        };
        self.run.clear();
        if pos != last && !self.gather(parent, pos) {
            stats.skipped_unknown_parent += 1;
            return Vec::new();
        }
        let mut stored = Vec::new();
        let mut before = parent;
        for (page, chunk) in pages.iter().zip(tokens.chunks_exact(self.page_size)) {
            pos = if pos == last { 0 } else { pos + 1 };
            self.run.extend_from_slice(chunk);
            let ends = pos == last;
            let mut hash = whole;
            if ends {
                let block = hasher.chain(whole, hasher.local(&self.run));
                self.run.clear();
                whole = Some(block);
                hash = whole;
            }
            // A known engine hash names the same tokens and prefix: its first record stays.
            if !self.table.contains_key(page.0) {
                let tokens = if ends {
                    NO_TOKENS
                } else {
                    self.tokens.keep(chunk)
                };
                let record = Page {
                    hash: hash.unwrap_or(SequenceHash(0)),
                    has_hash: hash.is_some(),
                    pos,
                    tokens,
                    parent: before.map_or(0, |p| p.0),
                    copies: [0; 3],
                };
                self.table.get_or_insert(page.0, record);
            }
            before = Some(*page);
            add_copy(self, *page, tier, naming, &mut stored);
        }
        stored
    }

    /// The tokens of the pages from `page` (at place `pos`) back to the start of its block,
    /// into `run` in chain order; false if one is missing.
    fn gather(&mut self, page: Option<EngineHash>, pos: u32) -> bool {
        let mut chunks = Vec::with_capacity(pos as usize + 1);
        let mut at = page.map(|p| p.0);
        for _ in 0..=pos {
            let Some(hash) = at else {
                return false;
            };
            match self.table.get(hash) {
                Some(page) if page.tokens != NO_TOKENS => {
                    chunks.push(page.tokens);
                    at = (page.pos > 0).then_some(page.parent);
                }
                _ => return false,
            }
        }
        for &chunk in chunks.iter().rev() {
            self.run.extend_from_slice(self.tokens.get(chunk));
        }
        true
    }

    /// Forget every page.
    pub(super) fn clear(&mut self) {
        self.table.clear();
        self.tokens.clear();
    }
}

impl Kind for Pages {
    type Record = Page;

    fn records(&self) -> &U64Map<Page> {
        &self.table
    }

    fn records_mut(&mut self) -> &mut U64Map<Page> {
        &mut self.table
    }

    fn copies(page: &mut Page) -> &mut [u16; 3] {
        &mut page.copies
    }

    fn ours<'a>(&'a self, page: &'a Page) -> &'a [SequenceHash] {
        if page.pos == self.per_block - 1 {
            std::slice::from_ref(&page.hash)
        } else {
            &[]
        }
    }

    fn forget(&mut self, page: &Page) {
        if page.tokens != NO_TOKENS {
            self.tokens.free(page.tokens);
        }
    }
}
