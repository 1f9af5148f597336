//! [`WasmAdmission`]: an `admission` component behind the core's [`AdmissionPolicy`] trait, with
//! the native policy of the same name answering whenever the guest cannot.

mod packed;

use crate::bindings::admission::{
    Action, ActionKind as WitActionKind, Incoming, SessionPhase as WitPhase, Sessions, Utilization,
};
use crate::component::{AdmissionComponent, AdmissionInstance, Metadata};
use crate::convert;
use crate::engine::PolicyEngine;
use crate::error::PolicyError;
use crate::guest::Guest;
use crate::registry::join_params;
use crate::router::CANARY_TOKENS;
use crate::slot::Kind;
use crate::stats::PolicyStats;
use packed::PackedView;
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::admission::{
    ActionKind, AdmissionAction, AdmissionPolicy, AdmissionView, AdmitAll, Arrival,
    RankUtilization, SessionPhase, SessionView, ThunderAgentConfig, native_admission,
    native_admission_spec,
};
use switchyard_core::router::PolicyRequest;
use switchyard_core::worker::Rank;

/// An admission policy running in a Wasm component.
///
/// One instance sees every `tick` and `arrival` in order, so a policy may keep per-session state
/// (e.g. ThunderAgent's paused set). After any failure the store is rebuilt on the next call,
/// which loses that state: the native fallback answers meanwhile.
#[derive(Debug)]
pub struct WasmAdmission {
    guest: Guest<AdmissionComponent>,
    fallback: Box<dyn AdmissionPolicy>,
    model: String,
    /// 1.3's packed view, reused between calls, when the component exports the packed calls
    /// (the host then makes those instead of `tick`, `arrival` and `placement`).
    packed: Option<Box<PackedView>>,
}

impl WasmAdmission {
    /// Admission over `component`; the guest is instantiated on the first call. The fallback is
    /// the native policy named like the component, else [`AdmitAll`].
    pub fn new(component: AdmissionComponent, stats: Arc<PolicyStats>) -> Self {
        let fallback =
            native_admission(&component.metadata().name).unwrap_or_else(|| Box::new(AdmitAll));
        Self::with_fallback(component, stats, fallback)
    }

    /// Admission with an explicit native fallback.
    pub fn with_fallback(
        component: AdmissionComponent,
        stats: Arc<PolicyStats>,
        fallback: Box<dyn AdmissionPolicy>,
    ) -> Self {
        let packed = component.has_packed().then(Box::default);
        Self {
            guest: Guest::new(component, stats),
            fallback,
            model: String::new(),
            packed,
        }
    }

    /// Set the model name the guest sees in an arrival's `req.model`.
    pub fn set_model(&mut self, model: impl Into<String>) {
        self.model = model.into();
    }

    /// The component this policy runs.
    pub fn component(&self) -> &AdmissionComponent {
        self.guest.component()
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<PolicyStats> {
        self.guest.stats()
    }

    /// Ask the guest's `tick`, with no fallback: the actions, checked, or why there are none.
    pub fn try_tick(
        &mut self,
        view: &AdmissionView,
        now: Duration,
    ) -> Result<Vec<AdmissionAction>, PolicyError> {
        ask_tick(&mut self.guest, &mut self.packed, view, now)
    }

    /// Ask the guest's `arrival`, with no fallback.
    pub fn try_arrival(
        &mut self,
        view: &AdmissionView,
        arrival: &Arrival<'_>,
        now: Duration,
    ) -> Result<Vec<AdmissionAction>, PolicyError> {
        ask_arrival(
            &mut self.guest,
            &mut self.packed,
            view,
            arrival,
            now,
            &self.model,
        )
    }

    /// Ask the guest's 1.1 `placement`, with no fallback: the rank (checked against the view),
    /// or `None` for no preference or a component without the export (1.0).
    pub fn try_placement(
        &mut self,
        view: &AdmissionView,
        session_id: &str,
        now: Duration,
    ) -> Result<Option<Rank>, PolicyError> {
        ask_placement(&mut self.guest, &mut self.packed, view, session_id, now)
    }

    /// Configure the policy with `params` (its 1.1 `configure`; every later instance gets them
    /// too) and start its instance. Refused with the policy's reason, or at once when it takes
    /// no parameters (a 1.0 component) and `params` is not empty.
    /// The native fallback gets the same parameters when its spec takes them.
    pub fn configure(&mut self, params: Vec<(String, String)>) -> Result<(), PolicyError> {
        self.guest.set_params(params.clone())?;
        self.guest.warm_up()?;
        if !params.is_empty()
            && let Ok(fallback) = <AdmissionKind as Kind>::native_with(self.guest.name(), &params)
        {
            self.fallback = fallback;
        }
        Ok(())
    }
}

impl AdmissionPolicy for WasmAdmission {
    fn name(&self) -> &str {
        self.guest.name()
    }

    fn tick(&mut self, view: &AdmissionView, now: Duration) -> Vec<AdmissionAction> {
        let packed = &mut self.packed;
        match self
            .guest
            .decide(|guest| ask_tick(guest, packed, view, now))
        {
            Some(actions) => actions,
            None => self.fallback.tick(view, now),
        }
    }

    fn arrival(
        &mut self,
        view: &AdmissionView,
        arrival: &Arrival<'_>,
        now: Duration,
    ) -> Vec<AdmissionAction> {
        let (model, packed) = (&self.model, &mut self.packed);
        match self
            .guest
            .decide(|guest| ask_arrival(guest, packed, view, arrival, now, model))
        {
            Some(actions) => actions,
            None => self.fallback.arrival(view, arrival, now),
        }
    }

    /// The guest's 1.1 `placement`; a 1.0 component never places (as before 1.1), and a
    /// failed call is answered by the native fallback.
    fn placement(&mut self, view: &AdmissionView, session_id: &str, now: Duration) -> Option<Rank> {
        if !self.guest.component().has_placement() {
            return None;
        }
        let packed = &mut self.packed;
        match self
            .guest
            .decide(|guest| ask_placement(guest, packed, view, session_id, now))
        {
            Some(rank) => rank,
            None => self.fallback.placement(view, session_id, now),
        }
    }
}

fn ask_placement(
    guest: &mut Guest<AdmissionComponent>,
    packed: &mut Option<Box<PackedView>>,
    view: &AdmissionView,
    session_id: &str,
    now: Duration,
) -> Result<Option<Rank>, PolicyError> {
    if !guest.component().has_placement() {
        return Ok(None);
    }
    let now = convert::millis(now);
    let placed = if let Some(packed) = packed {
        packed.fill(view);
        let PackedView { sessions, workers } = &**packed;
        guest.call(|instance, store| {
            lost_packed(instance)?.call_placement_packed(store, now, session_id, sessions, workers)
        })?
    } else {
        let (sessions, workers) = (sessions(view), utilization(view));
        guest.call(|instance, store| match &instance.placement {
            Some(p) => p.call_placement(store, now, session_id, &sessions, &workers),
            None => Ok(None),
        })?
    };
    let Some((worker, dp_rank)) = placed else {
        return Ok(None);
    };
    let rank = Rank::new(worker, dp_rank);
    if view.workers.iter().any(|w| w.rank == rank && w.healthy) {
        Ok(Some(rank))
    } else {
        Err(PolicyError::BadOutput(format!(
            "placement on rank {worker}.{dp_rank}, not a healthy rank of the view"
        )))
    }
}

// Free functions rather than methods so `decide` can lend them the guest while `self.model`
// stays readable.

fn ask_tick(
    guest: &mut Guest<AdmissionComponent>,
    packed: &mut Option<Box<PackedView>>,
    view: &AdmissionView,
    now: Duration,
) -> Result<Vec<AdmissionAction>, PolicyError> {
    let now = convert::millis(now);
    let raw = if let Some(packed) = packed {
        packed.fill(view);
        let PackedView { sessions, workers } = &**packed;
        guest.call(|instance, store| {
            lost_packed(instance)?.call_tick_packed(store, now, sessions, workers)
        })?
    } else {
        let (sessions, workers) = (sessions(view), utilization(view));
        guest.call(|instance, store| instance.core.call_tick(store, now, &sessions, &workers))?
    };
    checked(raw, view, None)
}

fn ask_arrival(
    guest: &mut Guest<AdmissionComponent>,
    packed: &mut Option<Box<PackedView>>,
    view: &AdmissionView,
    arrival: &Arrival<'_>,
    now: Duration,
    model: &str,
) -> Result<Vec<AdmissionAction>, PolicyError> {
    let incoming = Incoming {
        req: convert::request(&arrival.request, model),
        waited_ms: convert::millis(arrival.waited),
    };
    let now = convert::millis(now);
    let raw = if let Some(packed) = packed {
        packed.fill(view);
        let PackedView { sessions, workers } = &**packed;
        guest.call(|instance, store| {
            lost_packed(instance)?.call_arrival_packed(store, now, &incoming, sessions, workers)
        })?
    } else {
        let (sessions, workers) = (sessions(view), utilization(view));
        guest.call(|instance, store| {
            instance
                .core
                .call_arrival(store, now, &incoming, &sessions, &workers)
        })?
    };
    checked(raw, view, Some(arrival))
}

/// The instance's 1.3 exports; the component had them at load, so their absence is a broken
/// host invariant, reported as the call's failure rather than a panic.
fn lost_packed(
    instance: &AdmissionInstance,
) -> wasmtime::Result<&crate::bindings::admission_packed::AdmissionPacked> {
    instance
        .packed
        .as_ref()
        .ok_or_else(|| wasmtime::format_err!("the component lost its packed admission calls"))
}

// Columns the WIT records lack travel as `extensions` (wit/README.md, "Trial signals in use"):
// one CSV row per column, one field per row of the record.

/// Sessions: each session's last rank (`worker.dp-rank`), empty for a new program.
const RANK_EXTENSION: &str = "switchyard.rank";
/// Sessions: `1` if paused by an admission action (also while it still finishes a running
/// request), else `0`.
const PAUSED_EXTENSION: &str = "switchyard.paused";
/// Sessions: milliseconds paused.
const PAUSED_FOR_EXTENSION: &str = "switchyard.paused-for-ms";
/// Sessions: attained service (summed run time of finished requests), milliseconds.
const SERVICE_EXTENSION: &str = "switchyard.service-ms";
/// Sessions: the tool the last turn called; empty when it ended without one.
const TOOL_EXTENSION: &str = "switchyard.tool";
/// Utilization: each rank's KV capacity in tokens, empty where unknown.
const KV_CAPACITY_EXTENSION: &str = "switchyard.kv-capacity-tokens";

/// A column as one extension: one field per row, in the record's order, empty where unknown,
/// in the SDK's format (`switchyard_policy_sdk::columns`, which guests decode it with); no entry
/// at all when every value is unknown (or there are no rows). Each value is written straight
/// into the row through one scratch buffer: a column of hundreds of sessions is built on every
/// admission call.
pub(crate) fn column<V: std::fmt::Display>(
    key: &str,
    values: impl Iterator<Item = Option<V>>,
) -> Option<(String, String)> {
    use std::fmt::Write;
    let (mut row, mut field) = (String::new(), String::new());
    let mut known = false;
    for (i, value) in values.enumerate() {
        if i > 0 {
            row.push(',');
        }
        let Some(value) = value else { continue };
        known = true;
        field.clear();
        // Writing to a `String` cannot fail.
        let _ = write!(field, "{value}");
        switchyard_policy_sdk::columns::push_field(&mut row, &field);
    }
    known.then(|| (key.to_string(), row))
}

fn sessions(view: &AdmissionView) -> Sessions {
    let s = &view.sessions;
    let millis = |d: Duration| Some(convert::millis(d));
    let extensions = [
        column(RANK_EXTENSION, s.iter().map(|s| s.rank)),
        column(PAUSED_EXTENSION, s.iter().map(|s| Some(u8::from(s.paused)))),
        column(PAUSED_FOR_EXTENSION, s.iter().map(|s| millis(s.paused_for))),
        column(SERVICE_EXTENSION, s.iter().map(|s| millis(s.service))),
        column(TOOL_EXTENSION, s.iter().map(|s| s.tool.as_deref())),
    ];
    Sessions {
        session_ids: s.iter().map(|s| s.session_id.clone()).collect(),
        parent_session_ids: s.iter().map(|s| s.parent_session_id.clone()).collect(),
        phases: s.iter().map(|s| phase(s.phase)).collect(),
        priorities: s.iter().map(|s| s.priority).collect(),
        active_requests: s.iter().map(|s| s.active_requests).collect(),
        queued_requests: s.iter().map(|s| s.queued_requests).collect(),
        context_tokens: s.iter().map(|s| s.context_tokens).collect(),
        age_ms: s.iter().map(|s| convert::millis(s.age)).collect(),
        idle_ms: s.iter().map(|s| convert::millis(s.idle)).collect(),
        extensions: extensions.into_iter().flatten().collect(),
    }
}

fn phase(phase: SessionPhase) -> WitPhase {
    match phase {
        SessionPhase::Queued => WitPhase::Queued,
        SessionPhase::Running => WitPhase::Running,
        SessionPhase::ToolCall => WitPhase::ToolCall,
        SessionPhase::Paused => WitPhase::Paused,
        SessionPhase::Idle => WitPhase::Idle,
    }
}

fn utilization(view: &AdmissionView) -> Utilization {
    let w = &view.workers;
    Utilization {
        worker_ids: w.iter().map(|w| w.rank.worker.0).collect(),
        dp_ranks: w.iter().map(|w| w.rank.dp_rank).collect(),
        kv_usage: w.iter().map(|w| w.kv_usage).collect(),
        active_requests: w.iter().map(|w| w.active_requests).collect(),
        queue_depth: w.iter().map(|w| w.queue_depth).collect(),
        healthy: w.iter().map(|w| w.healthy).collect(),
        extensions: column(
            KV_CAPACITY_EXTENSION,
            w.iter()
                .map(|w| (w.kv_capacity_tokens > 0).then_some(w.kv_capacity_tokens)),
        )
        .into_iter()
        .collect(),
    }
}

/// Convert the guest's actions and refuse the whole answer if one names a session the host
/// did not report: it cannot be applied, and the rest of the answer was computed from the same
/// confusion.
fn checked(
    raw: Vec<Action>,
    view: &AdmissionView,
    arrival: Option<&Arrival<'_>>,
) -> Result<Vec<AdmissionAction>, PolicyError> {
    let actions: Vec<AdmissionAction> = raw
        .into_iter()
        .map(|a| AdmissionAction {
            session_id: a.session_id,
            kind: match a.kind {
                WitActionKind::Admit => ActionKind::Admit,
                WitActionKind::Hold(reason) => ActionKind::Hold(reason),
                WitActionKind::Pause => ActionKind::Pause,
                WitActionKind::Resume => ActionKind::Resume,
                WitActionKind::AdjustPriority(delta) => ActionKind::AdjustPriority(delta),
            },
        })
        .collect();
    match view.unknown_session(&actions, arrival) {
        Some(unknown) => Err(PolicyError::BadOutput(format!(
            "action for unknown session `{unknown}`"
        ))),
        None => Ok(actions),
    }
}

/// The `admission` world, for the registry.
#[derive(Debug)]
pub(crate) struct AdmissionKind;

impl Kind for AdmissionKind {
    const WORLD: &'static str = "admission";
    const DEFAULT_NATIVE: &'static str = "admit-all";
    type Policy = dyn AdmissionPolicy;

    fn native(name: &str) -> Option<Box<Self::Policy>> {
        native_admission(name)
    }

    fn native_with(name: &str, params: &[(String, String)]) -> Result<Box<Self::Policy>, String> {
        let tick = ThunderAgentConfig::default().tick_interval;
        native_admission_spec(&join_params(name, params), tick).map_err(|e| e.to_string())
    }

    fn policy_name(policy: &Self::Policy) -> &str {
        policy.name()
    }

    fn load(
        engine: &PolicyEngine,
        bytes: &[u8],
        stats: Arc<PolicyStats>,
        model: &str,
        params: &[(String, String)],
    ) -> Result<(Metadata, Box<Self::Policy>), PolicyError> {
        let component = engine.load_admission(bytes)?;
        canary(&component, params)?;
        let metadata = component.metadata().clone();
        let mut admission = WasmAdmission::new(component, stats);
        admission.set_model(model);
        // The instance that will answer starts now, off the request path.
        admission.configure(params.to_vec())?;
        Ok((metadata, Box::new(admission)))
    }
}

/// Run a fresh instance's `tick` and `arrival` on sample views (3, then 8 sessions `s0`.. in
/// every phase, on 4 ranks); any failure or action for a session not in the view rejects the
/// load.
fn canary(component: &AdmissionComponent, params: &[(String, String)]) -> Result<(), PolicyError> {
    let mut trial = WasmAdmission::new(component.clone(), Arc::new(PolicyStats::default()));
    trial.guest.set_params(params.to_vec())?;
    // The policy's refusal of its parameters is the load's error, as the policy gave it.
    trial.guest.warm_up()?;
    let phases = [
        SessionPhase::Queued,
        SessionPhase::Running,
        SessionPhase::ToolCall,
        SessionPhase::Paused,
        SessionPhase::Idle,
    ];
    for sessions in [3_u32, 8] {
        let view = AdmissionView {
            sessions: (0..sessions)
                .map(|s| {
                    let phase = phases[s as usize % phases.len()];
                    SessionView {
                        session_id: format!("s{s}"),
                        parent_session_id: (s % 3 == 2).then(|| "s0".to_string()),
                        phase,
                        priority: 0,
                        active_requests: s % 2,
                        queued_requests: s % 3,
                        context_tokens: u64::from(s) * 4096,
                        age: Duration::from_secs(u64::from(s) * 10),
                        idle: Duration::from_millis(u64::from(s) * 250),
                        rank: Some(Rank::new(s % 4, 0)),
                        paused: phase == SessionPhase::Paused,
                        paused_for: Duration::ZERO,
                        service: Duration::from_secs(u64::from(s)),
                        tool: None,
                    }
                })
                .collect(),
            workers: (0..4)
                .map(|w| RankUtilization {
                    rank: Rank::new(w, 0),
                    kv_usage: 0.2 * w as f32,
                    active_requests: w * 3,
                    queue_depth: w,
                    healthy: w != 3,
                    kv_capacity_tokens: 1 << 20,
                })
                .collect(),
        };
        let now = Duration::from_secs(60);
        trial
            .try_tick(&view, now)
            .map_err(|e| PolicyError::Canary(format!("tick on {sessions} sessions: {e}")))?;
        let arrival = Arrival {
            request: PolicyRequest {
                tokens: CANARY_TOKENS,
                blocks: CANARY_TOKENS.div_ceil(16),
                block_size: 16,
                session_id: Some("s1"),
                ..PolicyRequest::default()
            },
            waited: Duration::ZERO,
        };
        trial
            .try_arrival(&view, &arrival, now)
            .map_err(|e| PolicyError::Canary(format!("arrival on {sessions} sessions: {e}")))?;
        trial
            .try_placement(&view, "s1", now)
            .map_err(|e| PolicyError::Canary(format!("placement on {sessions} sessions: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str, rank: Option<Rank>) -> SessionView {
        SessionView {
            session_id: id.into(),
            parent_session_id: None,
            phase: SessionPhase::Running,
            priority: 0,
            active_requests: 1,
            queued_requests: 0,
            context_tokens: 10,
            age: Duration::ZERO,
            idle: Duration::ZERO,
            rank,
            paused: false,
            paused_for: Duration::ZERO,
            service: Duration::ZERO,
            tool: None,
        }
    }

    fn rank(worker: u32, kv_capacity_tokens: u64) -> RankUtilization {
        RankUtilization {
            rank: Rank::new(worker, 1),
            kv_usage: 0.5,
            active_requests: 0,
            queue_depth: 0,
            healthy: true,
            kv_capacity_tokens,
        }
    }

    fn extension<'a>(extensions: &'a [(String, String)], key: &str) -> Option<&'a str> {
        extensions
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn columns_the_records_lack_travel_as_extensions() {
        let mut a = session("a", Some(Rank::new(3, 1)));
        a.paused = true;
        a.paused_for = Duration::from_micros(1_500_900);
        a.service = Duration::from_secs(42);
        a.tool = Some("grep, then \"sed\"".into());
        let mut b = session("b", None);
        b.tool = Some(String::new());
        let view = AdmissionView {
            sessions: vec![a, b, session("c", None)],
            workers: vec![rank(0, 0), rank(1, 4096)],
        };
        let ext = sessions(&view).extensions;
        let expected = [
            (RANK_EXTENSION, "3.1,,"),
            (PAUSED_EXTENSION, "1,0,0"),
            // Milliseconds, truncated like every other duration crossing the boundary.
            (PAUSED_FOR_EXTENSION, "1500,0,0"),
            (SERVICE_EXTENSION, "42000,0,0"),
            (TOOL_EXTENSION, r#""grep, then ""sed""","","#),
        ];
        assert_eq!(ext.len(), expected.len());
        for (key, value) in expected {
            assert_eq!(extension(&ext, key), Some(value), "{key}");
        }
        assert_eq!(
            extension(&utilization(&view).extensions, KV_CAPACITY_EXTENSION),
            Some(",4096")
        );
    }

    #[test]
    fn all_unknown_columns_are_left_out() {
        let view = AdmissionView {
            sessions: vec![session("b", None)],
            workers: vec![rank(0, 0)],
        };
        let ext = sessions(&view).extensions;
        assert_eq!(extension(&ext, RANK_EXTENSION), None);
        assert_eq!(extension(&ext, TOOL_EXTENSION), None);
        // Always-known signals still travel.
        assert_eq!(extension(&ext, PAUSED_EXTENSION), Some("0"));
        assert!(utilization(&view).extensions.is_empty());
        assert!(sessions(&AdmissionView::default()).extensions.is_empty());
    }
}
