//! End-to-end tests: the real `switchyard` binary, mock engines as separate processes, and a real
//! llama.cpp engine. Everything listens on 127.0.0.1 and stops by itself.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

mod bad_input;
mod embedded;
mod envoy;
mod epp;
mod faults;
mod fleet;
mod frontends;
mod harnesses;
mod hints;
mod kv_pool;
mod lifecycle;
mod llama;
mod llama_slots;
mod nats;
mod policy_cli;
mod policy_reload;
mod readme;
mod routing;
mod scheduling;
mod support;
mod tiers;
mod tls;
mod trace;
