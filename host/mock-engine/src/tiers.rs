//! Real bytes under the engine model's tiers: one `switchyard-kvbm` host slab per tier (G1 and
//! G2), and the step's [`KvTransfer`]s replayed on them in order, so every write-through and
//! onboard copies `block_bytes` per block, and a loaded block is checked against what was
//! computed.

use switchyard_core::engine::{HostTierConfig, KvTransfer};
use switchyard_core::worker::Tier;
use switchyard_kvbm::storage::{BlockStore, HostSlab};
use switchyard_kvbm::{BlockId, SequenceHash, StorageError};

/// The KV bytes of the device and host tiers.
#[derive(Debug)]
pub(crate) struct TierSlabs {
    device: HostSlab,
    host: HostSlab,
    scratch: Vec<u8>,
    /// Onboarded blocks whose bytes differed from what was computed (never expected).
    pub(crate) corrupt_onboards: u64,
}

// === impl TierSlabs ===

impl TierSlabs {
    /// Slabs for `device_blocks` device blocks and the host tier of `host`.
    pub(crate) fn new(device_blocks: usize, host: &HostTierConfig) -> Result<Self, StorageError> {
        let block_bytes =
            usize::try_from(host.block_bytes).map_err(|_| StorageError::WrongBlockSize {
                expected: usize::MAX,
                got: 0,
            })?;
        Ok(Self {
            device: HostSlab::new(device_blocks, block_bytes)?,
            host: HostSlab::new(host.num_blocks, block_bytes)?,
            scratch: vec![0; block_bytes],
            corrupt_onboards: 0,
        })
    }

    /// Replay a step's movements, in order.
    pub(crate) fn apply(&mut self, transfers: &[KvTransfer]) {
        for transfer in transfers {
            if let Err(error) = self.apply_one(transfer) {
                tracing::warn!(%error, ?transfer, "KV block transfer failed");
            }
        }
    }

    fn apply_one(&mut self, transfer: &KvTransfer) -> Result<(), StorageError> {
        match *transfer {
            KvTransfer::Computed { hash, slot } => {
                fill(&mut self.scratch, hash);
                self.device
                    .write_block(BlockId(slot), SequenceHash(hash), &self.scratch)
            }
            KvTransfer::Copy {
                hash: _,
                from: (Tier::Device, from),
                to: (Tier::Host, to),
            } => self
                .host
                .copy_from(&self.device, &[(BlockId(from), BlockId(to))]),
            KvTransfer::Copy {
                hash,
                from: (Tier::Host, from),
                to: (Tier::Device, to),
            } => {
                self.device
                    .copy_from(&self.host, &[(BlockId(from), BlockId(to))])?;
                // What comes back must be what was computed.
                fill(&mut self.scratch, hash);
                if self.device.block(BlockId(to))? != self.scratch.as_slice() {
                    self.corrupt_onboards += 1;
                    tracing::warn!(hash, "an onboarded KV block differs from the computed one");
                }
                Ok(())
            }
            // The shared pool's fetches and publishes are not wired here yet (the engine runs
            // without a pool, so none come).
            KvTransfer::Copy { .. } | KvTransfer::Fetched { .. } | KvTransfer::Publish { .. } => {
                Ok(())
            }
        }
    }

    /// The bytes of a device block, to inspect.
    #[cfg(test)]
    pub(crate) fn device_block(&self, slot: u32) -> &[u8] {
        self.device.block(BlockId(slot)).unwrap_or_default()
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
    use switchyard_core::engine::{EngineConfig, EngineModel, EngineRequest};

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
        let mut slabs = TierSlabs::new(8, &host).expect("slabs");
        let mut run = |model: &mut EngineModel, id: u64, prompt: Vec<u32>| {
            model
                .add_request(EngineRequest {
                    id,
                    prompt,
                    max_tokens: 1,
                    pool_prefix_blocks: 0,
                })
                .expect("accepted");
            let mut transfers = Vec::new();
            while model.has_work() {
                let step = model.step();
                slabs.apply(&step.transfers);
                transfers.extend(step.transfers);
            }
            transfers
        };
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
            assert_eq!(slabs.device_block(slot), expected.as_slice());
        }
        assert_eq!(slabs.corrupt_onboards, 0);
        assert_eq!(model.stats().tiers.onboarded_bytes, 4 * 256);
    }
}
