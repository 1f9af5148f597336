//! The engines behind the gateway as they come and go. A worker that joins starts cold (healthy,
//! nothing indexed) and subscribes to its KV events; one that leaves stops its subscriptions, is
//! retired in the router (requests already on it finish; none go there any more) and has its
//! index entries dropped once its event streams are down. Ids are never reused, so a decision
//! taken just before a change can never reach a different engine.

use crate::config::{ConfigError, WorkerConfig, rank_endpoint};
use crate::metrics::{Metrics, worker_label};
use crate::upstream::Upstream;
use arc_swap::ArcSwap;
use std::sync::{Arc, Mutex};
use switchyard_core::index::IndexOp;
use switchyard_core::router::Router;
use switchyard_core::worker::{Rank, WorkerId};
use switchyard_kv_events::ingest::WireFormat;
use switchyard_kv_events::subscriber::{SubscriberConfig, SubscriberStats, run_subscriber};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// One engine server in the fleet.
#[derive(Debug)]
pub struct Member {
    /// How to reach it.
    pub upstream: Upstream,
    /// Its configuration entry.
    pub config: WorkerConfig,
    /// Its ranks' event-stream statistics.
    pub(crate) events: Vec<(Rank, Arc<SubscriberStats>)>,
    /// Stops its event subscriptions.
    stop: CancellationToken,
    /// Its event subscriptions, so that leaving can wait for them to end.
    subscriptions: TaskTracker,
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
                });
            }
        }
        Ok(Joining {
            config: config.clone(),
            subscribers,
        })
    }

    /// Change the fleet to `wanted`: entries not in it leave, new entries join (an entry is a
    /// whole worker configuration: a changed one leaves and joins anew). Nothing changes if any
    /// new entry is invalid. Returns whether anything changed.
    pub(crate) fn reconcile(
        &self,
        wanted: &[WorkerConfig],
        router: &Mutex<Router>,
        metrics: &Metrics,
    ) -> Result<bool, ConfigError> {
        let _changing = self.changing.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.members();
        let joining = wanted
            .iter()
            .filter(|w| !current.iter().any(|m| &m.config == *w))
            .map(Fleet::check)
            .collect::<Result<Vec<_>, _>>()?;
        let leaving: Vec<Arc<Member>> = current
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
                }
                tracing::info!(worker = member.upstream.id.0, url = %member.upstream.base_url, "worker left");
            }
            for joining in joining {
                let id = WorkerId(members.len() as u32);
                let member = self.start(id, joining);
                for rank in member.upstream.ranks() {
                    router.add_rank(rank, !member.upstream.publishes_events);
                    metrics
                        .worker_healthy
                        .get_or_create(&worker_label(rank))
                        .set(1);
                }
                tracing::info!(worker = id.0, url = %member.upstream.base_url, "worker joined");
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
    fn start(&self, id: WorkerId, joining: Joining) -> Arc<Member> {
        let upstream = Upstream::new(id.0 as usize, &joining.config);
        let stop = self.background.child_token();
        let subscriptions = TaskTracker::new();
        let mut events = Vec::new();
        for mut subscriber in joining.subscribers {
            subscriber.rank.worker = id;
            let stats = Arc::new(SubscriberStats::default());
            events.push((subscriber.rank, stats.clone()));
            // Tracked by the gateway (shutdown waits for it) and by the member (leaving does).
            let run = run_subscriber(subscriber, self.ops.clone(), stats, stop.clone());
            self.tasks.spawn(subscriptions.track_future(run));
        }
        subscriptions.close();
        Arc::new(Member {
            upstream,
            config: joining.config,
            events,
            stop,
            subscriptions,
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
