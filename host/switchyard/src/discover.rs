//! `[discovery.kubernetes]` for `switchyard serve`: the Service's ready endpoints become the
//! fleet's members of source `kubernetes`.

use switchyard_gateway::GatewayHandle;
use switchyard_gateway::config::WorkerConfig;
use switchyard_gateway::discovery::KubernetesDiscoveryConfig;
use switchyard_gateway::fleet::Source;
use tokio_util::sync::CancellationToken;

/// Discovery's settings and its client, made before the gateway starts so that a missing
/// Kubernetes configuration stops `serve` at once.
pub(crate) struct Discovery {
    config: KubernetesDiscoveryConfig,
    client: switchyard_discovery::Client,
}

impl Discovery {
    /// A client for `config`, if there is one to watch.
    pub(crate) async fn connect(
        config: Option<&KubernetesDiscoveryConfig>,
    ) -> anyhow::Result<Option<Discovery>> {
        let Some(config) = config else {
            return Ok(None);
        };
        let client = switchyard_discovery::connect().await?;
        Ok(Some(Discovery {
            config: config.clone(),
            client,
        }))
    }

    /// Keep `gateway`'s `kubernetes` members equal to the Service's endpoints until `stop`.
    pub(crate) async fn run(self, gateway: &GatewayHandle, stop: CancellationToken) {
        let apply = |workers: &[WorkerConfig]| apply(gateway, workers);
        switchyard_discovery::watch(self.client, self.config, apply, stop).await;
    }
}

/// Make `workers` the `kubernetes` members. An address already listed by the file or added
/// through the admin API stays theirs and is skipped (it joins at the next change once they
/// let it go), so that one such address cannot hold back every other change.
fn apply(gateway: &GatewayHandle, workers: &[WorkerConfig]) {
    let (ours, taken): (Vec<WorkerConfig>, Vec<WorkerConfig>) =
        workers.iter().cloned().partition(|w| {
            matches!(
                gateway.member_source(&w.url),
                None | Some(Source::Kubernetes)
            )
        });
    for worker in &taken {
        let owner = gateway.member_source(&worker.url).map(Source::as_str);
        tracing::warn!(url = %worker.url, owner, "discovered worker skipped: another source has it");
    }
    match gateway.reconcile_workers(Source::Kubernetes, &ours) {
        Ok(changed) => tracing::info!(workers = ours.len(), changed, "discovered workers applied"),
        Err(error) => {
            tracing::error!(%error, "discovered workers not applied; the fleet stays as it was")
        }
    }
}
