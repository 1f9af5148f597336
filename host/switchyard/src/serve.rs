//! `switchyard serve`: the gateway (or the embedded default) for the life of the process: a
//! graceful stop on SIGTERM or Ctrl-C, its configuration file reloaded on SIGHUP or when the
//! file changes, and its Kubernetes discovery (`[discovery.kubernetes]`) watched.

use crate::discover::Discovery;
use crate::embedded;
use anyhow::Context;
use notify::RecursiveMode;
use notify_debouncer_full::new_debouncer;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use switchyard_gateway::GatewayHandle;
use switchyard_gateway::config::{Config, RawConfig, WorkerConfig};
use switchyard_tokenizer::ModelTokenizer;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// How the command line shapes a configuration file: the listener overrides, and the embedded
/// engines' workers when the file names none.
struct Overrides {
    host: Option<String>,
    port: Option<u16>,
    embedded_workers: Option<Vec<WorkerConfig>>,
}

impl Overrides {
    fn apply(&self, raw: &mut RawConfig) {
        raw.server.host = self
            .host
            .clone()
            .unwrap_or(std::mem::take(&mut raw.server.host));
        raw.server.port = self.port.unwrap_or(raw.server.port);
        if let Some(workers) = &self.embedded_workers
            && raw.workers.is_empty()
        {
            raw.workers.clone_from(workers);
            raw.policies.get_or_insert_with(embedded::policies);
            embedded::model(&mut raw.model);
        }
    }
}

/// Flags of `switchyard serve` (and of `switchyard epp`, which adds its gRPC listener).
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Configuration file (TOML); see examples/.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// HTTP listen address (overrides the file).
    #[arg(long)]
    host: Option<String>,
    /// HTTP listen port (overrides the file).
    #[arg(long)]
    port: Option<u16>,
    /// Mock engines the embedded default starts.
    #[arg(long, default_value_t = 4)]
    mock_engines: u32,
}

/// Serve until `shutdown`; with `epp`, also answer Envoy's ext_proc there (endpoint-picker mode).
pub(crate) async fn run(
    args: ServeArgs,
    epp: Option<SocketAddr>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let ServeArgs {
        config: path,
        host,
        port,
        mock_engines,
    } = args;
    let mut raw = match &path {
        Some(path) => RawConfig::from_file(path)?,
        None => RawConfig::default(),
    };
    let tokenizer = match &raw.model.path {
        Some(dir) => ModelTokenizer::from_dir(dir)
            .with_context(|| format!("loading the tokenizer from {}", dir.display()))?,
        None => ModelTokenizer::embedded_agent_model()?,
    };
    // Discovery alone is a fleet too (it may be empty at first).
    let embedded = raw.workers.is_empty() && raw.discovery.is_none();
    // Embedded engines outlive the gateway's drain: its last requests still run on them.
    let engines_stop = CancellationToken::new();
    let mut overrides = Overrides {
        host,
        port,
        embedded_workers: None,
    };
    let _engines = if embedded {
        let engines = embedded::start(mock_engines, &tokenizer, engines_stop.clone()).await?;
        overrides.embedded_workers = Some(engines.iter().map(embedded::worker_config).collect());
        engines
    } else {
        Vec::new()
    };
    overrides.apply(&mut raw);
    let config = Config::try_from(raw)?;
    let kubernetes = config
        .discovery
        .as_ref()
        .and_then(|d| d.kubernetes.as_ref());
    let discovery = Discovery::connect(kubernetes).await?;
    let gateway = switchyard_gateway::start(config, tokenizer.clone(), shutdown.clone()).await?;
    let watch = path.as_deref().map(ConfigWatch::start).transpose()?;
    let picker = match epp {
        Some(addr) => {
            let listener = switchyard_epp::bind(addr).await?;
            let grpc = listener.local_addr()?;
            let serving = switchyard_epp::serve(listener, gateway.picker(), shutdown.clone());
            tokio::spawn(async move {
                if let Err(e) = serving.await {
                    tracing::error!(error = %e, "endpoint picker stopped");
                }
            });
            println!("switchyard: endpoint picker (ext_proc) on grpc://{grpc}");
            Some(grpc)
        }
        None => None,
    };
    let url = gateway.url();
    if embedded {
        println!("switchyard: embedded default, {mock_engines} mock engines behind {url}");
    } else {
        println!("switchyard: gateway on {url}");
    }
    let model = gateway.model_name();
    if picker.is_none() {
        println!(
            "try:\n  curl {url}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"stream\": true}}'"
        );
    }
    // Reloads and discovery run until shutdown; then the drain finishes.
    let reloads = async {
        match (&path, watch) {
            (Some(path), Some(watch)) => {
                reload_on_change(watch, path, &overrides, &gateway, &shutdown).await;
            }
            _ => shutdown.cancelled().await,
        }
    };
    let discovered = async {
        match discovery {
            Some(discovery) => discovery.run(&gateway, shutdown.clone()).await,
            None => shutdown.cancelled().await,
        }
    };
    tokio::select! {
        () = gateway.wait() => {}
        _ = async { tokio::join!(reloads, discovered) } => gateway.wait().await,
    }
    engines_stop.cancel();
    Ok(())
}

/// What asks for a reload: the file changing, or SIGHUP. Set up before the gateway says it is
/// listening, so that no change made after that is missed.
struct ConfigWatch {
    changed: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
    hangup: tokio::signal::unix::Signal,
    _watcher: notify_debouncer_full::Debouncer<
        notify::RecommendedWatcher,
        notify_debouncer_full::RecommendedCache,
    >,
}

impl ConfigWatch {
    fn start(path: &Path) -> anyhow::Result<ConfigWatch> {
        let (tx, changed) = tokio::sync::mpsc::unbounded_channel();
        let name = path.file_name().map(|n| n.to_owned());
        // Editors save by writing in steps or by renaming a new file over the old one, and a
        // Kubernetes ConfigMap volume swaps its `..data` symlink: watch the directory,
        // debounced, and keep the events that touch this file or that link.
        let mut watcher = new_debouncer(
            Duration::from_millis(200),
            None,
            move |result: notify_debouncer_full::DebounceEventResult| {
                let ours = result.is_ok_and(|events| {
                    events.iter().any(|e| {
                        (e.kind.is_create() || e.kind.is_modify())
                            && e.paths.iter().any(|p| {
                                let file = p.file_name();
                                file == name.as_deref() || file == Some("..data".as_ref())
                            })
                    })
                });
                if ours {
                    let _ = tx.send("file changed");
                }
            },
        )?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .with_context(|| format!("watching {}", dir.display()))?;
        Ok(ConfigWatch {
            changed,
            hangup: signal(SignalKind::hangup())?,
            _watcher: watcher,
        })
    }
}

/// Reload `path` into `gateway` whenever `watch` says so, until shutdown.
async fn reload_on_change(
    mut watch: ConfigWatch,
    path: &Path,
    overrides: &Overrides,
    gateway: &GatewayHandle,
    shutdown: &CancellationToken,
) {
    loop {
        let why = tokio::select! {
            () = shutdown.cancelled() => return,
            Some(why) = watch.changed.recv() => why,
            Some(()) = watch.hangup.recv() => "SIGHUP",
        };
        let config = RawConfig::from_file(path).and_then(|mut raw| {
            overrides.apply(&mut raw);
            Config::try_from(raw)
        });
        match gateway.reload(config) {
            Ok(done) => {
                tracing::info!(why, applied = ?done.applied, "configuration reloaded");
                if !done.need_restart.is_empty() {
                    tracing::warn!(settings = ?done.need_restart, "changed, but in force only after a restart");
                }
            }
            Err(error) => {
                // One log line: parse errors come as a multi-line snippet of the file.
                let error = error
                    .to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                tracing::error!(
                    why,
                    error,
                    "configuration not reloaded; the one in force stays"
                );
            }
        }
    }
}

/// SIGTERM (Kubernetes, systemd) or Ctrl-C starts a graceful stop; a second one ends the process
/// at once.
pub(crate) async fn stop_on_signals(shutdown: CancellationToken) {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot listen for signals; stop the process by killing it");
        return;
    };
    for first in [true, false] {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        if first {
            tracing::info!("stopping: draining the requests in flight (signal again to quit now)");
            shutdown.cancel();
        }
    }
    std::process::exit(130);
}
