//! Real bytes under the engine model's tiers: a `switchyard-kvbm` store for the device (G1) and a
//! host slab for the host tier (G2), and the step's [`KvTransfer`]s replayed on them in order,
//! so every write-through, onboard and hint-driven demote or prefetch copies `block_bytes` per
//! block, blocks fetched from the shared pool land in their device slots, computed blocks go out
//! to it, and every loaded block is checked against what was computed.
//!
//! Built with the `cuda` feature on a machine with a GPU, G1 is a slab of device memory and G2
//! pinned host memory (kvbm's `device_store` and `host_store`), so those copies are DMA over
//! PCIe; elsewhere both are host memory, and the bytes and checks are the same.

use bytes::Bytes;
use std::collections::HashMap;
use std::path::Path;
use switchyard_core::engine::KvTransfer;
use switchyard_core::worker::Tier;
use switchyard_kv_pool::PutBlock;
use switchyard_kvbm::storage::{
    BlockCopy, BlockStore, DeviceBackend, DiskStore, HostBackend, HostSlab, copy_between,
    device_store, host_store,
};
use switchyard_kvbm::{BlockId, SequenceHash, StorageError};

/// The KV bytes of the device and host tiers.
pub(crate) struct TierSlabs {
    device: Box<dyn BlockStore>,
    host: Option<HostSlab>,
    /// G3: the kvbm disk store (checksummed records in one slot file).
    disk: Option<DiskStore>,
    /// Where G1's and G2's bytes are (device memory and pinned host memory, or why not).
    pub(crate) backends: (DeviceBackend, Option<HostBackend>),
    scratch: Vec<u8>,
    loaded: Vec<u8>,
    /// A run of copies between the same two tiers, moved as one batch.
    batch: Vec<BlockCopy>,
    /// Loaded blocks whose bytes differed from what was computed (never expected).
    pub(crate) corrupt_onboards: u64,
    /// Pool fetches the model asked for whose bytes were not staged (never expected).
    pub(crate) missing_fetches: u64,
}

impl std::fmt::Debug for TierSlabs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierSlabs")
            .field("backends", &self.backends)
            .field("corrupt_onboards", &self.corrupt_onboards)
            .field("missing_fetches", &self.missing_fetches)
            .finish_non_exhaustive()
    }
}

/// Where a step's transfers find the pool: the bytes fetched at arrival, by hash, and where
/// computed blocks go.
pub(crate) struct PoolSide<'a> {
    pub(crate) staged: &'a HashMap<u64, Bytes>,
    pub(crate) publish: &'a mut dyn FnMut(PutBlock),
}

// === impl TierSlabs ===

impl TierSlabs {
    /// Stores of `block_bytes` per block for `device_blocks` device blocks and, if given, a host
    /// tier of `host_blocks` and a disk tier of `disk.0` blocks under directory `disk.1`.
    pub(crate) fn new(
        device_blocks: usize,
        host_blocks: Option<usize>,
        disk: Option<(usize, &Path)>,
        block_bytes: u64,
    ) -> Result<Self, StorageError> {
        let block_bytes =
            usize::try_from(block_bytes).map_err(|_| StorageError::WrongBlockSize {
                expected: usize::MAX,
                got: 0,
            })?;
        let (device, device_backend) = device_store(device_blocks, block_bytes)?;
        let (host, host_backend) = match host_blocks {
            Some(blocks) => {
                let (slab, backend) = host_store(blocks, block_bytes)?;
                (Some(slab), Some(backend))
            }
            None => (None, None),
        };
        let host_backend_shown = host_backend
            .as_ref()
            .map_or("none".into(), ToString::to_string);
        tracing::info!(device = %device_backend, host = %host_backend_shown, "KV tier memory");
        Ok(Self {
            device,
            host,
            disk: disk
                .map(|(blocks, dir)| DiskStore::open(dir, blocks, block_bytes, None))
                .transpose()?,
            backends: (device_backend, host_backend),
            scratch: vec![0; block_bytes],
            loaded: vec![0; block_bytes],
            batch: Vec::new(),
            corrupt_onboards: 0,
            missing_fetches: 0,
        })
    }

    /// Where the device (`g1`) and host (`g2`) tiers' bytes are, for `/metrics`.
    pub(crate) fn memory(&self) -> Vec<(&'static str, &'static str)> {
        let device = match self.backends.0 {
            DeviceBackend::Cuda { .. } => "cuda",
            DeviceBackend::HostFallback { .. } => "host",
        };
        let host = self.backends.1.as_ref().map(|backend| match backend {
            HostBackend::Pinned { .. } => "pinned",
            HostBackend::Pageable { .. } => "pageable",
        });
        std::iter::once(("g1", device))
            .chain(host.map(|host| ("g2", host)))
            .collect()
    }

    /// Replay a step's movements, in order. Consecutive copies between the same two tiers go
    /// as one batch (one stream synchronisation on a GPU, not one per block).
    pub(crate) fn apply(&mut self, transfers: &[KvTransfer], mut pool: Option<PoolSide<'_>>) {
        let mut run: Option<(Tier, Tier)> = None;
        for transfer in transfers {
            if let KvTransfer::Copy {
                hash,
                from: (from_tier, from),
                to: (to_tier, to),
            } = *transfer
            {
                if run.is_some_and(|tiers| tiers != (from_tier, to_tier)) {
                    self.flush(run);
                }
                run = Some((from_tier, to_tier));
                self.batch.push(BlockCopy {
                    hash: SequenceHash(hash),
                    from: BlockId(from),
                    to: BlockId(to),
                });
                continue;
            }
            self.flush(run.take());
            if let Err(error) = self.apply_one(transfer, pool.as_mut()) {
                tracing::warn!(%error, ?transfer, "KV block transfer failed");
            }
        }
        self.flush(run);
    }

    /// Move the pending batch of copies from one tier to the other.
    fn flush(&mut self, tiers: Option<(Tier, Tier)>) {
        let Some((from, to)) = tiers else { return };
        let batch = std::mem::take(&mut self.batch);
        let results = match self.stores(from, to) {
            Ok(Some((source, dest))) => copy_between(source, dest, &batch),
            // The model moves nothing else.
            Ok(None) => Vec::new(),
            Err(error) => {
                tracing::warn!(%error, blocks = batch.len(), ?from, ?to, "KV block copies failed");
                Vec::new()
            }
        };
        for (copy, result) in batch.iter().zip(results) {
            let loaded = result.and_then(|()| match to {
                // What comes back must be what was computed.
                Tier::Device => self.check_loaded(copy.hash.0, copy.to.0),
                _ => Ok(()),
            });
            if let Err(error) = loaded {
                tracing::warn!(%error, ?copy, ?from, ?to, "KV block copy failed");
            }
        }
        self.batch = batch;
        self.batch.clear();
    }

    /// The stores copies from tier `from` to tier `to` read and write, if the model moves
    /// blocks that way.
    fn stores(
        &mut self,
        from: Tier,
        to: Tier,
    ) -> Result<Option<(&mut dyn BlockStore, &mut dyn BlockStore)>, StorageError> {
        let Self {
            device, host, disk, ..
        } = self;
        let device = device.as_mut();
        let host: Result<&mut dyn BlockStore, StorageError> = match host.as_mut() {
            Some(host) => Ok(host),
            None => Err(no_host()),
        };
        let disk: Result<&mut dyn BlockStore, StorageError> = match disk.as_mut() {
            Some(disk) => Ok(disk),
            None => Err(no_disk()),
        };
        Ok(Some(match (from, to) {
            (Tier::Device, Tier::Host) => (device, host?),
            (Tier::Host, Tier::Device) => (host?, device),
            (Tier::Host, Tier::Disk) => (host?, disk?),
            // A demote hint past a host tier that no longer holds the block.
            (Tier::Device, Tier::Disk) => (device, disk?),
            (Tier::Disk, Tier::Device) => (disk?, device),
            _ => return Ok(None),
        }))
    }

    /// The device block in `slot` must hold what computing `hash` wrote.
    fn check_loaded(&mut self, hash: u64, slot: u32) -> Result<(), StorageError> {
        fill(&mut self.scratch, hash);
        self.device
            .read_block(BlockId(slot), SequenceHash(hash), &mut self.loaded)?;
        if self.loaded != self.scratch {
            self.corrupt_onboards += 1;
            tracing::warn!(hash, "a loaded KV block differs from the computed one");
        }
        Ok(())
    }

    /// Everything but copies between tiers (those go in batches, see [`Self::apply`]).
    fn apply_one(
        &mut self,
        transfer: &KvTransfer,
        pool: Option<&mut PoolSide<'_>>,
    ) -> Result<(), StorageError> {
        match *transfer {
            KvTransfer::Computed { hash, slot } => {
                fill(&mut self.scratch, hash);
                self.device
                    .write_block(BlockId(slot), SequenceHash(hash), &self.scratch)
            }
            KvTransfer::Fetched { hash, slot } => {
                let Some(bytes) = pool.and_then(|p| p.staged.get(&hash)) else {
                    self.missing_fetches += 1;
                    tracing::warn!(hash, "the engine loaded a pool block that was not fetched");
                    return Ok(());
                };
                self.device
                    .write_block(BlockId(slot), SequenceHash(hash), bytes)?;
                // Another engine computed it: it must be what this one would have.
                self.check_loaded(hash, slot)
            }
            KvTransfer::Publish {
                hash,
                parent,
                from: (Tier::Device, slot),
                ref token_ids,
            } => {
                let Some(pool) = pool else { return Ok(()) };
                self.device
                    .read_block(BlockId(slot), SequenceHash(hash), &mut self.loaded)?;
                (pool.publish)(PutBlock {
                    hash,
                    parent,
                    token_ids: token_ids.clone(),
                    retention: None,
                    bytes: Bytes::copy_from_slice(&self.loaded),
                });
                Ok(())
            }
            // A publish from another tier has no pool to go to.
            KvTransfer::Copy { .. } | KvTransfer::Publish { .. } => Ok(()),
        }
    }

    /// The bytes of a device block that holds `hash`, to inspect.
    #[cfg(test)]
    pub(crate) fn device_block(&mut self, slot: u32, hash: u64) -> Vec<u8> {
        let mut out = vec![0; self.loaded.len()];
        match self
            .device
            .read_block(BlockId(slot), SequenceHash(hash), &mut out)
        {
            Ok(()) => out,
            Err(_) => Vec::new(),
        }
    }
}

fn no_disk() -> StorageError {
    StorageError::DeviceUnavailable {
        reason: "the engine has no disk tier".into(),
    }
}

fn no_host() -> StorageError {
    StorageError::DeviceUnavailable {
        reason: "the engine has no host tier".into(),
    }
}

/// The "KV" of block `hash`: its hash, repeated, so that a block in the wrong slot shows.
pub(crate) fn fill(out: &mut [u8], hash: u64) {
    let pattern = hash.to_le_bytes();
    for chunk in out.chunks_mut(8) {
        chunk.copy_from_slice(&pattern[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::engine::{
        DiskTierConfig, EngineConfig, EngineModel, EngineRequest, HostTierConfig,
    };
    use switchyard_core::kv_hints::HintTier;
    use switchyard_core::kv_hints::actions::{ActionType, BlockPayload, HintAction, Outcome};

    /// Stores for the tests: on the GPU check (`KVBM_REQUIRE_GPU`, scripts/gpu-check.sh) they
    /// must be device memory and pinned host memory, not the fallback.
    fn tier_slabs(host: usize, disk: Option<(usize, &Path)>) -> TierSlabs {
        let slabs = TierSlabs::new(8, Some(host), disk, 256).expect("slabs");
        if std::env::var_os("KVBM_REQUIRE_GPU").is_some() {
            assert_eq!(
                slabs.memory(),
                [("g1", "cuda"), ("g2", "pinned")],
                "{slabs:?}"
            );
        }
        slabs
    }

    /// Run one request to its end, replaying every step's transfers on `slabs`.
    fn run(
        model: &mut EngineModel,
        slabs: &mut TierSlabs,
        id: u64,
        prompt: Vec<u32>,
    ) -> Vec<KvTransfer> {
        model
            .add_request(EngineRequest {
                id,
                prompt,
                max_tokens: 1,
                pool_prefix_blocks: 0,
                pool_prefix_start: 0,
                max_offload_tokens: None,
            })
            .expect("accepted");
        let mut transfers = Vec::new();
        while model.has_work() {
            let step = model.step();
            slabs.apply(&step.transfers, None);
            transfers.extend(step.transfers);
        }
        transfers
    }

    #[test]
    fn a_block_evicted_from_the_device_comes_back_with_its_bytes() {
        let host = HostTierConfig {
            num_blocks: 16,
            block_bytes: 256,
            bandwidth_bytes_per_s: 1e9,
        };
        let mut model = EngineModel::new(EngineConfig {
            block_size: 4,
            num_blocks: 8,
            host_tier: Some(host.clone()),
            ..EngineConfig::default()
        })
        .expect("valid");
        let mut slabs = tier_slabs(16, None);
        let mut run = |model: &mut EngineModel, id, prompt| run(model, &mut slabs, id, prompt);
        let prompt: Vec<u32> = (0..17).collect();
        run(&mut model, 1, prompt.clone());
        run(&mut model, 2, (100..129).collect()); // takes the whole device
        let onboarded: Vec<(u64, u32)> = run(&mut model, 3, prompt)
            .into_iter()
            .filter_map(|t| match t {
                KvTransfer::Copy {
                    hash,
                    from: (Tier::Host, _),
                    to: (Tier::Device, slot),
                } => Some((hash, slot)),
                _ => None,
            })
            .collect();
        assert_eq!(onboarded.len(), 4);
        let mut expected = vec![0; 256];
        for (hash, slot) in onboarded {
            fill(&mut expected, hash);
            assert_eq!(slabs.device_block(slot, hash), expected);
        }
        assert_eq!(slabs.corrupt_onboards, 0);
        assert_eq!(model.stats().tiers.onboarded_bytes, 4 * 256);
    }

    fn hint(kind: ActionType, hashes: &[u64], tier: HintTier) -> HintAction {
        let payload = BlockPayload {
            block_hashes: hashes.to_vec(),
            tier: Some(tier),
            ttl_ms: None,
            session_id: None,
        };
        HintAction::new(kind.label(), kind, payload)
    }

    /// Apply `hints` and replay what they moved (the next step's transfers) on `slabs`.
    fn apply(
        model: &mut EngineModel,
        slabs: &mut TierSlabs,
        hints: &[HintAction],
    ) -> Vec<KvTransfer> {
        for outcome in model.apply_hints(hints) {
            assert_eq!(outcome.outcome, Outcome::Accepted, "{outcome:?}");
        }
        let mut transfers = Vec::new();
        while model.has_work() {
            let step = model.step();
            slabs.apply(&step.transfers, None);
            transfers.extend(step.transfers);
        }
        transfers
    }

    /// Each block copied into the device holds what computing it wrote.
    fn assert_loaded_bytes(slabs: &mut TierSlabs, transfers: &[KvTransfer], from: Tier) -> usize {
        let mut expected = vec![0; 256];
        let mut loaded = 0;
        for transfer in transfers {
            if let KvTransfer::Copy {
                hash,
                from: (tier, _),
                to: (Tier::Device, slot),
            } = *transfer
                && tier == from
            {
                fill(&mut expected, hash);
                assert_eq!(slabs.device_block(slot, hash), expected);
                loaded += 1;
            }
        }
        assert_eq!(slabs.corrupt_onboards, 0);
        loaded
    }

    #[test]
    fn a_demoted_then_prefetched_prefix_comes_back_with_its_bytes() {
        let mut model = EngineModel::new(EngineConfig {
            block_size: 4,
            num_blocks: 8,
            host_tier: Some(HostTierConfig {
                num_blocks: 8,
                block_bytes: 256,
                bandwidth_bytes_per_s: 1e9,
            }),
            ..EngineConfig::default()
        })
        .expect("valid");
        let mut slabs = tier_slabs(8, None);
        let prompt: Vec<u32> = (0..17).collect();
        let hashes = model.cache().hash_blocks(&prompt);
        run(&mut model, &mut slabs, 1, prompt.clone());
        apply(
            &mut model,
            &mut slabs,
            &[hint(ActionType::Demote, &hashes, HintTier::Host)],
        );
        // Other blocks overwrite the device slots the prefix had.
        run(&mut model, &mut slabs, 2, (100..113).collect());
        let moved = apply(
            &mut model,
            &mut slabs,
            &[hint(ActionType::Prefetch, &hashes, HintTier::Device)],
        );
        assert_eq!(assert_loaded_bytes(&mut slabs, &moved, Tier::Host), 4);
        // The next turn hits the device and loads nothing.
        let again = run(&mut model, &mut slabs, 3, prompt);
        assert!(!again.iter().any(|t| matches!(t, KvTransfer::Copy { .. })));
        assert_eq!(model.stats().prefix_hits, 16);
    }

    #[test]
    fn a_prefix_demoted_to_disk_past_the_host_comes_back_with_its_bytes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut model = EngineModel::new(EngineConfig {
            block_size: 4,
            num_blocks: 8,
            host_tier: Some(HostTierConfig {
                num_blocks: 8,
                block_bytes: 256,
                bandwidth_bytes_per_s: 1e9,
            }),
            disk_tier: Some(DiskTierConfig {
                num_blocks: 16,
                block_bytes: 256,
                bandwidth_bytes_per_s: 1e8,
            }),
            ..EngineConfig::default()
        })
        .expect("valid");
        let mut slabs = tier_slabs(8, Some((16, dir.path())));
        let prompt: Vec<u32> = (0..17).collect();
        let hashes = model.cache().hash_blocks(&prompt);
        run(&mut model, &mut slabs, 1, prompt);
        // Ephemeral drops the host copies: the demote writes the device's bytes to disk.
        let moved = apply(
            &mut model,
            &mut slabs,
            &[
                hint(ActionType::Ephemeral, &hashes, HintTier::Device),
                hint(ActionType::Demote, &hashes, HintTier::Disk),
            ],
        );
        let written = moved
            .iter()
            .filter(|t| {
                matches!(
                    t,
                    KvTransfer::Copy {
                        from: (Tier::Device, _),
                        to: (Tier::Disk, _),
                        ..
                    }
                )
            })
            .count();
        assert_eq!(written, 4);
        run(&mut model, &mut slabs, 2, (100..113).collect());
        let moved = apply(
            &mut model,
            &mut slabs,
            &[hint(ActionType::Prefetch, &hashes, HintTier::Device)],
        );
        assert_eq!(assert_loaded_bytes(&mut slabs, &moved, Tier::Disk), 4);
    }

    #[test]
    fn a_block_the_host_evicted_comes_back_from_the_disk_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = HostTierConfig {
            num_blocks: 8,
            block_bytes: 256,
            bandwidth_bytes_per_s: 1e9,
        };
        let disk = DiskTierConfig {
            num_blocks: 64,
            block_bytes: 256,
            bandwidth_bytes_per_s: 1e8,
        };
        let mut model = EngineModel::new(EngineConfig {
            block_size: 4,
            num_blocks: 8,
            host_tier: Some(host),
            disk_tier: Some(disk),
            ..EngineConfig::default()
        })
        .expect("valid");
        let mut slabs = tier_slabs(8, Some((64, dir.path())));
        let mut run = |model: &mut EngineModel, id, prompt| run(model, &mut slabs, id, prompt);
        let prompt: Vec<u32> = (0..17).collect();
        run(&mut model, 1, prompt.clone());
        // Two more prompts that each fill the device and, together, push the first one out of
        // the host tier onto disk.
        run(&mut model, 2, (100..129).collect());
        run(&mut model, 3, (200..229).collect());
        let loaded: Vec<(u64, u32)> = run(&mut model, 4, prompt)
            .into_iter()
            .filter_map(|t| match t {
                KvTransfer::Copy {
                    hash,
                    from: (Tier::Disk, _),
                    to: (Tier::Device, slot),
                } => Some((hash, slot)),
                _ => None,
            })
            .collect();
        assert!(!loaded.is_empty(), "the prefix came from disk");
        let mut expected = vec![0; 256];
        for (hash, slot) in loaded {
            fill(&mut expected, hash);
            assert_eq!(slabs.device_block(slot, hash), expected);
        }
        assert_eq!(slabs.corrupt_onboards, 0);
    }
}
