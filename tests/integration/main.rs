//! End-to-end tests: the real `switchyard` binary, mock engines as separate processes, and a real
//! llama.cpp engine. Everything listens on 127.0.0.1 and stops by itself.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod bad_input;
mod embedded;
mod envoy;
mod frontends;
mod harnesses;
mod kv_pool;
mod lifecycle;
mod llama;
mod nats;
mod policy_reload;
mod readme;
mod routing;
mod scheduling;
mod support;
mod tiers;
mod trace;
