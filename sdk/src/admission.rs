//! The admission decision point: which agent programs (sessions) may send work now.
//!
//! [`Sessions`] and [`Utilization`] arrive as columns, as the WIT passes them;
//! [`Sessions::rows`] and [`Utilization::rows`] copy them out as [`SessionView`] and
//! [`RankUtilization`] rows, with the host's trial signals decoded into typed fields. A 1.3 host
//! sends those signals typed ([`SessionSignals`], WIT `packed-sessions`); older hosts, and
//! inputs built with [`FromIterator`], carry them as `switchyard.*` extension columns
//! ([`columns`](crate::columns)).

use crate::columns::{find_fields, join_column};
use crate::packed;
use crate::types::{Extensions, PolicyMetadata, Request};
use std::borrow::Cow;

/// Sessions extension: each session's last rank as `worker.dp-rank`, empty for a new program.
pub const RANK_COLUMN: &str = "switchyard.rank";
/// Sessions extension: `1` if an admission action paused the session (also while it still
/// finishes a running request), else `0`.
pub const PAUSED_COLUMN: &str = "switchyard.paused";
/// Sessions extension: milliseconds the session has been paused (0 when not paused).
pub const PAUSED_FOR_COLUMN: &str = "switchyard.paused-for-ms";
/// Sessions extension: attained service, the summed run time of its finished requests, in ms.
pub const SERVICE_COLUMN: &str = "switchyard.service-ms";
/// Sessions extension: the tool its last turn called (empty field: no tool call; `""`: a tool
/// call whose name is unknown).
pub const TOOL_COLUMN: &str = "switchyard.tool";
/// Utilization extension: each rank's KV capacity in tokens, empty when unknown.
pub const KV_CAPACITY_COLUMN: &str = "switchyard.kv-capacity-tokens";

/// Where a session is in its life, as the gateway sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SessionPhase {
    /// Has requests waiting in the gateway queue, none running.
    Queued,
    /// Has requests running on an engine.
    Running,
    /// Its last turn ended with a tool call; the next request comes when the tool returns.
    ToolCall,
    /// Paused by an admission action; its requests wait.
    Paused,
    /// Nothing running or waiting.
    #[default]
    Idle,
}

/// A worker rank: an engine server and a data-parallel rank within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rank {
    /// Engine server.
    pub worker_id: u32,
    /// Data-parallel rank within that server (0 without data parallelism).
    pub dp_rank: u32,
}

impl Rank {
    /// Rank `dp_rank` of server `worker_id`.
    pub fn new(worker_id: u32, dp_rank: u32) -> Self {
        Self { worker_id, dp_rank }
    }

    /// `worker.dp-rank`, as in [`RANK_COLUMN`]; `None` if malformed.
    pub fn parse(text: &str) -> Option<Self> {
        let (worker, dp) = text.split_once('.')?;
        Some(Self::new(worker.parse().ok()?, dp.parse().ok()?))
    }
}

impl std::fmt::Display for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.worker_id, self.dp_rank)
    }
}

/// One session, copied out of the [`Sessions`] columns, with the host's trial signals decoded.
/// A signal an older host does not send takes the value noted on its field.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionView {
    /// Session id.
    pub session_id: String,
    /// Parent session (for subagents), if any.
    pub parent_session_id: Option<String>,
    /// Phase.
    pub phase: SessionPhase,
    /// Current priority (after earlier adjustments); higher is more urgent.
    pub priority: i32,
    /// Requests running.
    pub active_requests: u32,
    /// Requests waiting in the gateway queue.
    pub queued_requests: u32,
    /// Tokens in its context (last prompt plus output).
    pub context_tokens: u64,
    /// Milliseconds since its first request.
    pub age_ms: u64,
    /// Milliseconds since it last had a request running (0 while running).
    pub idle_ms: u64,
    /// The rank its last (or current) request ran on; `None` for a new program
    /// ([`RANK_COLUMN`]; absent: `None`).
    pub rank: Option<Rank>,
    /// Paused by an admission action, also while it still finishes a running request
    /// ([`PAUSED_COLUMN`]; absent: `phase == Paused`).
    pub paused: bool,
    /// Milliseconds it has been paused ([`PAUSED_FOR_COLUMN`]; absent: 0).
    pub paused_for_ms: u64,
    /// Attained service in milliseconds ([`SERVICE_COLUMN`]; absent: 0).
    pub service_ms: u64,
    /// The tool its last turn called, if that turn ended with a tool call (`""` when the name
    /// is unknown) ([`TOOL_COLUMN`]; absent: `None`).
    pub tool: Option<String>,
}

/// One rank, copied out of the [`Utilization`] columns.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RankUtilization {
    /// The rank.
    pub rank: Rank,
    /// Fraction of KV capacity in use, 0.0 to 1.0.
    pub kv_usage: f32,
    /// Requests in flight.
    pub active_requests: u32,
    /// Requests waiting in the engine's queue.
    pub queue_depth: u32,
    /// Whether the host routes to the rank.
    pub healthy: bool,
    /// KV capacity in tokens, 0 when unknown ([`KV_CAPACITY_COLUMN`]; absent: 0).
    pub kv_capacity_tokens: u64,
}

/// Every known session as columns (one entry per session, same order in every `Vec`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sessions {
    /// Session ids.
    pub session_ids: Vec<String>,
    /// Parent session (for subagents), if any.
    pub parent_session_ids: Vec<Option<String>>,
    /// Phase of each session.
    pub phases: Vec<SessionPhase>,
    /// Current priority (after earlier adjustments); higher is more urgent.
    pub priorities: Vec<i32>,
    /// Requests running.
    pub active_requests: Vec<u32>,
    /// Requests waiting in the gateway queue.
    pub queued_requests: Vec<u32>,
    /// Tokens in the session's context (last prompt plus output).
    pub context_tokens: Vec<u64>,
    /// Milliseconds since the session's first request.
    pub age_ms: Vec<u64>,
    /// Milliseconds since the session last had a request running (0 while running).
    pub idle_ms: Vec<u64>,
    /// Extra session-set signals.
    pub extensions: Extensions,
    /// Since WIT 1.3: the host's trial signals as typed columns; `None` when they came as
    /// extension columns (hosts before 1.3, [`FromIterator`]), which the rows decode instead.
    pub signals: Option<SessionSignals>,
}

/// The host's trial signals of every session as typed columns (WIT 1.3 `packed-sessions`), one
/// entry per session in the order of [`Sessions`]; a short column reads as the defaults noted
/// on [`SessionView`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionSignals {
    /// The rank of each session's last request ([`SessionView::rank`]).
    pub ranks: Vec<Option<Rank>>,
    /// Paused by an admission action ([`SessionView::paused`]).
    pub paused: Vec<bool>,
    /// Milliseconds paused ([`SessionView::paused_for_ms`]).
    pub paused_for_ms: Vec<u64>,
    /// Attained service in milliseconds ([`SessionView::service_ms`]).
    pub service_ms: Vec<u64>,
    /// The tool its last turn called ([`SessionView::tool`]).
    pub tools: Vec<Option<String>>,
}

/// One session, borrowed from the [`Sessions`] columns: [`SessionView`] without the copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionRef<'a> {
    /// Session id.
    pub session_id: &'a str,
    /// Parent session, if any.
    pub parent_session_id: Option<&'a str>,
    /// Phase.
    pub phase: SessionPhase,
    /// Current priority; higher is more urgent.
    pub priority: i32,
    /// Requests running.
    pub active_requests: u32,
    /// Requests waiting in the gateway queue.
    pub queued_requests: u32,
    /// Tokens in its context.
    pub context_tokens: u64,
    /// Milliseconds since its first request.
    pub age_ms: u64,
    /// Milliseconds since it last had a request running.
    pub idle_ms: u64,
    /// See [`SessionView::rank`].
    pub rank: Option<Rank>,
    /// See [`SessionView::paused`].
    pub paused: bool,
    /// See [`SessionView::paused_for_ms`].
    pub paused_for_ms: u64,
    /// See [`SessionView::service_ms`].
    pub service_ms: u64,
    /// See [`SessionView::tool`].
    pub tool: Option<&'a str>,
}

impl SessionRef<'_> {
    /// The row, copied.
    pub fn to_view(&self) -> SessionView {
        SessionView {
            session_id: self.session_id.to_owned(),
            parent_session_id: self.parent_session_id.map(str::to_owned),
            phase: self.phase,
            priority: self.priority,
            active_requests: self.active_requests,
            queued_requests: self.queued_requests,
            context_tokens: self.context_tokens,
            age_ms: self.age_ms,
            idle_ms: self.idle_ms,
            rank: self.rank,
            paused: self.paused,
            paused_for_ms: self.paused_for_ms,
            service_ms: self.service_ms,
            tool: self.tool.map(str::to_owned),
        }
    }
}

impl Sessions {
    /// Number of sessions (the shortest column, so indexing below it never panics).
    pub fn len(&self) -> usize {
        [
            self.session_ids.len(),
            self.parent_session_ids.len(),
            self.phases.len(),
            self.priorities.len(),
            self.active_requests.len(),
            self.queued_requests.len(),
            self.context_tokens.len(),
            self.age_ms.len(),
            self.idle_ms.len(),
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }

    /// Whether no session is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The index of session `session_id`, if known.
    pub fn position(&self, session_id: &str) -> Option<usize> {
        self.session_ids[..self.len()]
            .iter()
            .position(|s| s == session_id)
    }

    /// Every session as a row, in order, with the trial signals decoded (each extension
    /// column parsed once per call: call it once per decision).
    pub fn rows(&self) -> Vec<SessionView> {
        let mut rows = Vec::with_capacity(self.len());
        self.for_each_row(|row| rows.push(row.to_view()));
        rows
    }

    /// Call `f` with every session, in order, borrowed from the columns: [`Sessions::rows`]
    /// without a copy of each id (a policy that keeps its own view refills it from these).
    pub fn for_each_row(&self, mut f: impl FnMut(SessionRef<'_>)) {
        let n = self.len();
        let row = |i: usize| {
            let phase = self.phases[i];
            SessionRef {
                session_id: &self.session_ids[i],
                parent_session_id: self.parent_session_ids[i].as_deref(),
                phase,
                priority: self.priorities[i],
                active_requests: self.active_requests[i],
                queued_requests: self.queued_requests[i],
                context_tokens: self.context_tokens[i],
                age_ms: self.age_ms[i],
                idle_ms: self.idle_ms[i],
                rank: None,
                paused: phase == SessionPhase::Paused,
                paused_for_ms: 0,
                service_ms: 0,
                tool: None,
            }
        };
        if let Some(signals) = &self.signals {
            for i in 0..n {
                let base = row(i);
                f(SessionRef {
                    rank: signals.ranks.get(i).copied().flatten(),
                    paused: signals.paused.get(i).copied().unwrap_or(base.paused),
                    paused_for_ms: signals.paused_for_ms.get(i).copied().unwrap_or(0),
                    service_ms: signals.service_ms.get(i).copied().unwrap_or(0),
                    tool: signals.tools.get(i).and_then(Option::as_deref),
                    ..base
                });
            }
            return;
        }
        // Borrowed fields: a field is copied only where it held a doubled quote.
        let column = |key| find_fields(&self.extensions, key, n);
        let ranks = column(RANK_COLUMN);
        let paused = column(PAUSED_COLUMN);
        let paused_for = column(PAUSED_FOR_COLUMN);
        let service = column(SERVICE_COLUMN);
        let tools = column(TOOL_COLUMN);
        let millis = |column: &Option<Vec<Option<Cow<'_, str>>>>, i: usize| {
            field(column, i).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        for i in 0..n {
            let base = row(i);
            f(SessionRef {
                rank: field(&ranks, i).and_then(Rank::parse),
                paused: match field(&paused, i) {
                    Some("1" | "true") => true,
                    Some("0" | "false") => false,
                    _ => base.paused,
                },
                paused_for_ms: millis(&paused_for, i),
                service_ms: millis(&service, i),
                tool: field(&tools, i),
                ..base
            });
        }
    }

    /// Since WIT 1.3: refill these columns from `packed-sessions`' lists (wit/README.md has the
    /// layout): `counts` holds nine `u32` columns of `count` entries, `sizes` five `u64` ones,
    /// the ids and tool names are cut from `ids` and `tools` at the offsets `counts` gives.
    /// The trial signals land in [`Sessions::signals`] and the extensions are cleared (the
    /// caller sets those it got). Lists too short for `count` give no sessions, offsets outside
    /// the strings empty ones: never a panic. The columns and strings keep their buffers, so an
    /// instance stops allocating for them after its first calls.
    pub fn unpack(
        &mut self,
        count: usize,
        ids: &str,
        tools: &str,
        counts: &[u32],
        priorities: &[i32],
        sizes: &[u64],
    ) {
        let whole = packed::holds(counts.len(), count, packed::SESSION_COUNTS)
            && packed::holds(sizes.len(), count, packed::SESSION_SIZES)
            && priorities.len() >= count;
        let n = if whole { count } else { 0 };
        let u32s = |c: usize| &counts[c * n..][..n];
        let u64s = |c: usize| &sizes[c * n..][..n];
        let signals = self.signals.get_or_insert_with(SessionSignals::default);

        resize(&mut self.session_ids, n);
        resize(&mut self.parent_session_ids, n);
        resize(&mut signals.tools, n);
        let (id_ends, parent_ends) = (u32s(packed::ID_ENDS), u32s(packed::PARENT_ENDS));
        let (flags, tool_ends) = (u32s(packed::FLAGS), u32s(packed::TOOL_ENDS));
        let (mut at, mut tool_at) = (0, 0);
        for i in 0..n {
            let (id_end, parent_end) = (id_ends[i], parent_ends[i]);
            text(ids, at, id_end).clone_into(&mut self.session_ids[i]);
            let parent =
                (flags[i] & packed::HAS_PARENT != 0).then(|| text(ids, id_end, parent_end));
            set_option(&mut self.parent_session_ids[i], parent);
            at = parent_end;
            let tool =
                (flags[i] & packed::HAS_TOOL != 0).then(|| text(tools, tool_at, tool_ends[i]));
            set_option(&mut signals.tools[i], tool);
            tool_at = tool_ends[i];
        }
        refill(
            &mut self.phases,
            u32s(packed::PHASES).iter().map(|&p| packed::phase(p)),
        );
        refill(&mut self.priorities, priorities[..n].iter().copied());
        refill(
            &mut self.active_requests,
            u32s(packed::ACTIVE).iter().copied(),
        );
        refill(
            &mut self.queued_requests,
            u32s(packed::QUEUED).iter().copied(),
        );
        let sizes = |c: usize| u64s(c).iter().copied();
        refill(&mut self.context_tokens, sizes(packed::CONTEXT_TOKENS));
        refill(&mut self.age_ms, sizes(packed::AGE_MS));
        refill(&mut self.idle_ms, sizes(packed::IDLE_MS));
        refill(&mut signals.paused_for_ms, sizes(packed::PAUSED_FOR_MS));
        refill(&mut signals.service_ms, sizes(packed::SERVICE_MS));
        refill(
            &mut signals.paused,
            flags.iter().map(|f| f & packed::PAUSED != 0),
        );
        let (workers, dp) = (u32s(packed::RANK_WORKERS), u32s(packed::RANK_DP));
        refill(
            &mut signals.ranks,
            (0..n)
                .map(|i| (flags[i] & packed::HAS_RANK != 0).then(|| Rank::new(workers[i], dp[i]))),
        );
        self.extensions.clear();
    }
}

/// `s[start..end]`, or empty when that is not a slice of it (the offsets come from the host).
fn text(s: &str, start: u32, end: u32) -> &str {
    s.get(start as usize..end as usize).unwrap_or("")
}

/// Keep `column`'s buffer and its first `n` values' allocations; default the rest.
fn resize<T: Default>(column: &mut Vec<T>, n: usize) {
    column.truncate(n);
    column.resize_with(n, T::default);
}

/// `column` := `values`, in its buffer.
fn refill<T>(column: &mut Vec<T>, values: impl Iterator<Item = T>) {
    column.clear();
    column.extend(values);
}

/// `slot` := `text`, in its buffer when it has one.
fn set_option(slot: &mut Option<String>, text: Option<&str>) {
    match (slot.as_mut(), text) {
        (Some(owned), Some(text)) => text.clone_into(owned),
        (_, text) => *slot = text.map(str::to_owned),
    }
}

/// Row `i` of a borrowed column, if the host sent the column and the row is known.
fn field<'c>(column: &'c Option<Vec<Option<Cow<'_, str>>>>, i: usize) -> Option<&'c str> {
    column.as_ref().and_then(|c| c[i].as_deref())
}

impl FromIterator<SessionView> for Sessions {
    /// Columns from rows, with the trial signals as extension columns the way the host sends
    /// them (for building inputs in tests).
    fn from_iter<I: IntoIterator<Item = SessionView>>(rows: I) -> Self {
        let rows: Vec<SessionView> = rows.into_iter().collect();
        let mut extensions = Vec::new();
        let mut add = |key: &str, values: Vec<Option<String>>| {
            if !values.is_empty() && values.iter().any(Option::is_some) {
                extensions.push((key.to_owned(), join_column(values)));
            }
        };
        add(
            RANK_COLUMN,
            rows.iter().map(|s| s.rank.map(|r| r.to_string())).collect(),
        );
        add(
            PAUSED_COLUMN,
            rows.iter()
                .map(|s| Some(if s.paused { "1" } else { "0" }.to_owned()))
                .collect(),
        );
        add(
            PAUSED_FOR_COLUMN,
            rows.iter()
                .map(|s| Some(s.paused_for_ms.to_string()))
                .collect(),
        );
        add(
            SERVICE_COLUMN,
            rows.iter()
                .map(|s| Some(s.service_ms.to_string()))
                .collect(),
        );
        add(TOOL_COLUMN, rows.iter().map(|s| s.tool.clone()).collect());
        Self {
            session_ids: rows.iter().map(|s| s.session_id.clone()).collect(),
            parent_session_ids: rows.iter().map(|s| s.parent_session_id.clone()).collect(),
            phases: rows.iter().map(|s| s.phase).collect(),
            priorities: rows.iter().map(|s| s.priority).collect(),
            active_requests: rows.iter().map(|s| s.active_requests).collect(),
            queued_requests: rows.iter().map(|s| s.queued_requests).collect(),
            context_tokens: rows.iter().map(|s| s.context_tokens).collect(),
            age_ms: rows.iter().map(|s| s.age_ms).collect(),
            idle_ms: rows.iter().map(|s| s.idle_ms).collect(),
            extensions,
            signals: None,
        }
    }
}

/// Utilization of every worker rank as columns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Utilization {
    /// Engine server of each rank.
    pub worker_ids: Vec<u32>,
    /// Data-parallel rank within that server.
    pub dp_ranks: Vec<u32>,
    /// Fraction of KV capacity in use, 0.0 to 1.0.
    pub kv_usage: Vec<f32>,
    /// Requests in flight.
    pub active_requests: Vec<u32>,
    /// Requests waiting in the engine's queue.
    pub queue_depth: Vec<u32>,
    /// Whether the host routes to the rank.
    pub healthy: Vec<bool>,
    /// Extra pool-wide signals.
    pub extensions: Extensions,
    /// Since WIT 1.3: each rank's KV capacity in tokens, 0 when unknown, as a typed column;
    /// `None` when it came as the [`KV_CAPACITY_COLUMN`] extension column.
    pub kv_capacity_tokens: Option<Vec<u64>>,
}

impl Utilization {
    /// Number of ranks (the shortest column, so indexing below it never panics).
    pub fn len(&self) -> usize {
        [
            self.worker_ids.len(),
            self.dp_ranks.len(),
            self.kv_usage.len(),
            self.active_requests.len(),
            self.queue_depth.len(),
            self.healthy.len(),
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }

    /// Whether no rank is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every rank as a row, in order, with its KV capacity (typed, or [`KV_CAPACITY_COLUMN`]
    /// decoded).
    pub fn rows(&self) -> Vec<RankUtilization> {
        let n = self.len();
        let capacity = match &self.kv_capacity_tokens {
            Some(_) => None,
            None => find_fields(&self.extensions, KV_CAPACITY_COLUMN, n),
        };
        (0..n)
            .map(|i| RankUtilization {
                rank: Rank::new(self.worker_ids[i], self.dp_ranks[i]),
                kv_usage: self.kv_usage[i],
                active_requests: self.active_requests[i],
                queue_depth: self.queue_depth[i],
                healthy: self.healthy[i],
                kv_capacity_tokens: match &self.kv_capacity_tokens {
                    Some(typed) => typed.get(i).copied().unwrap_or(0),
                    None => field(&capacity, i)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0),
                },
            })
            .collect()
    }

    /// Since WIT 1.3: refill these columns from `packed-utilization`'s lists: `counts` holds
    /// five `u32` columns of `count` entries (`healthy` as 1 or 0). The extensions are cleared
    /// (the caller sets those it got). Lists too short for `count` give no ranks, never a
    /// panic.
    pub fn unpack(&mut self, count: usize, counts: &[u32], kv_usage: &[f32], capacity: &[u64]) {
        let whole = packed::holds(counts.len(), count, packed::RANK_COUNTS)
            && kv_usage.len() >= count
            && capacity.len() >= count;
        let n = if whole { count } else { 0 };
        let u32s = |c: usize| counts[c * n..][..n].iter().copied();
        refill(&mut self.worker_ids, u32s(0));
        refill(&mut self.dp_ranks, u32s(1));
        refill(&mut self.active_requests, u32s(2));
        refill(&mut self.queue_depth, u32s(3));
        refill(&mut self.healthy, u32s(4).map(|h| h != 0));
        refill(&mut self.kv_usage, kv_usage[..n].iter().copied());
        let typed = self.kv_capacity_tokens.get_or_insert_with(Vec::new);
        refill(typed, capacity[..n].iter().copied());
        self.extensions.clear();
    }
}

impl FromIterator<RankUtilization> for Utilization {
    /// Columns from rows, the capacity as the host sends it (for building inputs in tests).
    fn from_iter<I: IntoIterator<Item = RankUtilization>>(rows: I) -> Self {
        let rows: Vec<RankUtilization> = rows.into_iter().collect();
        let capacity: Vec<Option<String>> = rows
            .iter()
            .map(|w| (w.kv_capacity_tokens > 0).then(|| w.kv_capacity_tokens.to_string()))
            .collect();
        let extensions = if capacity.iter().any(Option::is_some) {
            vec![(KV_CAPACITY_COLUMN.to_owned(), join_column(capacity))]
        } else {
            Vec::new()
        };
        Self {
            worker_ids: rows.iter().map(|w| w.rank.worker_id).collect(),
            dp_ranks: rows.iter().map(|w| w.rank.dp_rank).collect(),
            kv_usage: rows.iter().map(|w| w.kv_usage).collect(),
            active_requests: rows.iter().map(|w| w.active_requests).collect(),
            queue_depth: rows.iter().map(|w| w.queue_depth).collect(),
            healthy: rows.iter().map(|w| w.healthy).collect(),
            extensions,
            kv_capacity_tokens: None,
        }
    }
}

/// A request that arrived and is not yet admitted.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Incoming {
    /// The request as the router would see it (its `session_id` tags the actions).
    pub request: Request,
    /// Milliseconds it has waited so far (0 on first arrival).
    pub waited_ms: u64,
}

/// What to do with a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionKind {
    /// Let its waiting requests go to the router.
    Admit,
    /// Keep its waiting requests queued for now; the string says why.
    Hold(String),
    /// Stop admitting its requests until `Resume`.
    Pause,
    /// Undo `Pause`.
    Resume,
    /// Add this delta to its priority (negative lowers it).
    AdjustPriority(i32),
}

/// One admission action, tagged with its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    /// Session the action applies to.
    pub session_id: String,
    /// The action.
    pub kind: ActionKind,
}

impl Action {
    /// `kind` for `session_id`.
    pub fn new(session_id: impl Into<String>, kind: ActionKind) -> Self {
        Self {
            session_id: session_id.into(),
            kind,
        }
    }
}

/// An admission policy. Export it with [`crate::export_admission!`]. Sessions without an action
/// keep their state; an arrival without an action is admitted.
pub trait AdmissionPolicy {
    /// Who the policy is; called once at load.
    fn metadata(&self) -> PolicyMetadata;

    /// Periodic review; `now_ms` is the host's monotonic clock.
    fn tick(&mut self, now_ms: u64, sessions: &Sessions, workers: &Utilization) -> Vec<Action>;

    /// A request arrived for a session. Default: no action, so it is admitted.
    fn arrival(
        &mut self,
        _now_ms: u64,
        _incoming: &Incoming,
        _sessions: &Sessions,
        _workers: &Utilization,
    ) -> Vec<Action> {
        Vec::new()
    }

    /// Since WIT 1.1: the rank `session_id`'s next request should go to (the router then
    /// bypasses its own choice), asked when the host admits a request of it; it must be a
    /// healthy rank of `workers`. `None` (the default): no preference, the router decides.
    fn placement(
        &mut self,
        _now_ms: u64,
        _session_id: &str,
        _sessions: &Sessions,
        _workers: &Utilization,
    ) -> Option<Rank> {
        None
    }

    /// Since WIT 1.1: the parameters the configuration gives the policy; see
    /// [`RouterPolicy::configure`](crate::RouterPolicy::configure). Default: take none.
    fn configure(&mut self, params: &crate::Params) -> Result<(), String> {
        crate::no_params(&self.metadata().name, params)
    }
}
