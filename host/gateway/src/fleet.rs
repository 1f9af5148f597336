//! The engines behind the gateway as they come and go. A worker that joins starts cold (healthy,
//! nothing indexed) and subscribes to its KV events; one that leaves stops its subscriptions, is
//! retired in the router (requests already on it finish; none go there any more) and has its
//! index entries dropped once its event streams are down. Ids are never reused, so a decision
//! taken just before a change can never reach a different engine.
//!
//! Members come from three sources ([`Source`]): the configuration file, the admin API and
//! Kubernetes discovery. Each source reconciles only its own members, and a URL belongs to one
//! source at a time, so that a reload of the file cannot remove a discovered worker.

use crate::config::{ConfigError, HintDelivery, WorkerConfig, rank_endpoint};
use crate::metrics::{Metrics, worker_label};
use crate::upstream::Upstream;
use arc_swap::ArcSwap;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use switchyard_core::index::IndexOp;
use switchyard_core::router::Router;
use switchyard_core::worker::{Rank, WorkerId};
use switchyard_kv_events::ingest::{EngineNames, WireFormat};
use switchyard_kv_events::subscriber::{SubscriberConfig, SubscriberStats, run_subscriber};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Where a member of the fleet came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The configuration file's `[[workers]]`.
    Config,
    /// `POST /admin/workers`.
    Admin,
    /// The EndpointSlices of a Kubernetes Service (`[discovery.kubernetes]`).
    Kubernetes,
}

impl Source {
    /// Its name in the admin API and in errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::Admin => "admin",
            Self::Kubernetes => "kubernetes",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the fleet refused a change; when it does, nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A worker entry does not validate.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The URL is a member from another source.
    #[error("worker {url} belongs to source `{owner}`; `{claimant}` cannot also list it")]
    Owned {
        /// The worker's URL.
        url: String,
        /// The source it belongs to.
        owner: Source,
        /// The source that tried to list it.
        claimant: Source,
    },
    /// `POST /admin/workers` for a URL that is already a member.
    #[error("worker {url} is already a member (source `{owner}`)")]
    Exists {
        /// The worker's URL.
        url: String,
        /// The source it belongs to.
        owner: Source,
    },
    /// No member has this URL.
    #[error("no worker {url}")]
    Unknown {
        /// The URL asked for.
        url: String,
    },
    /// One source listed a URL twice.
    #[error("worker {url} is listed twice")]
    Duplicate {
        /// The worker's URL.
        url: String,
    },
}

impl From<FleetError> for ConfigError {
    /// A reload or a start refused by the fleet is a configuration the gateway cannot run.
    fn from(error: FleetError) -> Self {
        match error {
            FleetError::Invalid(e) => e,
            other => ConfigError::Invalid(other.to_string()),
        }
    }
}

/// One URL, however it is written (a trailing slash does not make another worker).
fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// One engine server in the fleet.
#[derive(Debug)]
pub struct Member {
    /// Where it came from.
    pub source: Source,
    /// How to reach it.
    pub upstream: Upstream,
    /// Its configuration entry.
    pub config: WorkerConfig,
    /// Its ranks' event-stream statistics.
    pub(crate) events: Vec<(Rank, Arc<SubscriberStats>)>,
    /// Its ranks' names of their blocks (ours -> the engine's), when it takes KV hints.
    names: Vec<(Rank, Arc<EngineNames>)>,
    /// Stops its event subscriptions.
    stop: CancellationToken,
    /// Its event subscriptions, so that leaving can wait for them to end.
    subscriptions: TaskTracker,
    /// Its last `/health` probe passed (a member joins healthy).
    probe_passed: AtomicBool,
    /// Drained by the admin API: it gets no new requests while its probes still pass, so its
    /// sessions move elsewhere (taking their KV along where the engine can hand it over) and it
    /// can be stopped without failing any.
    draining: AtomicBool,
}

impl Member {
    /// Whether its last health probe passed.
    pub fn probe_passed(&self) -> bool {
        self.probe_passed.load(Ordering::Relaxed)
    }

    /// Whether it is drained.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Whether it may take new requests: its probe passed and it is not drained.
    pub(crate) fn routable(&self) -> bool {
        self.probe_passed() && !self.draining()
    }

    /// Record a probe's answer.
    pub(crate) fn set_probe_passed(&self, passed: bool) {
        self.probe_passed.store(passed, Ordering::Relaxed);
    }

    fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::Relaxed);
    }

    /// How `rank` names its blocks, when the member takes KV hints and publishes events.
    pub(crate) fn engine_names(&self, rank: Rank) -> Option<&EngineNames> {
        self.names
            .iter()
            .find(|(r, _)| *r == rank)
            .map(|(_, n)| &**n)
    }
}

/// The fleet: members by worker id (a slot stays empty once its worker left).
#[derive(Debug)]
pub struct Fleet {
    members: ArcSwap<Vec<Option<Arc<Member>>>>,
    /// Joins and leaves, one at a time.
    changing: Mutex<()>,
    ops: mpsc::Sender<IndexOp>,
    tasks: TaskTracker,
    background: CancellationToken,
}

/// A worker about to join: checked, not yet started.
struct Joining {
    config: WorkerConfig,
    subscribers: Vec<SubscriberConfig>,
}

impl Fleet {
    /// An empty fleet whose event subscriptions feed `ops`, run on `tasks` and stop with
    /// `background`.
    pub(crate) fn new(
        ops: mpsc::Sender<IndexOp>,
        tasks: TaskTracker,
        background: CancellationToken,
    ) -> Fleet {
        Fleet {
            members: ArcSwap::from_pointee(Vec::new()),
            changing: Mutex::new(()),
            ops,
            tasks,
            background,
        }
    }

    /// The member with this id, unless it left.
    pub fn get(&self, id: WorkerId) -> Option<Arc<Member>> {
        self.members.load().get(id.0 as usize)?.clone()
    }

    /// The members now in the fleet.
    pub fn members(&self) -> Vec<Arc<Member>> {
        self.members.load().iter().flatten().cloned().collect()
    }

    /// The member at `url`, if one is.
    pub fn find(&self, url: &str) -> Option<Arc<Member>> {
        self.members
            .load()
            .iter()
            .flatten()
            .find(|m| same_url(&m.config.url, url))
            .cloned()
    }

    /// Check `config` as a new member would need it (its event endpoints).
    fn check(config: &WorkerConfig) -> Result<Joining, ConfigError> {
        let mut subscribers = Vec::new();
        if let Some(base) = &config.kv_events {
            for dp_rank in 0..config.dp_size {
                subscribers.push(SubscriberConfig {
                    rank: Rank {
                        worker: WorkerId(u32::MAX),
                        dp_rank,
                    },
                    block_size: config.block_size,
                    endpoint: rank_endpoint(base, dp_rank)?,
                    replay_endpoint: config
                        .replay
                        .as_deref()
                        .map(|r| rank_endpoint(r, dp_rank))
                        .transpose()?,
                    bind: false,
                    topic: String::new(),
                    format: WireFormat::Vllm,
                    engine_names: None,
                });
            }
        }
        Ok(Joining {
            config: config.clone(),
            subscribers,
        })
    }

    /// Change `source`'s members to `wanted`: its entries not in it leave, new entries join (an
    /// entry is a whole worker configuration: a changed one leaves and joins anew). Members of
    /// other sources stay. Nothing changes if a new entry is invalid, a URL is listed twice, or
    /// a URL belongs to another source. Returns whether anything changed.
    pub(crate) fn reconcile(
        &self,
        source: Source,
        wanted: &[WorkerConfig],
        router: &Mutex<Router>,
        metrics: &Metrics,
    ) -> Result<bool, FleetError> {
        let changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        self.change(&changing, source, wanted, router, metrics)
    }

    /// Add `worker` to `source`'s members (it joins cold); refused if its URL is a member.
    pub(crate) fn add(
        &self,
        source: Source,
        worker: WorkerConfig,
        router: &Mutex<Router>,
        metrics: &Metrics,
    ) -> Result<Arc<Member>, FleetError> {
        let changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(member) = self.find(&worker.url) {
            return Err(FleetError::Exists {
                url: member.upstream.base_url.clone(),
                owner: member.source,
            });
        }
        let url = worker.url.clone();
        let mut wanted = self.configs_of(source);
        wanted.push(worker);
        self.change(&changing, source, &wanted, router, metrics)?;
        self.find(&url).ok_or(FleetError::Unknown { url })
    }

    /// Remove the member at `url`, which must be one of `source`'s (it leaves).
    pub(crate) fn remove(
        &self,
        source: Source,
        url: &str,
        router: &Mutex<Router>,
        metrics: &Metrics,
    ) -> Result<Arc<Member>, FleetError> {
        let changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let member = self.find(url).ok_or_else(|| FleetError::Unknown {
            url: url.trim_end_matches('/').into(),
        })?;
        if member.source != source {
            return Err(FleetError::Owned {
                url: member.upstream.base_url.clone(),
                owner: member.source,
                claimant: source,
            });
        }
        let mut wanted = self.configs_of(source);
        wanted.retain(|w| w != &member.config);
        self.change(&changing, source, &wanted, router, metrics)?;
        Ok(member)
    }

    /// Drain the member at `url` (any source's), or take it back. Draining takes its ranks out
    /// of routing at once; taken back, they return at once if its last probe passed (else at the
    /// first that does).
    pub(crate) fn set_draining(
        &self,
        url: &str,
        draining: bool,
        router: &Mutex<Router>,
        metrics: &Metrics,
    ) -> Result<Arc<Member>, FleetError> {
        let member = self.find(url).ok_or_else(|| FleetError::Unknown {
            url: url.trim_end_matches('/').into(),
        })?;
        let mut router = router.lock().unwrap_or_else(|e| e.into_inner());
        member.set_draining(draining);
        for rank in member.upstream.ranks() {
            router.set_healthy(rank, member.routable());
            metrics
                .worker_draining
                .get_or_create(&worker_label(rank))
                .set(i64::from(draining));
        }
        drop(router);
        tracing::info!(worker = member.upstream.id.0, url = %member.upstream.base_url, draining, "worker drain changed");
        Ok(member)
    }

    /// The entries of `source`'s members.
    fn configs_of(&self, source: Source) -> Vec<WorkerConfig> {
        self.members()
            .iter()
            .filter(|m| m.source == source)
            .map(|m| m.config.clone())
            .collect()
    }

    /// [`Fleet::reconcile`], with the lock on changes held.
    fn change(
        &self,
        _changing: &MutexGuard<'_, ()>,
        source: Source,
        wanted: &[WorkerConfig],
        router: &Mutex<Router>,
        metrics: &Metrics,
    ) -> Result<bool, FleetError> {
        let (own, others): (Vec<_>, Vec<_>) =
            self.members().into_iter().partition(|m| m.source == source);
        let mut listed = HashSet::new();
        for worker in wanted {
            let url = worker.url.trim_end_matches('/');
            if !listed.insert(url) {
                return Err(FleetError::Duplicate { url: url.into() });
            }
            if let Some(owner) = others.iter().find(|m| same_url(&m.config.url, url)) {
                return Err(FleetError::Owned {
                    url: url.into(),
                    owner: owner.source,
                    claimant: source,
                });
            }
        }
        let joining = wanted
            .iter()
            .filter(|w| !own.iter().any(|m| &m.config == *w))
            .map(Fleet::check)
            .collect::<Result<Vec<_>, _>>()?;
        let leaving: Vec<Arc<Member>> = own
            .into_iter()
            .filter(|m| !wanted.contains(&m.config))
            .collect();
        if joining.is_empty() && leaving.is_empty() {
            return Ok(false);
        }
        let mut members: Vec<Option<Arc<Member>>> = self.members.load().as_ref().clone();
        {
            let mut router = router.lock().unwrap_or_else(|e| e.into_inner());
            for member in &leaving {
                members[member.upstream.id.0 as usize] = None;
                for rank in member.upstream.ranks() {
                    router.retire_rank(rank);
                    metrics
                        .worker_healthy
                        .get_or_create(&worker_label(rank))
                        .set(0);
                    metrics
                        .worker_draining
                        .get_or_create(&worker_label(rank))
                        .set(0);
                }
                tracing::info!(worker = member.upstream.id.0, url = %member.upstream.base_url, %source, "worker left");
            }
            for joining in joining {
                let id = WorkerId(members.len() as u32);
                let member = self.start(id, source, joining);
                for rank in member.upstream.ranks() {
                    router.add_rank(rank, !member.upstream.publishes_events);
                    metrics
                        .worker_healthy
                        .get_or_create(&worker_label(rank))
                        .set(1);
                }
                tracing::info!(worker = id.0, url = %member.upstream.base_url, %source, "worker joined");
                members.push(Some(member));
            }
        }
        self.members.store(Arc::new(members));
        for member in leaving {
            self.forget(member);
        }
        Ok(true)
    }

    /// Subscribe a new member to its events.
    fn start(&self, id: WorkerId, source: Source, joining: Joining) -> Arc<Member> {
        let upstream = Upstream::new(id.0 as usize, &joining.config);
        let stop = self.background.child_token();
        let subscriptions = TaskTracker::new();
        let mut events = Vec::new();
        let mut names = Vec::new();
        for mut subscriber in joining.subscribers {
            subscriber.rank.worker = id;
            let stats = Arc::new(SubscriberStats::default());
            events.push((subscriber.rank, stats.clone()));
            if joining.config.kv_hints != HintDelivery::None {
                let rank_names = Arc::new(EngineNames::default());
                names.push((subscriber.rank, rank_names.clone()));
                subscriber.engine_names = Some(rank_names);
            }
            // Tracked by the gateway (shutdown waits for it) and by the member (leaving does).
            let run = run_subscriber(subscriber, self.ops.clone(), stats, stop.clone());
            self.tasks.spawn(subscriptions.track_future(run));
        }
        subscriptions.close();
        Arc::new(Member {
            source,
            upstream,
            config: joining.config,
            events,
            names,
            stop,
            subscriptions,
            probe_passed: AtomicBool::new(true),
            draining: AtomicBool::new(false),
        })
    }

    /// Stop a member's subscriptions, then drop what the index holds for it.
    fn forget(&self, member: Arc<Member>) {
        member.stop.cancel();
        let ops = self.ops.clone();
        self.tasks.spawn(async move {
            // A clear sent once its subscribers have ended cannot be undone by a late store.
            member.subscriptions.wait().await;
            for rank in member.upstream.ranks() {
                let _ = ops.send(IndexOp::Clear { rank }).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::router::{RouterConfig, native_policy};

    fn worker(url: &str) -> WorkerConfig {
        toml::from_str(&format!("url = \"{url}\"")).unwrap()
    }

    fn fleet() -> (Fleet, Mutex<Router>, Metrics) {
        let (ops, _) = mpsc::channel(16);
        let fleet = Fleet::new(ops, TaskTracker::new(), CancellationToken::new());
        let policy = native_policy("kv-cost").unwrap();
        let router = Mutex::new(Router::new(RouterConfig::default(), policy));
        (fleet, router, Metrics::new())
    }

    fn urls(fleet: &Fleet) -> Vec<(Source, String)> {
        fleet
            .members()
            .iter()
            .map(|m| (m.source, m.upstream.base_url.clone()))
            .collect()
    }

    #[tokio::test]
    async fn each_source_reconciles_only_its_own_members() {
        let (fleet, router, metrics) = fleet();
        let apply =
            |source, wanted: &[WorkerConfig]| fleet.reconcile(source, wanted, &router, &metrics);
        apply(Source::Config, &[worker("http://a:1")]).unwrap();
        apply(
            Source::Kubernetes,
            &[worker("http://k:1"), worker("http://k:2")],
        )
        .unwrap();
        // The file drops its worker and lists another: discovery's stay.
        assert!(apply(Source::Config, &[worker("http://b:1")]).unwrap());
        // Discovery loses one: the file's stays.
        assert!(apply(Source::Kubernetes, &[worker("http://k:2")]).unwrap());
        assert!(!apply(Source::Kubernetes, &[worker("http://k:2")]).unwrap());
        assert_eq!(
            urls(&fleet),
            [
                (Source::Kubernetes, "http://k:2".to_string()),
                (Source::Config, "http://b:1".to_string()),
            ]
        );
        // Ids are never reused: the newest member took id 3.
        assert_eq!(fleet.find("http://b:1/").unwrap().upstream.id, WorkerId(3));
    }

    #[tokio::test]
    async fn a_url_belongs_to_one_source_and_nothing_changes_on_a_refusal() {
        let (fleet, router, metrics) = fleet();
        let apply =
            |source, wanted: &[WorkerConfig]| fleet.reconcile(source, wanted, &router, &metrics);
        apply(Source::Config, &[worker("http://a:1")]).unwrap();
        let err = apply(
            Source::Kubernetes,
            &[worker("http://k:1"), worker("http://a:1/")],
        )
        .unwrap_err();
        assert!(
            matches!(
                &err,
                FleetError::Owned {
                    owner: Source::Config,
                    claimant: Source::Kubernetes,
                    ..
                }
            ),
            "{err}"
        );
        let err = apply(
            Source::Config,
            &[worker("http://b:1"), worker("http://b:1/")],
        )
        .unwrap_err();
        assert!(matches!(err, FleetError::Duplicate { .. }), "{err}");
        let err = fleet
            .add(Source::Admin, worker("http://a:1"), &router, &metrics)
            .unwrap_err();
        assert!(
            matches!(
                err,
                FleetError::Exists {
                    owner: Source::Config,
                    ..
                }
            ),
            "{err}"
        );
        let err = fleet
            .remove(Source::Admin, "http://a:1", &router, &metrics)
            .unwrap_err();
        assert!(matches!(err, FleetError::Owned { .. }), "{err}");
        assert_eq!(urls(&fleet), [(Source::Config, "http://a:1".to_string())]);
        // What an admin adds, only an admin removes; the router stops listing its ranks.
        fleet
            .add(Source::Admin, worker("http://c:1"), &router, &metrics)
            .unwrap();
        assert_eq!(router.lock().unwrap().ranks().count(), 2);
        fleet
            .remove(Source::Admin, "http://c:1", &router, &metrics)
            .unwrap();
        assert_eq!(router.lock().unwrap().ranks().count(), 1);
        assert!(matches!(
            fleet.remove(Source::Admin, "http://c:1", &router, &metrics),
            Err(FleetError::Unknown { .. })
        ));
    }
}
