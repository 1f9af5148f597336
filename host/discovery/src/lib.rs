//! Worker discovery for the Switchyard gateway: the engines behind a Kubernetes Service, from its
//! EndpointSlices (`discovery.k8s.io/v1`, label `kubernetes.io/service-name=<service>`), as
//! `[[workers]]` entries built from `[discovery.kubernetes]`. The gateway makes them the members
//! of source `kubernetes`; a worker that appears joins cold and subscribes to its KV events, one
//! that goes (slice deleted, endpoint unready or terminating) leaves.
//!
//! This crate alone links `kube` and `k8s-openapi`; the gateway holds the plain settings. The
//! watch relists by itself after an error: until the relist is complete the last set found
//! stays, so an API server that is briefly unreachable never empties the fleet.
//!
//! ```no_run
//! # async fn run(config: switchyard_gateway::discovery::KubernetesDiscoveryConfig) -> Result<(), switchyard_discovery::DiscoveryError> {
//! let client = switchyard_discovery::connect().await?;
//! let stop = tokio_util::sync::CancellationToken::new();
//! switchyard_discovery::watch(client, config, |workers| println!("{} workers", workers.len()), stop).await;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod slices;

pub use slices::{desired_workers, is_serving};

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use switchyard_gateway::config::WorkerConfig;
use switchyard_gateway::discovery::KubernetesDiscoveryConfig;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use kube::Client;

/// Why discovery could not start.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// No Kubernetes client configuration: neither a kubeconfig (`KUBECONFIG`, `~/.kube/config`)
    /// nor the in-cluster service account.
    #[error("no Kubernetes client configuration (kubeconfig or in-cluster service account): {0}")]
    Client(#[from] kube::Error),
}

/// A client from the kubeconfig, else the pod's service account.
pub async fn connect() -> Result<Client, DiscoveryError> {
    Ok(Client::try_default().await?)
}

/// Watch the Service's EndpointSlices until `stop`, calling `apply` with the whole set of
/// workers each time it changes (at most once per `config.debounce`, and only once the first
/// list is complete). Watch errors are logged and retried with backoff; they never call
/// `apply`.
pub async fn watch(
    client: Client,
    config: KubernetesDiscoveryConfig,
    mut apply: impl FnMut(&[WorkerConfig]),
    stop: CancellationToken,
) {
    let namespace = config
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
    let selector = config.label_selector();
    let events =
        watcher::watcher(api, watcher::Config::default().labels(&selector)).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut store = SliceStore::default();
    let mut due: Option<Instant> = None;
    let mut applied: Option<Vec<WorkerConfig>> = None;
    tracing::info!(%namespace, %selector, "watching EndpointSlices");
    loop {
        let debounced = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = debounced => {
                due = None;
                let workers = desired_workers(&config, store.slices());
                if applied.as_ref() != Some(&workers) {
                    tracing::info!(workers = workers.len(), "discovered workers changed");
                    apply(&workers);
                    applied = Some(workers);
                }
            }
            event = events.next() => match event {
                // The watcher retries for ever; it ends only with the client.
                None => return,
                Some(Err(error)) => {
                    tracing::warn!(%error, "EndpointSlice watch failed; keeping the workers found so far and retrying");
                }
                Some(Ok(event)) => {
                    if store.apply(event) {
                        // The first change of a burst opens the window; later ones join it.
                        due.get_or_insert_with(|| Instant::now() + config.debounce);
                    }
                }
            },
        }
    }
}

/// The Service's slices by name, as the watch reports them. A relist is gathered aside and
/// replaces the slices only once complete, so a watch that fails halfway changes nothing.
#[derive(Debug, Default)]
struct SliceStore {
    slices: BTreeMap<String, EndpointSlice>,
    relisting: Option<BTreeMap<String, EndpointSlice>>,
    listed: bool,
}

impl SliceStore {
    /// Take in one event; returns whether the slices in force changed (or were listed first).
    fn apply(&mut self, event: Event<EndpointSlice>) -> bool {
        match event {
            Event::Init => {
                self.relisting = Some(BTreeMap::new());
                false
            }
            Event::InitApply(slice) => {
                let relisting = self.relisting.get_or_insert_with(BTreeMap::new);
                relisting.insert(slice.name_any(), slice);
                false
            }
            Event::InitDone => {
                self.slices = self.relisting.take().unwrap_or_default();
                self.listed = true;
                true
            }
            Event::Apply(slice) => {
                self.slices.insert(slice.name_any(), slice);
                self.listed
            }
            Event::Delete(slice) => {
                self.slices.remove(&slice.name_any());
                self.listed
            }
        }
    }

    fn slices(&self) -> impl Iterator<Item = &EndpointSlice> {
        self.slices.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slice(name: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            ..Default::default()
        }
    }

    fn names(store: &SliceStore) -> Vec<String> {
        store.slices.keys().cloned().collect()
    }

    #[test]
    fn a_relist_replaces_the_slices_only_once_complete() {
        let mut store = SliceStore::default();
        assert!(!store.apply(Event::Init));
        assert!(!store.apply(Event::InitApply(slice("a"))));
        assert!(
            names(&store).is_empty(),
            "nothing before the list is complete"
        );
        assert!(store.apply(Event::InitDone));
        assert!(store.apply(Event::Apply(slice("b"))));
        assert_eq!(names(&store), ["a", "b"]);
        // A watch error, then a relist that fails halfway: the slices stay as they were.
        assert!(!store.apply(Event::Init));
        assert!(!store.apply(Event::InitApply(slice("b"))));
        assert_eq!(names(&store), ["a", "b"]);
        // The next relist completes: "a" was deleted meanwhile.
        assert!(!store.apply(Event::Init));
        assert!(!store.apply(Event::InitApply(slice("b"))));
        assert!(store.apply(Event::InitDone));
        assert_eq!(names(&store), ["b"]);
        assert!(store.apply(Event::Delete(slice("b"))));
        assert!(names(&store).is_empty());
    }

    #[test]
    fn changes_before_the_first_list_do_not_count() {
        let mut store = SliceStore::default();
        assert!(!store.apply(Event::Apply(slice("a"))));
        assert!(!store.apply(Event::Delete(slice("a"))));
    }
}
