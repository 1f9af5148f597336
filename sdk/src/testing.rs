//! A native test harness: run a policy's logic on the host target, no Wasm build needed.
//!
//! [`RouterHarness`] calls a policy the way the gateway does and checks every answer the way the
//! gateway checks a component's (cost count, finiteness, index range), so a test fails where
//! the host would have fallen back. [`RouterHarness::route`] resolves costs as the host does at
//! temperature 0. [`AdmissionHarness`] does the same for admission: every action must name a
//! known session; and [`KvHintsHarness`] for KV hints: every hint must name known sessions and
//! ranks.

use std::cell::RefCell;

use crate::admission::{Action, AdmissionPolicy, Incoming, Sessions, Utilization};
use crate::kv_hints::{EventKind, Hint, HintKind, IndexState, KvHintPolicy, LifecycleEvent};
/// Re-exported: tests resolve costs the way the host does.
pub use crate::router::cheapest;
use crate::router::{Decision, Outcome, RouterPolicy, Worker, Workers};
use crate::types::{LogLevel, PolicyMetadata, Request};

thread_local! {
    static LOGS: RefCell<Vec<(LogLevel, String)>> = const { RefCell::new(Vec::new()) };
}

/// Records a [`crate::log`] call made in a native build.
pub(crate) fn capture_log(level: LogLevel, message: &str) {
    LOGS.with_borrow_mut(|logs| logs.push((level, message.to_owned())));
}

/// Takes the messages this thread's policies logged since the last call (each test runs on its
/// own thread, so tests do not see each other's logs).
pub fn take_logs() -> Vec<(LogLevel, String)> {
    LOGS.with_borrow_mut(std::mem::take)
}

/// A healthy, idle candidate `worker_id` (rank 0, nothing cached, nothing running).
pub fn worker(worker_id: u32) -> Worker {
    Worker {
        worker_id,
        healthy: true,
        ..Worker::default()
    }
}

/// `n` idle candidates with worker ids `0..n`.
pub fn idle_workers(n: u32) -> Workers {
    (0..n).map(worker).collect()
}

/// An outcome of a request placed on candidate `index` of `workers`, with this TTFT.
pub fn outcome(workers: &Workers, index: usize, ttft_ms: f64) -> Outcome {
    let w = workers.get(index).unwrap_or_default();
    Outcome {
        worker_index: index,
        worker_id: w.worker_id,
        dp_rank: w.dp_rank,
        ttft_ms: Some(ttft_ms),
        ..Outcome::default()
    }
}

/// Checks metadata as the host does at load: a kebab-case name and a `major.minor.patch`
/// version.
pub fn check_metadata(metadata: &PolicyMetadata) -> Result<(), String> {
    let name_ok = !metadata.name.is_empty()
        && !metadata.name.starts_with('-')
        && !metadata.name.ends_with('-')
        && metadata
            .name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !name_ok {
        return Err(format!("name {:?} is not kebab-case", metadata.name));
    }
    let core = metadata.version.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    let version_ok = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.parse::<u64>().is_ok());
    if !version_ok {
        return Err(format!("version {:?} is not semver", metadata.version));
    }
    Ok(())
}

/// Checks a decision as the host does: an index in range, or one finite cost per candidate.
pub fn check_decision(decision: &Decision, workers: &Workers) -> Result<(), String> {
    let n = workers.len();
    match decision {
        Decision::Chosen(i) if *i >= n => Err(format!("chose index {i} of {n} candidates")),
        Decision::Costs(costs) if costs.len() != n => {
            Err(format!("{} costs for {n} candidates", costs.len()))
        }
        Decision::Costs(costs) if costs.iter().any(|c| !c.is_finite()) => {
            Err(format!("non-finite cost in {costs:?}"))
        }
        _ => Ok(()),
    }
}

/// Checks admission actions as the host does: each must name a session of `sessions` or the
/// arriving one (the host refuses the whole answer otherwise).
pub fn check_actions(
    actions: &[Action],
    sessions: &Sessions,
    incoming: Option<&Incoming>,
) -> Result<(), String> {
    let arriving = incoming.and_then(|i| i.request.session_id.as_deref());
    match actions.iter().find(|a| {
        sessions.position(&a.session_id).is_none() && arriving != Some(a.session_id.as_str())
    }) {
        Some(unknown) => Err(format!(
            "action for unknown session `{}`",
            unknown.session_id
        )),
        None => Ok(()),
    }
}

/// Checks KV hints as the host does: every session a hint names (or shares with) must be
/// tagged, spawned or ended in `events`, have a tool result, or be resident in `index`, and
/// every target rank must be listed in `index` (the host refuses the whole answer otherwise).
pub fn check_hints(
    hints: &[Hint],
    events: &[LifecycleEvent],
    index: &IndexState,
) -> Result<(), String> {
    let tool_results = index.tool_results();
    let mut sessions: Vec<&str> = index
        .residency
        .session_ids
        .iter()
        .map(String::as_str)
        .chain(tool_results.iter().map(|r| r.session_id.as_str()))
        .collect();
    for event in events {
        sessions.push(&event.session_id);
        if let EventKind::SubagentSpawn(child) | EventKind::SubagentEnd(child) = &event.kind {
            sessions.push(child);
        }
    }
    let r = &index.residency;
    let u = &index.usage;
    let ranks: Vec<(u32, u32)> = r
        .worker_ids
        .iter()
        .zip(&r.dp_ranks)
        .chain(u.worker_ids.iter().zip(&u.dp_ranks))
        .map(|(w, d)| (*w, *d))
        .collect();
    for hint in hints {
        let shared_with = match &hint.kind {
            HintKind::Share(other) => Some(other.as_str()),
            _ => None,
        };
        for session in std::iter::once(hint.session_id.as_str()).chain(shared_with) {
            if !sessions.contains(&session) {
                return Err(format!("hint names unknown session `{session}`"));
            }
        }
        if let Some(rank) = hint.target.filter(|t| !ranks.contains(t)) {
            return Err(format!("hint targets unknown rank {rank:?}"));
        }
    }
    Ok(())
}

/// Drives a [`KvHintPolicy`] as the gateway does, checking every answer.
#[derive(Debug)]
pub struct KvHintsHarness<P> {
    policy: P,
}

impl<P: KvHintPolicy> KvHintsHarness<P> {
    /// Wraps `policy`.
    ///
    /// # Panics
    /// If its metadata would be refused at load.
    pub fn new(policy: P) -> Self {
        if let Err(why) = check_metadata(&policy.metadata()) {
            panic!("the host would refuse this policy: {why}");
        }
        Self { policy }
    }

    /// The policy's hints for `events` (tool results go in `index`, see
    /// [`IndexState::with_tool_results`]).
    ///
    /// # Panics
    /// If a hint names a session or rank the host did not report.
    pub fn on_events(
        &mut self,
        now_ms: u64,
        events: &[LifecycleEvent],
        index: &IndexState,
    ) -> Vec<Hint> {
        let hints = self.policy.on_events(now_ms, events, index);
        if let Err(why) = check_hints(&hints, events, index) {
            panic!("the host would refuse these hints: {why}");
        }
        hints
    }

    /// The policy, to inspect its state.
    pub fn policy(&self) -> &P {
        &self.policy
    }
}

/// Drives an [`AdmissionPolicy`] as the gateway does, checking every answer.
#[derive(Debug)]
pub struct AdmissionHarness<P> {
    policy: P,
}

impl<P: AdmissionPolicy> AdmissionHarness<P> {
    /// Wraps `policy`.
    ///
    /// # Panics
    /// If its metadata would be refused at load.
    pub fn new(policy: P) -> Self {
        if let Err(why) = check_metadata(&policy.metadata()) {
            panic!("the host would refuse this policy: {why}");
        }
        Self { policy }
    }

    /// The policy's periodic review.
    ///
    /// # Panics
    /// If an action names a session the host did not report.
    pub fn tick(&mut self, now_ms: u64, sessions: &Sessions, workers: &Utilization) -> Vec<Action> {
        let actions = self.policy.tick(now_ms, sessions, workers);
        if let Err(why) = check_actions(&actions, sessions, None) {
            panic!("the host would refuse these actions: {why}");
        }
        actions
    }

    /// The policy's answer to an arrival.
    ///
    /// # Panics
    /// If an action names a session that is neither reported nor arriving.
    pub fn arrival(
        &mut self,
        now_ms: u64,
        incoming: &Incoming,
        sessions: &Sessions,
        workers: &Utilization,
    ) -> Vec<Action> {
        let actions = self.policy.arrival(now_ms, incoming, sessions, workers);
        if let Err(why) = check_actions(&actions, sessions, Some(incoming)) {
            panic!("the host would refuse these actions: {why}");
        }
        actions
    }

    /// The policy, to inspect its state.
    pub fn policy(&self) -> &P {
        &self.policy
    }
}

/// Drives a [`RouterPolicy`] as the gateway does, checking every answer.
#[derive(Debug)]
pub struct RouterHarness<P> {
    policy: P,
}

impl<P: RouterPolicy> RouterHarness<P> {
    /// Wraps `policy`.
    ///
    /// # Panics
    /// If its metadata would be refused at load.
    pub fn new(policy: P) -> Self {
        if let Err(why) = check_metadata(&policy.metadata()) {
            panic!("the host would refuse this policy: {why}");
        }
        Self { policy }
    }

    /// The policy's answer for `request` on `workers`.
    ///
    /// # Panics
    /// If the answer is one the host would refuse (it would use its native policy instead).
    pub fn select(&mut self, request: &Request, workers: &Workers) -> Decision {
        let decision = self.policy.select(request, workers);
        if let Err(why) = check_decision(&decision, workers) {
            panic!("the host would refuse this decision: {why}");
        }
        decision
    }

    /// The candidate index the request lands on at temperature 0; `None` if the policy queued or
    /// rejected it.
    pub fn route(&mut self, request: &Request, workers: &Workers) -> Option<usize> {
        match self.select(request, workers) {
            Decision::Chosen(i) => Some(i),
            Decision::Costs(costs) => cheapest(&costs, workers),
            Decision::Queue(_) | Decision::Reject(_) => None,
        }
    }

    /// Feeds back an outcome.
    pub fn observe(&mut self, outcome: &Outcome) {
        self.policy.observe(outcome);
    }

    /// The queue key of `request`.
    pub fn queue_key(&mut self, request: &Request) -> f64 {
        self.policy.queue_key(request)
    }

    /// The policy, to inspect its state.
    pub fn policy(&self) -> &P {
        &self.policy
    }
}
