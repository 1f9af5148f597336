//! Agent programs: one per session, tracked from the requests the gateway (or the simulator) sees.
//!
//! A *program* is an agent session (agentic-serving.md section 4); a subagent is a program of its
//! own with a parent. Its activity follows its requests:
//!
//! ```text
//!            arrival                      end with tool call
//!   (new) ───────────> REASONING ───────────────────────────> ACTING ──┐
//!                        ^   │ end without tool call                    │ next arrival
//!                        │   └──────────────────────────> IDLE ─────────┤
//!                        └──────────────────────────────────────────────┘
//! ```
//!
//! and independently it is *active* or *paused* (an admission action; a paused program's next
//! request is held, a running one is never preempted). `token_total` is what its KV holds: the
//! prompt of its arriving request (exact, the gateway tokenized it) and, once it ends, prompt plus
//! completion from the engine's usage. Programs end with a `session-final` request or after
//! [`ProgramConfig::idle_expiry`] without requests.
//!
//! The tracker is pure: time is a `Duration` since the driver's epoch. [`ProgramTracker::sessions`]
//! renders the [`SessionView`]s admission policies see.

use crate::admission::{SessionPhase, SessionView};
use crate::worker::Rank;
use std::collections::BTreeMap;
use std::time::Duration;

/// Tracker settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ProgramConfig {
    /// A program with no request running or waiting for this long is forgotten (its KV is long
    /// gone, and a harness that never sends `session-final` must not leak programs).
    ///
    /// Default: 10 minutes.
    pub idle_expiry: Duration,
}

impl Default for ProgramConfig {
    fn default() -> Self {
        Self {
            idle_expiry: Duration::from_secs(600),
        }
    }
}

/// What a program is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activity {
    /// A request of it is waiting or running: it needs the GPU.
    Reasoning,
    /// Its last response ended with a tool call; the tool runs outside the GPU while its KV waits.
    Acting,
    /// Its last response ended without a tool call (the harness waits for its user).
    Idle,
}

/// Token usage of a finished request, as the engine reported it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
}

/// How a request ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TurnEnd {
    /// The engine's usage; `None` when the request failed or was cancelled before it.
    pub usage: Option<Usage>,
    /// The response ended with a tool call (finish reason `tool_calls` / `tool_use`).
    pub tool_call: bool,
    /// The called tool's name, when known.
    pub tool_name: Option<String>,
    /// The answer's thinking spans, in order (empty: it did not think).
    pub thinking: Vec<ThinkingSpan>,
}

/// A thinking (reasoning) span of an answer, in the answer's tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThinkingSpan {
    /// Tokens of the answer before the span.
    pub offset: u32,
    /// Its length.
    pub tokens: u32,
}

/// One program.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Session id.
    pub session_id: String,
    /// Parent session (for a subagent).
    pub parent_session_id: Option<String>,
    /// What it is doing.
    pub activity: Activity,
    /// Paused by admission: its next request is held.
    pub paused: bool,
    /// When it was paused (meaningful while `paused`).
    pub paused_since: Duration,
    /// Sum of the priority adjustments admission applied; added to its requests' own priority.
    pub priority: i32,
    /// Requests admitted and not finished.
    pub active_requests: u32,
    /// Requests held by admission.
    pub held_requests: u32,
    /// Tokens its KV holds: the arriving prompt, then prompt + completion of its last request.
    pub token_total: u64,
    /// Summed run time of its finished requests (its attained service).
    pub service: Duration,
    /// Where its last (or current) request ran.
    pub rank: Option<Rank>,
    /// Tool of the last turn, if that turn ended with a tool call (`""` when unnamed).
    pub tool: Option<String>,
    /// First request's arrival.
    pub created: Duration,
    /// When its last request ended (its creation before any ended).
    pub last_end: Duration,
    /// Requests finished.
    pub finished_requests: u32,
    /// A `session-final` request arrived: the program ends when nothing runs or waits any more.
    pub ending: bool,
}

/// Programs by state, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgramCounts {
    /// All programs.
    pub total: usize,
    /// Active programs with a request waiting or running.
    pub reasoning: usize,
    /// Active programs in a tool call.
    pub acting: usize,
    /// Active programs waiting for their user.
    pub idle: usize,
    /// Paused programs (whatever their activity).
    pub paused: usize,
}

/// Every live program, by session id (ordered, so views and policies iterate deterministically).
#[derive(Debug, Clone, Default)]
pub struct ProgramTracker {
    config: ProgramConfig,
    programs: BTreeMap<String, Program>,
}

// === impl Program ===

impl Program {
    fn new(session_id: &str, parent: Option<&str>, now: Duration) -> Self {
        Self {
            session_id: session_id.to_owned(),
            parent_session_id: parent.map(str::to_owned),
            activity: Activity::Reasoning,
            paused: false,
            paused_since: now,
            priority: 0,
            active_requests: 0,
            held_requests: 0,
            token_total: 0,
            service: Duration::ZERO,
            rank: None,
            tool: None,
            created: now,
            last_end: now,
            finished_requests: 0,
            ending: false,
        }
    }

    /// The phase the admission contract names (wit `session-phase`).
    pub fn phase(&self) -> SessionPhase {
        if self.active_requests > 0 {
            SessionPhase::Running
        } else if self.paused {
            SessionPhase::Paused
        } else if self.held_requests > 0 {
            SessionPhase::Queued
        } else if self.activity == Activity::Acting {
            SessionPhase::ToolCall
        } else {
            SessionPhase::Idle
        }
    }

    /// No request of it runs or waits.
    pub fn is_quiet(&self) -> bool {
        self.active_requests == 0 && self.held_requests == 0
    }

    /// The view an admission policy sees at `now`.
    pub fn view(&self, now: Duration) -> SessionView {
        let (id, parent, tool) = (&self.session_id, &self.parent_session_id, &self.tool);
        self.view_with(id.clone(), parent.clone(), tool.clone(), now)
    }

    /// [`Program::view`] into `row`, a view of any program from an earlier call: its strings'
    /// buffers are reused.
    pub fn view_into(&self, row: &mut SessionView, now: Duration) {
        let id = reuse(std::mem::take(&mut row.session_id), &self.session_id);
        let parent = reuse_option(
            row.parent_session_id.take(),
            self.parent_session_id.as_deref(),
        );
        let tool = reuse_option(row.tool.take(), self.tool.as_deref());
        *row = self.view_with(id, parent, tool, now);
    }

    fn view_with(
        &self,
        session_id: String,
        parent_session_id: Option<String>,
        tool: Option<String>,
        now: Duration,
    ) -> SessionView {
        SessionView {
            session_id,
            parent_session_id,
            phase: self.phase(),
            priority: self.priority,
            active_requests: self.active_requests,
            queued_requests: self.held_requests,
            context_tokens: self.token_total,
            age: now.saturating_sub(self.created),
            idle: if self.active_requests > 0 {
                Duration::ZERO
            } else {
                now.saturating_sub(self.last_end)
            },
            rank: self.rank,
            paused: self.paused,
            paused_for: if self.paused {
                now.saturating_sub(self.paused_since)
            } else {
                Duration::ZERO
            },
            service: self.service,
            tool,
        }
    }
}

/// `text` in `buffer`'s allocation.
fn reuse(mut buffer: String, text: &str) -> String {
    text.clone_into(&mut buffer);
    buffer
}

/// `text` in `buffer`'s allocation, if both are there.
fn reuse_option(buffer: Option<String>, text: Option<&str>) -> Option<String> {
    text.map(|text| reuse(buffer.unwrap_or_default(), text))
}

// === impl ProgramTracker ===

impl ProgramTracker {
    /// No programs yet.
    pub fn new(config: ProgramConfig) -> Self {
        Self {
            config,
            programs: BTreeMap::new(),
        }
    }

    /// Settings in force.
    pub fn config(&self) -> &ProgramConfig {
        &self.config
    }

    /// The program of `session_id`.
    pub fn get(&self, session_id: &str) -> Option<&Program> {
        self.programs.get(session_id)
    }

    /// The program of `session_id`, to change.
    pub fn get_mut(&mut self, session_id: &str) -> Option<&mut Program> {
        self.programs.get_mut(session_id)
    }

    /// Every program, by session id.
    pub fn iter(&self) -> impl Iterator<Item = &Program> {
        self.programs.values()
    }

    /// Live programs.
    pub fn len(&self) -> usize {
        self.programs.len()
    }

    /// No live program.
    pub fn is_empty(&self) -> bool {
        self.programs.is_empty()
    }

    /// A request of `session_id` arrived with a prompt of `prompt_tokens`: the program (created
    /// if new) is REASONING and has one more request waiting for admission.
    pub fn arrive(
        &mut self,
        session_id: &str,
        parent: Option<&str>,
        prompt_tokens: u32,
        now: Duration,
    ) -> &mut Program {
        let program = self
            .programs
            .entry(session_id.to_owned())
            .or_insert_with(|| Program::new(session_id, parent, now));
        program.activity = Activity::Reasoning;
        program.held_requests += 1;
        if prompt_tokens > 0 {
            // The prompt is what the KV will hold once it runs (after a compaction it shrinks).
            program.token_total = u64::from(prompt_tokens);
        }
        program
    }

    /// A waiting request of `session_id` was admitted (it goes to the router now).
    pub fn admit(&mut self, session_id: &str) {
        if let Some(p) = self.programs.get_mut(session_id) {
            p.held_requests = p.held_requests.saturating_sub(1);
            p.active_requests += 1;
        }
    }

    /// A waiting request of `session_id` went away before admission (client gone).
    pub fn withdraw(&mut self, session_id: &str, now: Duration) {
        if let Some(p) = self.programs.get_mut(session_id) {
            p.held_requests = p.held_requests.saturating_sub(1);
            if p.is_quiet() && p.activity == Activity::Reasoning {
                p.activity = Activity::Idle;
                p.last_end = now;
            }
        }
        self.end_if_done(session_id);
    }

    /// An admitted request of `session_id` was placed on `rank`.
    pub fn start(&mut self, session_id: &str, rank: Rank) {
        if let Some(p) = self.programs.get_mut(session_id) {
            p.rank = Some(rank);
        }
    }

    /// An admitted request of `session_id` ended after running for `ran`.
    pub fn finish(&mut self, session_id: &str, end: &TurnEnd, ran: Duration, now: Duration) {
        let Some(p) = self.programs.get_mut(session_id) else {
            return;
        };
        p.active_requests = p.active_requests.saturating_sub(1);
        p.service += ran;
        p.last_end = now;
        if let Some(usage) = end.usage {
            p.finished_requests += 1;
            p.token_total = u64::from(usage.prompt_tokens) + u64::from(usage.completion_tokens);
        }
        if p.is_quiet() {
            p.activity = if end.tool_call {
                Activity::Acting
            } else {
                Activity::Idle
            };
        }
        p.tool = end
            .tool_call
            .then(|| end.tool_name.clone().unwrap_or_default());
        self.end_if_done(session_id);
    }

    /// A `session-final` request of `session_id` arrived: end the program once it is quiet.
    pub fn mark_final(&mut self, session_id: &str) {
        if let Some(p) = self.programs.get_mut(session_id) {
            p.ending = true;
        }
    }

    /// Forget `session_id` now (the harness ended it). Returns the program.
    pub fn end(&mut self, session_id: &str) -> Option<Program> {
        self.programs.remove(session_id)
    }

    /// Forget quiet programs idle for [`ProgramConfig::idle_expiry`]; returns them.
    pub fn expire(&mut self, now: Duration) -> Vec<Program> {
        let expiry = self.config.idle_expiry;
        let stale: Vec<String> = self
            .programs
            .values()
            .filter(|p| p.is_quiet() && now.saturating_sub(p.last_end) >= expiry)
            .map(|p| p.session_id.clone())
            .collect();
        stale
            .iter()
            .filter_map(|id| self.programs.remove(id))
            .collect()
    }

    /// Every program as admission policies see it at `now`.
    pub fn sessions(&self, now: Duration) -> Vec<SessionView> {
        self.programs.values().map(|p| p.view(now)).collect()
    }

    /// [`ProgramTracker::sessions`] into `rows`, reusing the rows (and their strings) an
    /// earlier call left there: the view of every program is built on every admission call.
    pub fn sessions_into(&self, rows: &mut Vec<SessionView>, now: Duration) {
        rows.truncate(self.programs.len());
        for (n, program) in self.programs.values().enumerate() {
            match rows.get_mut(n) {
                Some(row) => program.view_into(row, now),
                None => rows.push(program.view(now)),
            }
        }
    }

    /// Programs by state.
    pub fn counts(&self) -> ProgramCounts {
        let mut counts = ProgramCounts {
            total: self.programs.len(),
            ..ProgramCounts::default()
        };
        for p in self.programs.values() {
            if p.paused {
                counts.paused += 1;
                continue;
            }
            match p.activity {
                Activity::Reasoning => counts.reasoning += 1,
                Activity::Acting => counts.acting += 1,
                Activity::Idle => counts.idle += 1,
            }
        }
        counts
    }

    fn end_if_done(&mut self, session_id: &str) {
        if self
            .programs
            .get(session_id)
            .is_some_and(|p| p.ending && p.is_quiet())
        {
            self.programs.remove(session_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn end(prompt: u32, completion: u32, tool: Option<&str>) -> TurnEnd {
        TurnEnd {
            usage: Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
            }),
            tool_call: tool.is_some(),
            tool_name: tool.map(str::to_owned),
            thinking: Vec::new(),
        }
    }

    #[test]
    fn a_turn_cycle_goes_reasoning_acting_reasoning_idle() {
        let mut t = ProgramTracker::new(ProgramConfig::default());
        t.arrive("s", None, 1_000, secs(0));
        assert_eq!(t.get("s").map(Program::phase), Some(SessionPhase::Queued));
        t.admit("s");
        t.start("s", Rank::new(2, 0));
        let p = t.get("s").unwrap();
        assert_eq!(
            (p.activity, p.phase(), p.token_total),
            (Activity::Reasoning, SessionPhase::Running, 1_000)
        );

        t.finish("s", &end(1_000, 50, Some("bash")), secs(3), secs(3));
        let p = t.get("s").unwrap();
        assert_eq!(p.activity, Activity::Acting);
        assert_eq!(p.phase(), SessionPhase::ToolCall);
        assert_eq!(p.token_total, 1_050);
        assert_eq!(p.rank, Some(Rank::new(2, 0)));
        assert_eq!(p.tool.as_deref(), Some("bash"));
        let v = p.view(secs(10));
        assert_eq!((v.idle, v.service, v.age), (secs(7), secs(3), secs(10)));

        t.arrive("s", None, 1_200, secs(10));
        assert_eq!(t.get("s").unwrap().activity, Activity::Reasoning);
        assert_eq!(t.get("s").unwrap().token_total, 1_200);
        t.admit("s");
        t.finish("s", &end(1_200, 10, None), secs(2), secs(12));
        let p = t.get("s").unwrap();
        assert_eq!(
            (p.activity, p.phase()),
            (Activity::Idle, SessionPhase::Idle)
        );
        assert_eq!(p.tool, None);
        assert_eq!(p.service, secs(5));
        assert_eq!(p.finished_requests, 2);
    }

    #[test]
    fn paused_programs_show_paused_unless_running() {
        let mut t = ProgramTracker::new(ProgramConfig::default());
        t.arrive("s", Some("parent"), 10, secs(0));
        t.admit("s");
        let p = t.get_mut("s").unwrap();
        p.paused = true;
        p.paused_since = secs(1);
        // Marked while running: it finishes its request first.
        assert_eq!(p.phase(), SessionPhase::Running);
        assert!(p.view(secs(4)).paused);
        assert_eq!(p.view(secs(4)).paused_for, secs(3));
        t.finish("s", &end(10, 1, Some("grep")), secs(1), secs(2));
        assert_eq!(t.get("s").unwrap().phase(), SessionPhase::Paused);
        assert_eq!(
            t.get("s").unwrap().parent_session_id.as_deref(),
            Some("parent")
        );
        assert_eq!(t.counts().paused, 1);
    }

    #[test]
    fn views_refilled_in_place_are_the_fresh_ones() {
        let mut t = ProgramTracker::new(ProgramConfig::default());
        let mut rows = Vec::new();
        let mut check = |t: &ProgramTracker, now| {
            t.sessions_into(&mut rows, now);
            assert_eq!(rows, t.sessions(now));
        };
        for (i, id) in ["a", "bb", "c-with-a-longer-id", "d"]
            .into_iter()
            .enumerate()
        {
            let parent = (i % 2 == 1).then_some("a");
            t.arrive(id, parent, 100, secs(0));
        }
        t.admit("a");
        t.finish("a", &end(100, 5, Some("grep")), secs(1), secs(2));
        check(&t, secs(3));
        // Programs leave (fewer rows), others come with other parents and tools.
        t.end("bb");
        t.end("c-with-a-longer-id");
        check(&t, secs(4));
        t.arrive("e", Some("d"), 10, secs(5));
        t.admit("d");
        t.finish("d", &end(10, 1, None), secs(1), secs(6));
        t.admit("a");
        t.finish(
            "a",
            &end(100, 5, Some("a-much-longer-tool-name")),
            secs(1),
            secs(7),
        );
        check(&t, secs(8));
    }

    #[test]
    fn session_final_ends_the_program_when_quiet() {
        let mut t = ProgramTracker::new(ProgramConfig::default());
        t.arrive("s", None, 10, secs(0));
        t.mark_final("s");
        t.admit("s");
        assert!(t.get("s").is_some(), "still running");
        t.finish("s", &end(10, 1, None), secs(1), secs(1));
        assert!(t.get("s").is_none());
        assert!(t.is_empty());
    }

    #[test]
    fn quiet_programs_expire_after_the_idle_time() {
        let mut t = ProgramTracker::new(ProgramConfig {
            idle_expiry: secs(60),
        });
        t.arrive("quiet", None, 10, secs(0));
        t.admit("quiet");
        t.finish("quiet", &end(10, 1, Some("x")), secs(1), secs(1));
        t.arrive("busy", None, 10, secs(0));
        t.admit("busy");
        assert!(t.expire(secs(60)).is_empty(), "59 s idle is not enough");
        let gone = t.expire(secs(61));
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].session_id, "quiet");
        assert!(t.get("busy").is_some(), "a running program never expires");
    }

    #[test]
    fn a_failed_request_keeps_the_known_token_total() {
        let mut t = ProgramTracker::new(ProgramConfig::default());
        t.arrive("s", None, 500, secs(0));
        t.admit("s");
        t.finish("s", &TurnEnd::default(), secs(1), secs(1));
        let p = t.get("s").unwrap();
        assert_eq!((p.token_total, p.finished_requests), (500, 0));
        assert_eq!(p.activity, Activity::Idle);
        t.arrive("s", None, 0, secs(2));
        t.withdraw("s", secs(3));
        let counts = t.counts();
        assert_eq!((counts.total, counts.idle), (1, 1));
    }
}
