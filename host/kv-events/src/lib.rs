//! KV cache events (being written).
