//! vLLM's exact frames, written by Python (`pyzmq` + `msgpack`), through `run_subscriber`.
//!
//! `tests/python/vllm_publisher.py` plays two lives of an engine; this test drives it and asserts
//! the index block by block. It needs python3 with `pyzmq` and `msgpack`; without them it installs
//! both into a venv at `target/pyenv` (PyPI access needed) and fails loudly if it cannot.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc as std_mpsc;
use support::{DEADLINE, Harness, ours};
use switchyard_core::worker::{Rank, Tier};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn has_deps(python: &Path) -> bool {
    Command::new(python)
        .args(["-c", "import zmq, msgpack"])
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

/// A python3 that can import `zmq` and `msgpack`, installing them once if needed.
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
            run(Command::new(&python).args(["-m", "pip", "install", "-q", "pyzmq", "msgpack"]));
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
    fn start() -> (Script, String, String) {
        let mut child = Command::new(python())
            .arg(workspace().join("tests/python/vllm_publisher.py"))
            .args(["tcp://127.0.0.1:*", "tcp://127.0.0.1:*"])
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
        let script = Script {
            child,
            stdin,
            lines,
        };
        let ready = script.line();
        let mut words = ready.split_whitespace();
        assert_eq!(words.next(), Some("READY"), "{ready}");
        let endpoint = words.next().expect("pub endpoint").to_owned();
        let replay = words.next().expect("replay endpoint").to_owned();
        (script, endpoint, replay)
    }

    fn line(&self) -> String {
        self.lines
            .recv_timeout(DEADLINE)
            .expect("the script answers in time")
    }

    /// Send a command and wait until the script has published it.
    fn command(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("script reads stdin");
        assert_eq!(self.line(), format!("DONE {command}"));
    }
}

impl Drop for Script {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_frames_from_python_build_the_expected_index() {
    let rank = Rank::new(2, 0);
    let (mut script, endpoint, replay) = Script::start();
    let mut sub = Harness::start(rank, endpoint, Some(replay), false);
    sub.joined().await;

    // First life: one chain 0..20 (block 12..16 lost and replayed), its first two blocks copied
    // to CPU; the side block 100..104 stored then removed.
    script.command("go");
    let chain = ours(&(0..20).collect::<Vec<u32>>());
    let side = ours(&[100, 101, 102, 103])[0];
    sub.wait_until("the first life", |index, stats| {
        stats.replays == 1 && chain.iter().all(|&h| index.contains(rank, Tier::Device, h))
    })
    .await;
    sub.settle().await;
    assert_eq!(sub.index.blocks(rank, Tier::Device), 5);
    assert_eq!(sub.index.blocks(rank, Tier::Host), 2);
    assert!(sub.index.contains(rank, Tier::Host, chain[0]));
    assert!(sub.index.contains(rank, Tier::Host, chain[1]));
    assert!(!sub.index.contains(rank, Tier::Device, side));
    assert_eq!(sub.index.node_count(), 5);

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
