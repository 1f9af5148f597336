//! What engines written in Python send us, and what we send them, against the engines' own code.
//! Event streams go through `run_subscriber` and are asserted block by block:
//!
//! - `tests/python/vllm_publisher.py`, our stand-in writing vLLM's frames by hand with `msgpack`:
//!   both msgspec encodings, and the replay answers of older vLLM releases (no topic frame);
//! - `tests/python/engine_publisher.py`, vLLM's and SGLang's own `kv_events.py` (pinned releases
//!   from PyPI, loaded without the rest of the engine): their event classes, msgspec encoding and
//!   `ZmqEventPublisher`, with a real engine restart (new sockets on the same ports);
//! - and the other way round, `tests/python/engine_decoder.py`: the mock engines' events decoded
//!   by those engines' own classes, and the `kv_hints` envelope the gateway sends vLLM decoded
//!   by vLLM's `KvHintsEnvelope`.
//!
//! They need python3 with `pyzmq`, `msgpack`, `msgspec` and `pydantic` (SGLang's module imports
//! it); without them they install all four into a venv at `target/pyenv` (PyPI access needed) and
//! fail loudly if they cannot.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;
use support::{DEADLINE, Harness, free_endpoint, ours};
use switchyard_core::index::KvIndex;
use switchyard_core::kv_hints::HintTier;
use switchyard_core::kv_hints::actions::{
    ActionType, BlockPayload, HintAction, KvHintsEnvelope, PROTOCOL_VERSION,
};
use switchyard_core::worker::{Rank, Tier};
use switchyard_kv_events::wire::{Encoding, EngineHash, EventBatch, KvEvent, encode_batch};

/// A free port on 127.0.0.1, picked by the binding socket.
const ANY_PORT: &str = "tcp://127.0.0.1:*";

/// A script's first answer may wait for the engine's module to be fetched from PyPI (~90 MB
/// for both engines, once).
const FIRST_ANSWER: Duration = Duration::from_secs(600);

/// What the scripts import, as `pip` and `import` name them.
const PACKAGES: [(&str, &str); 4] = [
    ("pyzmq", "zmq"),
    ("msgpack", "msgpack"),
    ("msgspec", "msgspec"),
    ("pydantic", "pydantic"),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn has_deps(python: &Path) -> bool {
    let imports = PACKAGES.map(|(_, module)| module).join(", ");
    Command::new(python)
        .args(["-c", &format!("import {imports}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn run(command: &mut Command) {
    let status = command.status();
    assert!(
        status.as_ref().is_ok_and(|s| s.success()),
        "{command:?} failed ({status:?}): this test needs python3 with venv and pip, and PyPI access"
    );
}

/// A python3 that can import [`PACKAGES`], installing them once if needed.
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let system = PathBuf::from("python3");
        if has_deps(&system) {
            return system;
        }
        let venv = workspace().join("target/pyenv");
        let python = venv.join("bin/python");
        if !has_deps(&python) {
            run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
            run(Command::new(&python)
                .args(["-m", "pip", "install", "-q"])
                .args(PACKAGES.map(|(package, _)| package)));
        }
        python
    })
}

/// The script as a child process, killed when dropped.
struct Script {
    child: Child,
    stdin: ChildStdin,
    lines: std_mpsc::Receiver<String>,
}

impl Script {
    /// Run `tests/python/<script>` with `args`.
    fn spawn(script: &str, args: &[&str]) -> Script {
        let mut child = Command::new(python())
            .arg(workspace().join("tests/python").join(script))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, lines) = std_mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Script {
            child,
            stdin,
            lines,
        }
    }

    /// Run a publisher script; it prints its PUB and replay endpoints once it is up.
    fn start(script: &str, args: &[&str]) -> (Script, String, String) {
        let script = Script::spawn(script, args);
        let ready = script.line(FIRST_ANSWER);
        let mut words = ready.split_whitespace();
        assert_eq!(words.next(), Some("READY"), "{ready}");
        let endpoint = words.next().expect("pub endpoint").to_owned();
        let replay = words.next().expect("replay endpoint").to_owned();
        (script, endpoint, replay)
    }

    fn line(&self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .expect("the script answers in time")
    }

    /// Send one line and return the script's answer.
    fn ask(&mut self, line: &str, within: Duration) -> String {
        writeln!(self.stdin, "{line}").expect("script reads stdin");
        self.line(within)
    }

    /// Send a command and wait until the script has published it.
    fn command(&mut self, command: &str) {
        assert_eq!(self.ask(command, DEADLINE), format!("DONE {command}"));
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Both publishers' first life: the chain 0..20 on the device, its first two blocks in CPU
/// memory too, the side block 100..104 gone, nothing else.
fn assert_the_first_life(index: &KvIndex, rank: Rank) {
    let chain = ours(&(0..20).collect::<Vec<u32>>());
    assert_eq!(index.blocks(rank, Tier::Device), 5);
    assert_eq!(index.blocks(rank, Tier::Host), 2);
    assert!(index.contains(rank, Tier::Host, chain[0]));
    assert!(index.contains(rank, Tier::Host, chain[1]));
    assert!(!index.contains(rank, Tier::Device, ours(&[100, 101, 102, 103])[0]));
    assert_eq!(index.node_count(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_frames_from_python_build_the_expected_index() {
    let rank = Rank::new(2, 0);
    let (mut script, endpoint, replay) = Script::start("vllm_publisher.py", &[ANY_PORT, ANY_PORT]);
    let mut sub = Harness::start(rank, endpoint, Some(replay), false);
    sub.joined().await;

    // First life: one chain 0..20 (block 12..16 lost and replayed), its first two blocks copied
    // to CPU; the side block 100..104 stored then removed.
    script.command("go");
    let chain = ours(&(0..20).collect::<Vec<u32>>());
    sub.wait_until("the first life", |index, stats| {
        stats.replays == 1 && chain.iter().all(|&h| index.contains(rank, Tier::Device, h))
    })
    .await;
    sub.settle().await;
    assert_the_first_life(&sub.index, rank);

    // Second life: sequence back to 0 without AllBlocksCleared, bytes hashes.
    script.command("restart");
    let second = ours(&(200..212).collect::<Vec<u32>>());
    sub.wait_until("the second life", |_, stats| stats.messages == 8)
        .await;
    sub.settle().await;
    assert!(sub.index.contains(rank, Tier::Device, second[0]));
    assert!(sub.index.contains(rank, Tier::Device, second[1]));
    assert_eq!(sub.index.blocks(rank, Tier::Device), 2);
    assert_eq!(sub.index.blocks(rank, Tier::Host), 0);
    assert_eq!(sub.index.node_count(), 2);

    let stats = sub.stats.snapshot();
    assert_eq!(
        (
            stats.restarts,
            stats.gaps,
            stats.replay_failures,
            stats.clears,
            stats.malformed
        ),
        (1, 1, 0, 0, 0)
    );
    sub.stop().await;
}

/// vLLM's publisher connecting to the gateway, which binds (vLLM connects to an endpoint without
/// `*`); a restart connects again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllms_own_publisher_builds_the_expected_index() {
    let rank = Rank::new(3, 0);
    let endpoint = free_endpoint();
    let (script, _, replay) = Script::start("engine_publisher.py", &["vllm", &endpoint, ANY_PORT]);
    let sub = Harness::start(rank, endpoint, Some(replay), true);
    own_publisher_builds_the_expected_index(script, sub, rank, true).await;
}

/// SGLang's publisher binding, the gateway connecting (the engines' default); a restart binds the
/// same ports again and the gateway's socket reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglangs_own_publisher_builds_the_expected_index() {
    let rank = Rank::new(3, 0);
    let (script, endpoint, replay) =
        Script::start("engine_publisher.py", &["sglang", ANY_PORT, ANY_PORT]);
    let sub = Harness::start(rank, endpoint, Some(replay), false);
    own_publisher_builds_the_expected_index(script, sub, rank, false).await;
}

/// SGLang at its default page size of one token, under the gateway's 4-token blocks: every
/// four pages make one of our blocks, gathered across stores, and a block goes with its last
/// page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglangs_own_one_token_pages_make_our_blocks() {
    let rank = Rank::new(4, 0);
    let (mut script, endpoint, replay) =
        Script::start("engine_publisher.py", &["sglang", ANY_PORT, ANY_PORT]);
    let mut sub = Harness::start(rank, endpoint, Some(replay), false);
    sub.joined().await;
    // Blocks 0 and 1 (block 1 from pages of both stores); block 2 stored, then evicted.
    script.command("pages");
    let blocks = ours(&(600..612).collect::<Vec<u32>>());
    sub.wait_until("the pages", |index, stats| {
        stats.messages == 3
            && index.contains(rank, Tier::Device, blocks[1])
            && !index.contains(rank, Tier::Device, blocks[2])
    })
    .await;
    sub.settle().await;
    assert!(sub.index.contains(rank, Tier::Device, blocks[0]));
    assert_eq!(sub.index.blocks(rank, Tier::Device), 2);
    let stats = sub.stats.snapshot();
    assert_eq!((stats.unaligned_stores, stats.malformed), (0, 0));
    sub.stop().await;
}

/// vLLM with blocks twice the gateway's (a hybrid model's attention blocks are hundreds of
/// tokens): each is indexed as the two of ours it holds, and goes with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllms_own_large_blocks_hold_runs_of_ours() {
    let rank = Rank::new(5, 0);
    let endpoint = free_endpoint();
    let (mut script, _, replay) =
        Script::start("engine_publisher.py", &["vllm", &endpoint, ANY_PORT]);
    let mut sub = Harness::start(rank, endpoint, Some(replay), true);
    sub.joined().await;
    script.command("large");
    let blocks = ours(&(700..724).collect::<Vec<u32>>());
    sub.wait_until("the large blocks", |index, stats| {
        stats.messages == 3
            && index.contains(rank, Tier::Device, blocks[3])
            && !index.contains(rank, Tier::Device, blocks[4])
    })
    .await;
    sub.settle().await;
    assert_eq!(sub.index.blocks(rank, Tier::Device), 4);
    let stats = sub.stats.snapshot();
    assert_eq!((stats.unaligned_stores, stats.malformed), (0, 0));
    sub.stop().await;
}

/// `engine_publisher.py`'s two lives, through `sub`.
async fn own_publisher_builds_the_expected_index(
    mut script: Script,
    mut sub: Harness,
    rank: Rank,
    vllm: bool,
) {
    sub.joined().await;

    // First life: the chain 0..20 over six live batches (12..16 dropped by the PUB socket and
    // replayed from the engine's buffer), its first two blocks copied to CPU memory; the side
    // block 100..104 stored then removed; 300..304 hashed with a cache salt and a short block of
    // one token, so neither is indexed.
    // SGLang sends the chain's last block, 16..20, as an EAGLE bigram page.
    script.command("go");
    let chain = ours(&(0..20).collect::<Vec<u32>>());
    let salted = ours(&[300, 301, 302, 303])[0];
    // vLLM's first life ends with a store of a sliding-window group, not routed on.
    let live = if vllm { 7 } else { 6 };
    sub.wait_until("the first life", |index, stats| {
        stats.replays == 1
            && stats.messages == live
            && chain.iter().all(|&h| index.contains(rank, Tier::Device, h))
    })
    .await;
    sub.settle().await;
    assert_the_first_life(&sub.index, rank);
    assert!(!sub.index.contains(rank, Tier::Device, salted));
    assert!(
        !sub.index
            .contains(rank, Tier::Device, ours(&[400, 401, 402, 403])[0])
    );
    let stats = sub.stats.snapshot();
    assert_eq!(
        (stats.gaps, stats.replay_failures, stats.malformed),
        (1, 0, 0)
    );
    assert_eq!(stats.keyed_stores, 1, "the salted store");
    assert_eq!(stats.unaligned_stores, 1, "the short block");

    // Second life: the engine's sockets closed and bound again, its sequence back to 0. The
    // subscriber reconnects, clears the rank and replays the new stream from its start.
    script.command("restart");
    let second = ours(&(200..212).collect::<Vec<u32>>());
    sub.wait_until("the second life", |index, _| {
        index.contains(rank, Tier::Device, second[1])
            && !index.contains(rank, Tier::Device, chain[0])
    })
    .await;
    sub.settle().await;
    assert!(sub.index.contains(rank, Tier::Device, second[0]));
    assert!(!sub.index.contains(rank, Tier::Device, second[2]));
    assert_eq!(sub.index.blocks(rank, Tier::Device), 2);
    assert_eq!(sub.index.blocks(rank, Tier::Host), 0);
    assert_eq!(sub.index.node_count(), 2);
    let stats = sub.stats.snapshot();
    assert!(stats.clears + stats.restarts >= 1, "{stats:?}");
    assert_eq!((stats.replay_failures, stats.malformed), (0, 0));
    sub.stop().await;
}

/// The mock engines publish events in map form (their default), which vLLM's and SGLang's own
/// classes decode field for field; the array form is older vLLM's, which they refuse.
#[test]
fn the_engines_own_classes_decode_what_the_mock_engines_publish() {
    let stored =
        |hashes: &[u64], parent, tokens: Vec<u32>, block_size, medium: &str| KvEvent::BlockStored {
            block_hashes: hashes.iter().copied().map(EngineHash).collect(),
            parent_block_hash: parent,
            token_ids: tokens,
            block_size,
            lora_id: None,
            lora_name: None,
            extra_keys: false,
            kv_cache_spec_kind: None,
            medium: Some(medium.to_owned()),
            group_idx: None,
        };
    let batch = EventBatch {
        ts: 1_700_000_000.5,
        events: vec![
            stored(
                &[u64::MAX - 7, 42],
                Some(EngineHash(1 << 63)),
                (0..8).collect(),
                4,
                "GPU",
            ),
            stored(&[42], None, Vec::new(), 0, "CPU"),
            KvEvent::BlockRemoved {
                block_hashes: vec![EngineHash(42)],
                medium: Some("GPU".to_owned()),
                group_idx: None,
            },
            KvEvent::AllBlocksCleared,
        ],
        dp_rank: Some(2),
    };
    let hex = |bytes: Vec<u8>| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for engine in ["vllm", "sglang"] {
        let mut decoder = Script::spawn("engine_decoder.py", &[engine, "kv-events"]);
        let answer = decoder.ask(&hex(encode_batch(&batch, Encoding::Map)), FIRST_ANSWER);
        let decoded: serde_json::Value =
            serde_json::from_str(&answer).unwrap_or_else(|_| panic!("{engine}: {answer}"));
        assert_eq!(decoded["rank"], 2, "{engine}");
        let events = decoded["events"].as_array().expect("events");
        let types: Vec<_> = events.iter().map(|event| event["type"].clone()).collect();
        assert_eq!(
            types,
            [
                "BlockStored",
                "BlockStored",
                "BlockRemoved",
                "AllBlocksCleared"
            ],
            "{engine}"
        );
        let first = &events[0];
        assert_eq!(
            first["block_hashes"],
            serde_json::json!([u64::MAX - 7, 42]),
            "{engine}"
        );
        assert_eq!(first["parent_block_hash"], 1u64 << 63, "{engine}");
        assert_eq!(
            first["token_ids"],
            serde_json::json!([0, 1, 2, 3, 4, 5, 6, 7]),
            "{engine}"
        );
        assert_eq!(
            (&first["block_size"], &first["medium"]),
            (&4.into(), &"GPU".into())
        );
        let offload = &events[1];
        assert_eq!(offload["token_ids"], serde_json::json!([]), "{engine}");
        assert_eq!(
            (&offload["block_size"], &offload["medium"]),
            (&0.into(), &"CPU".into())
        );
        assert_eq!(
            events[2]["block_hashes"],
            serde_json::json!([42]),
            "{engine}"
        );

        let answer = decoder.ask(&hex(encode_batch(&batch, Encoding::Array)), DEADLINE);
        assert!(answer.starts_with("ERROR"), "{engine}: {answer}");
    }
}

/// The envelope the gateway puts in a request's `kv_hints` field (and posts to a worker's hint
/// endpoint), as vLLM's own `KvHintsEnvelope` decodes it: every action type, every payload field.
#[test]
fn vllms_own_class_decodes_the_kv_hints_envelope() {
    let payload = |tier, ttl_ms| BlockPayload {
        block_hashes: vec![u64::MAX - 1, 7],
        tier,
        ttl_ms,
        session_id: Some("s1".to_owned()),
    };
    let actions = ActionType::ALL
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let (tier, ttl_ms) = match kind {
                ActionType::Demote => (Some(HintTier::Host), None),
                ActionType::Prefetch => (Some(HintTier::Device), None),
                ActionType::Pin => (None, Some(30_000)),
                _ => (None, None),
            };
            HintAction::new(format!("a{i}"), kind, payload(tier, ttl_ms))
        })
        .collect();
    let envelope = KvHintsEnvelope {
        protocol_version: PROTOCOL_VERSION.to_owned(),
        message_id: "m1".to_owned(),
        actions,
    };
    let sent = serde_json::to_value(&envelope).expect("serializes");
    let mut decoder = Script::spawn("engine_decoder.py", &["vllm", "kv-hints"]);
    let answer = decoder.ask(&sent.to_string(), FIRST_ANSWER);
    let decoded: serde_json::Value =
        serde_json::from_str(&answer).unwrap_or_else(|_| panic!("{answer}"));
    assert_eq!(decoded, sent, "vLLM's class keeps every field as sent");
    assert_eq!(decoded["actions"][0]["action_type"], "switchyard.kv.demote");

    // The class is strict: an envelope without its message id is refused.
    let mut incomplete = sent.clone();
    incomplete
        .as_object_mut()
        .expect("object")
        .remove("message_id");
    let answer = decoder.ask(&incomplete.to_string(), DEADLINE);
    assert!(answer.starts_with("ERROR"), "{answer}");
}
