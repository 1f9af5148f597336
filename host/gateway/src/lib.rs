//! The Switchyard gateway: OpenAI-compatible frontends in front of inference engines, routed by
//! the pure router core over a KV index fed by the engines' own ZMQ events.
//!
//! Layers, in request order: [`agent`] (session headers), [`proxy`] (body -> tokens -> decision
//! -> engine -> response), [`trace`] (one line per finished request), [`server`] (state, routes,
//! background tasks), [`upstream`] (engines and health), [`fleet`] (engines joining and leaving,
//! per source: the file, the admin API, [`discovery`]), [`index`] (the shared index, lock-free
//! for readers), [`events`] (ingestion metrics), [`policies`] (Wasm routing policies, hot
//! reload) with the token-protected admin API (`/admin/policies`, `/admin/workers`),
//! [`metrics`], [`error`] (the one mapping of failures to HTTP responses), [`config`] and
//! [`reload`] (a new configuration put in force without a restart where it can be).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use switchyard_gateway::config::{Config, RawConfig};
//! let raw: RawConfig = toml::from_str("[[workers]]\nurl = \"http://127.0.0.1:8101\"\n")?;
//! let config = Config::try_from(raw)?;
//! let tokenizer = switchyard_tokenizer::ModelTokenizer::embedded_default()?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let gateway = switchyard_gateway::start(config, tokenizer, shutdown).await?;
//! println!("listening on {}", gateway.addr());
//! gateway.wait().await;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod admin;
mod admission;
pub mod agent;
mod cluster;
pub mod config;
pub mod discovery;
pub mod error;
pub mod events;
pub mod fleet;
mod hints;
pub mod index;
mod key_tokens;
pub mod metrics;
pub mod policies;
pub mod proxy;
mod queue;
pub mod reload;
mod secrets;
pub mod server;
pub mod sse;
pub mod trace;
pub mod upstream;

pub use reload::Reloaded;
pub use server::{GatewayHandle, StartError, start};
