//! Conversions of the types every world shares.

use super::router_world::switchyard::policy::{host, types as wit};
use crate::types::{
    CostOverrides, CostWeights, LogLevel, PolicyMetadata, Request, SHARED_CREDIT_EXTENSION,
    find_extension,
};

/// Sends `message` to the host's log.
pub(crate) fn log(level: LogLevel, message: &str) {
    let level = match level {
        LogLevel::Trace => wit::LogLevel::Trace,
        LogLevel::Debug => wit::LogLevel::Debug,
        LogLevel::Info => wit::LogLevel::Info,
        LogLevel::Warn => wit::LogLevel::Warn,
        LogLevel::Error => wit::LogLevel::Error,
    };
    host::log(level, message);
}

/// The WIT metadata of `metadata`, stamped with the world and the WIT version this SDK binds.
pub(crate) fn metadata(metadata: PolicyMetadata, world: &str) -> wit::PolicyMetadata {
    wit::PolicyMetadata {
        name: metadata.name,
        version: metadata.version,
        world_name: world.to_owned(),
        wit_version: crate::WIT_VERSION.to_owned(),
        description: metadata.description,
        extensions: metadata.extensions,
    }
}

/// The plain request of a WIT request (moves, no copies of the strings).
pub(crate) fn request(r: wit::Request) -> Request {
    Request {
        model: r.model,
        tokens: r.tokens,
        blocks: r.blocks,
        block_size: r.block_size,
        weights: CostWeights {
            device_credit: r.weights.device_credit,
            host_credit: r.weights.host_credit,
            disk_credit: r.weights.disk_credit,
            shared_credit: extension_f64(&r.extensions, SHARED_CREDIT_EXTENSION).unwrap_or(0.0),
            prefill_load_scale: r.weights.prefill_load_scale,
        },
        overrides: CostOverrides {
            device_credit: r.overrides.device_credit,
            host_credit: r.overrides.host_credit,
            disk_credit: r.overrides.disk_credit,
            prefill_load_scale: r.overrides.prefill_load_scale,
        },
        session_id: r.session_id,
        parent_session_id: r.parent_session_id,
        priority: r.priority,
        osl: r.osl,
        extensions: r.extensions,
    }
}

/// A numeric request extension (a trial signal, wit/README.md rule 3), if present and finite.
fn extension_f64(extensions: &[(String, String)], key: &str) -> Option<f64> {
    find_extension(extensions, key)
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite())
}
