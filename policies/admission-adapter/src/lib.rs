//! Runs a native `switchyard_core` admission policy as an SDK [`AdmissionPolicy`], so the
//! built-in admission components are the core's code compiled to Wasm, not ports of it.
//!
//! A component names its policy with a [`Builtin`] and exports [`Native`] of it. Each call
//! converts the SDK's rows (with the host's `switchyard.*` extension columns decoded by
//! [`Sessions::rows`] and [`Utilization::rows`]) into the core's [`AdmissionView`], calls the
//! core policy, which keeps its state across calls, and converts its actions back. Times cross
//! the WIT boundary in whole milliseconds, so for millisecond-aligned times the component's
//! actions are exactly the native policy's.

use std::fmt;
use std::time::Duration;
use switchyard_core::admission::{self as core, AdmissionAction, AdmissionView, Arrival};
use switchyard_core::router::{CostWeights, PolicyRequest};
use switchyard_core::worker;
use switchyard_policy_sdk::{
    self as sdk, Action, ActionKind, AdmissionPolicy, Incoming, PolicyMetadata, Rank,
    RankUtilization, SessionPhase, SessionRef, Sessions, Utilization,
};

/// A native admission policy a component ships: how to build it and how to describe it.
pub trait Builtin {
    /// The core policy.
    type Policy: core::AdmissionPolicy;

    /// The policy the component runs (a component cannot read files: its defaults).
    fn policy() -> Self::Policy;

    /// The component's metadata; `policy` is the running policy, for its parameters.
    fn metadata(policy: &Self::Policy) -> PolicyMetadata;

    /// The policy configured with `params` (WIT 1.1 `configure`, the same `key=value` pairs as
    /// the native spec `name:key=value`), or why not. Default: no parameters taken.
    fn configure(params: &sdk::Params) -> Result<Self::Policy, String> {
        let policy = Self::policy();
        sdk::no_params(&Self::metadata(&policy).name, params)?;
        Ok(policy)
    }
}

/// The core policy of `B` behind the SDK's [`AdmissionPolicy`]; export it with
/// `switchyard_policy_sdk::export_admission!(Native<B>)`.
pub struct Native<B: Builtin> {
    policy: B::Policy,
    /// The core's view, refilled in place on every call (its strings keep their buffers).
    view: AdmissionView,
}

impl<B: Builtin> Native<B> {
    /// The core policy, to inspect its state.
    pub fn policy(&self) -> &B::Policy {
        &self.policy
    }
}

impl<B: Builtin> Default for Native<B> {
    fn default() -> Self {
        Self {
            policy: B::policy(),
            view: AdmissionView::default(),
        }
    }
}

impl<B: Builtin> fmt::Debug for Native<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Native")
            .field("policy", &self.policy)
            .finish()
    }
}

impl<B: Builtin> AdmissionPolicy for Native<B> {
    fn metadata(&self) -> PolicyMetadata {
        B::metadata(&self.policy)
    }

    fn tick(&mut self, now_ms: u64, sessions: &Sessions, workers: &Utilization) -> Vec<Action> {
        refill_view(&mut self.view, sessions, workers);
        actions(core::AdmissionPolicy::tick(
            &mut self.policy,
            &self.view,
            millis(now_ms),
        ))
    }

    fn arrival(
        &mut self,
        now_ms: u64,
        incoming: &Incoming,
        sessions: &Sessions,
        workers: &Utilization,
    ) -> Vec<Action> {
        refill_view(&mut self.view, sessions, workers);
        let arrival = arrival(incoming);
        actions(core::AdmissionPolicy::arrival(
            &mut self.policy,
            &self.view,
            &arrival,
            millis(now_ms),
        ))
    }

    fn placement(
        &mut self,
        now_ms: u64,
        session_id: &str,
        sessions: &Sessions,
        workers: &Utilization,
    ) -> Option<Rank> {
        refill_view(&mut self.view, sessions, workers);
        core::AdmissionPolicy::placement(&mut self.policy, &self.view, session_id, millis(now_ms))
            .map(|r| Rank {
                worker_id: r.worker.0,
                dp_rank: r.dp_rank,
            })
    }

    fn configure(&mut self, params: &sdk::Params) -> Result<(), String> {
        self.policy = B::configure(params)?;
        Ok(())
    }
}

/// Metadata naming the policy and listing its parameters as extensions, keys and values as the
/// native spec string takes them (`thunder-agent:decay_half_life=1000ms`).
pub fn metadata(
    name: &str,
    version: &str,
    description: &str,
    params: impl IntoIterator<Item = (&'static str, String)>,
) -> PolicyMetadata {
    params.into_iter().fold(
        PolicyMetadata::new(name, version, description),
        |m, (key, value)| m.with_extension(key, value),
    )
}

/// `d` as the component's metadata lists durations (`1500ms`, as the native spec takes them).
pub fn param_ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The host's columns as the core's view.
pub fn view(sessions: &Sessions, workers: &Utilization) -> AdmissionView {
    let mut view = AdmissionView::default();
    refill_view(&mut view, sessions, workers);
    view
}

/// [`view`] into `view`, reusing its rows' strings: a call over hundreds of sessions then
/// allocates nothing once the rows have grown.
fn refill_view(view: &mut AdmissionView, sessions: &Sessions, workers: &Utilization) {
    let rows = &mut view.sessions;
    let mut n = 0;
    sessions.for_each_row(|s| {
        let row = session(s, rows.get_mut(n));
        match rows.get_mut(n) {
            Some(slot) => *slot = row,
            None => rows.push(row),
        }
        n += 1;
    });
    rows.truncate(n);
    view.workers.clear();
    view.workers
        .extend(workers.rows().iter().map(rank_utilization));
}

/// `s` as the core's row, its strings written into those of `old` (the row an earlier call
/// left in its place), if any.
fn session(s: SessionRef<'_>, old: Option<&mut core::SessionView>) -> core::SessionView {
    let (mut id, mut parent, mut tool) = old.map_or_else(Default::default, |old| {
        let id = std::mem::take(&mut old.session_id);
        (id, old.parent_session_id.take(), old.tool.take())
    });
    s.session_id.clone_into(&mut id);
    set_option(&mut parent, s.parent_session_id);
    set_option(&mut tool, s.tool);
    core::SessionView {
        session_id: id,
        parent_session_id: parent,
        phase: phase(s.phase),
        priority: s.priority,
        active_requests: s.active_requests,
        queued_requests: s.queued_requests,
        context_tokens: s.context_tokens,
        age: millis(s.age_ms),
        idle: millis(s.idle_ms),
        rank: s.rank.map(rank),
        paused: s.paused,
        paused_for: millis(s.paused_for_ms),
        service: millis(s.service_ms),
        tool,
    }
}

/// `slot` := `text`, in its buffer when it has one.
fn set_option(slot: &mut Option<String>, text: Option<&str>) {
    match (slot.as_mut(), text) {
        (Some(owned), Some(text)) => text.clone_into(owned),
        (_, text) => *slot = text.map(str::to_owned),
    }
}

fn phase(p: SessionPhase) -> core::SessionPhase {
    match p {
        SessionPhase::Queued => core::SessionPhase::Queued,
        SessionPhase::Running => core::SessionPhase::Running,
        SessionPhase::ToolCall => core::SessionPhase::ToolCall,
        SessionPhase::Paused => core::SessionPhase::Paused,
        SessionPhase::Idle => core::SessionPhase::Idle,
    }
}

fn rank(r: Rank) -> worker::Rank {
    worker::Rank::new(r.worker_id, r.dp_rank)
}

fn rank_utilization(w: &RankUtilization) -> core::RankUtilization {
    core::RankUtilization {
        rank: rank(w.rank),
        kv_usage: w.kv_usage,
        active_requests: w.active_requests,
        queue_depth: w.queue_depth,
        healthy: w.healthy,
        kv_capacity_tokens: w.kv_capacity_tokens,
    }
}

/// The arrival as the core sees it; it borrows the ids from `incoming`.
pub fn arrival(incoming: &Incoming) -> Arrival<'_> {
    let r = &incoming.request;
    let w = CostWeights {
        device_credit: r.weights.device_credit,
        host_credit: r.weights.host_credit,
        disk_credit: r.weights.disk_credit,
        shared_credit: r.weights.shared_credit,
        prefill_load_scale: r.weights.prefill_load_scale,
    };
    let o = &r.overrides;
    // The core keeps the overrides as one set of weights: any override makes one, the weights
    // in force filling what the request did not override.
    let overridden = [
        o.device_credit,
        o.host_credit,
        o.disk_credit,
        o.prefill_load_scale,
    ]
    .iter()
    .any(Option::is_some);
    let overrides = overridden.then(|| CostWeights {
        device_credit: o.device_credit.unwrap_or(w.device_credit),
        host_credit: o.host_credit.unwrap_or(w.host_credit),
        disk_credit: o.disk_credit.unwrap_or(w.disk_credit),
        // Requests cannot override it through WIT 1.0: the weight in force.
        shared_credit: w.shared_credit,
        prefill_load_scale: o.prefill_load_scale.unwrap_or(w.prefill_load_scale),
    });
    Arrival {
        request: PolicyRequest {
            tokens: r.tokens,
            blocks: r.blocks,
            block_size: r.block_size,
            weights: w,
            overrides,
            session_id: r.session_id.as_deref(),
            parent_session_id: r.parent_session_id.as_deref(),
            priority: r.priority,
            osl: r.osl,
        },
        waited: millis(incoming.waited_ms),
    }
}

/// The core's actions as the SDK's.
pub fn actions(actions: Vec<AdmissionAction>) -> Vec<Action> {
    actions
        .into_iter()
        .map(|a| {
            let kind = match a.kind {
                core::ActionKind::Admit => ActionKind::Admit,
                core::ActionKind::Hold(why) => ActionKind::Hold(why),
                core::ActionKind::Pause => ActionKind::Pause,
                core::ActionKind::Resume => ActionKind::Resume,
                core::ActionKind::AdjustPriority(delta) => ActionKind::AdjustPriority(delta),
            };
            Action::new(a.session_id, kind)
        })
        .collect()
}

#[cfg(test)]
mod tests;
