//! Fixtures of the `admission` and `kv-hints` worlds: each answers a fixed list (see
//! [`fixed_actions`], [`fixed_hints`]) unless a body says otherwise.
//!
//! Canonical ABI notes: `tick`, `arrival` and `on-events` take more than 16 flat values, so their
//! arguments arrive as one pointer; `now-ms` (a `u64`) is first, at offset 0, for all three.
//! They return a list, so the core function returns a pointer to its (address, length) pair,
//! which lives at 128. An `action` is 20 bytes (session string, then the `action-kind` variant at
//! 8: tag, payload at 12); a `hint` is 40 (session string; `option<tuple<u32, u32>>` at 8 with
//! its payload at 12; the `hint-kind` variant at 24, 8-aligned because of `pin(u64)`, payload
//! at 32). Strings the answers name start at 2048, the list at 2304.

use super::{CORE_PRELUDE, Meta, SHARED_TYPES, TYPES, escape, metadata_data, parse};
use std::time::Duration;
use switchyard_core::admission::{ActionKind, AdmissionAction};
use switchyard_core::kv_hints::{HintKind, HintTier, KvHint};
use switchyard_core::worker::Rank;

/// `now-ms` that makes the [`when_late`] variants misbehave.
pub const POISON_NOW_MS: u64 = 13;

/// Return the fixed answer.
pub const FIXED: &str = "(i32.const 128)";

/// Run `body` first when `now-ms` is [`POISON_NOW_MS`], then return the fixed answer.
pub fn when_late(body: &str) -> String {
    format!(
        "(if (i64.eq (i64.load (local.get 0)) (i64.const {POISON_NOW_MS})) (then {body})) {FIXED}"
    )
}

/// A valid admission policy's metadata.
pub const ADMISSION_META: Meta<'static> = Meta {
    name: "test-admission",
    world: "admission",
    wit_version: "1.0.0",
};

/// A valid KV-hint policy's metadata.
pub const KV_HINTS_META: Meta<'static> = Meta {
    name: "test-kv-hints",
    world: "kv-hints",
    wit_version: "1.0.0",
};

/// What the admission fixture answers: pause `s1`, lower `s2` by 2, hold `s2`.
pub fn fixed_actions() -> Vec<AdmissionAction> {
    vec![
        AdmissionAction::new("s1", ActionKind::Pause),
        AdmissionAction::new("s2", ActionKind::AdjustPriority(-2)),
        AdmissionAction::new("s2", ActionKind::Hold("full".into())),
    ]
}

/// What the KV-hint fixture answers: pin `s1` for 45 s, demote it to host memory on rank 0.0,
/// share it with `s2`.
pub fn fixed_hints() -> Vec<KvHint> {
    vec![
        KvHint::new("s1", HintKind::Pin(Duration::from_secs(45))),
        KvHint {
            target: Some(Rank::new(0, 0)),
            ..KvHint::new("s1", HintKind::Demote(HintTier::Host))
        },
        KvHint::new("s1", HintKind::Share("s2".into())),
    ]
}

/// An `admission` component.
#[derive(Debug)]
pub struct Admission<'a> {
    /// What `metadata` returns.
    pub meta: Meta<'a>,
    /// Body of the core `tick` function (argument pointer in local 0).
    pub tick: String,
    /// Body of the core `arrival` function.
    pub arrival: String,
}

impl Default for Admission<'_> {
    fn default() -> Self {
        Self {
            meta: ADMISSION_META,
            tick: FIXED.into(),
            arrival: FIXED.into(),
        }
    }
}

const ADMISSION_TYPES: &str = r#"
  (type $phase' (enum "queued" "running" "tool-call" "paused" "idle"))
  (export $phase "session-phase" (type $phase'))
  (type $sessions' (record (field "session-ids" (list string))
    (field "parent-session-ids" (list (option string))) (field "phases" (list $phase))
    (field "priorities" (list s32)) (field "active-requests" (list u32))
    (field "queued-requests" (list u32)) (field "context-tokens" (list u64))
    (field "age-ms" (list u64)) (field "idle-ms" (list u64)) (field "extensions" $kv)))
  (export $sessions "sessions" (type $sessions'))
  (type $util' (record (field "worker-ids" (list u32)) (field "dp-ranks" (list u32))
    (field "kv-usage" (list f32)) (field "active-requests" (list u32))
    (field "queue-depth" (list u32)) (field "healthy" (list bool)) (field "extensions" $kv)))
  (export $util "utilization" (type $util'))
  (type $incoming' (record (field "req" $request) (field "waited-ms" u64)))
  (export $incoming "incoming" (type $incoming'))
  (type $kind' (variant (case "admit") (case "hold" string) (case "pause") (case "resume")
    (case "adjust-priority" s32)))
  (export $kind "action-kind" (type $kind'))
  (type $action' (record (field "session-id" string) (field "kind" $kind)))
  (export $action "action" (type $action'))
"#;

impl Admission<'_> {
    /// The component's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut actions = Vec::new();
        // (session, tag, payload words)
        for (session, tag, payload) in [
            (2048, 2, [0, 0]),
            (2050, 4, [-2_i32 as u32, 0]),
            (2050, 1, [2052, 4]),
        ] {
            actions.extend(words(&[session, 2]));
            actions.extend(words(&[tag]));
            actions.extend(words(&payload));
        }
        let core = format!(
            r#"(func (export "tick") (param i32) (result i32) (global.set $heap (i32.const 8192)) {})
    (func (export "arrival") (param i32) (result i32) (global.set $heap (i32.const 8192)) {})"#,
            self.tick, self.arrival
        );
        let lifts = r#"(func (export "tick") (param "now-ms" u64) (param "state" $sessions)
    (param "workers" $util) (result (list $action)) (canon lift (core func $i "tick") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  (func (export "arrival") (param "now-ms" u64) (param "req" $incoming) (param "state" $sessions)
    (param "workers" $util) (result (list $action)) (canon lift (core func $i "arrival") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))"#;
        component(
            &self.meta,
            &core,
            &format!("{TYPES}{ADMISSION_TYPES}"),
            lifts,
            "s1s2full",
            &actions,
            3,
        )
    }
}

/// A `kv-hints` component.
#[derive(Debug)]
pub struct KvHints<'a> {
    /// What `metadata` returns.
    pub meta: Meta<'a>,
    /// Body of the core `on-events` function (argument pointer in local 0).
    pub on_events: String,
}

impl Default for KvHints<'_> {
    fn default() -> Self {
        Self {
            meta: KV_HINTS_META,
            on_events: FIXED.into(),
        }
    }
}

const KV_HINT_TYPES: &str = r#"
  (type $tier' (enum "device" "host" "disk" "shared"))
  (export $tier "tier" (type $tier'))
  (type $tool' (record (field "tool-name" (option string)) (field "context-tokens" u64)))
  (export $tool "tool-call" (type $tool'))
  (type $compaction' (record (field "tokens-before" u64) (field "tokens-after" u64)))
  (export $compaction "compaction" (type $compaction'))
  (type $ekind' (variant (case "turn-end-with-tool-call" $tool) (case "subagent-spawn" string)
    (case "subagent-end" string) (case "compaction" $compaction) (case "thinking-start")
    (case "thinking-end" u32) (case "session-end")))
  (export $ekind "event-kind" (type $ekind'))
  (type $event' (record (field "session-id" string) (field "at-ms" u64) (field "kind" $ekind)
    (field "extensions" $kv)))
  (export $event "lifecycle-event" (type $event'))
  (type $residency' (record (field "session-ids" (list string)) (field "worker-ids" (list u32))
    (field "dp-ranks" (list u32)) (field "device-blocks" (list u32))
    (field "host-blocks" (list u32)) (field "disk-blocks" (list u32))))
  (export $residency "residency" (type $residency'))
  (type $usage' (record (field "worker-ids" (list u32)) (field "dp-ranks" (list u32))
    (field "device-used-blocks" (list u64)) (field "device-capacity-blocks" (list u64))
    (field "host-used-blocks" (list u64)) (field "host-capacity-blocks" (list u64))))
  (export $usage "tier-usage" (type $usage'))
  (type $index' (record (field "residency" $residency) (field "usage" $usage)
    (field "extensions" $kv)))
  (export $index "index-state" (type $index'))
  (type $hkind' (variant (case "share" string) (case "prefetch" $tier) (case "demote" $tier)
    (case "pin" u64) (case "retain") (case "evict")))
  (export $hkind "hint-kind" (type $hkind'))
  (type $hint' (record (field "session-id" string) (field "target" (option (tuple u32 u32)))
    (field "kind" $hkind)))
  (export $hint "hint" (type $hint'))
"#;

impl KvHints<'_> {
    /// The component's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut hints = Vec::new();
        // (target tag, kind tag, payload words): pin(45000), demote(host) on 0.0, share("s2").
        for (target, tag, payload) in [(0, 3, [45_000, 0]), (1, 2, [1, 0]), (0, 0, [2050, 2])] {
            hints.extend(words(&[2048, 2, target, 0, 0, 0, tag, 0]));
            hints.extend(words(&payload));
        }
        let core = format!(
            r#"(func (export "on-events") (param i32) (result i32) (global.set $heap (i32.const 8192)) {})"#,
            self.on_events
        );
        let lifts = r#"(func (export "on-events") (param "now-ms" u64) (param "events" (list $event))
    (param "index" $index) (result (list $hint)) (canon lift (core func $i "on-events") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))"#;
        component(&self.meta, &core, KV_HINT_TYPES, lifts, "s1s2", &hints, 3)
    }
}

fn words(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A component with the shared prelude, `core` functions, `types`, the `metadata` export and
/// `lifts`, answering `count` elements of `list` (with `strings` at 2048).
fn component(
    meta: &Meta<'_>,
    core: &str,
    types: &str,
    lifts: &str,
    strings: &str,
    list: &[u8],
    count: u32,
) -> Vec<u8> {
    parse(&format!(
        r#"(component
  (core module $m
    (memory (export "memory") 1)
    {CORE_PRELUDE}
    {core}
    {metadata}
    (data (i32.const 128) "{answer}") (data (i32.const 2048) "{strings}") (data (i32.const 2304) "{list}"))
  (core instance $i (instantiate $m))
  {SHARED_TYPES}
  {types}
  (func (export "metadata") (result $meta)
    (canon lift (core func $i "metadata") (memory (core memory $i "memory")) (realloc (core func $i "realloc"))))
  {lifts}
)"#,
        metadata = metadata_data(meta),
        answer = escape(&words(&[2304, count])),
        list = escape(list),
    ))
}
