//! The README's examples, run as written: what a newcomer pastes must work on a clone.

use crate::support::{Proc, TempFile, chat_text, client};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn readme() -> String {
    std::fs::read_to_string(repo().join("README.md")).unwrap()
}

/// The words of the README's inline command that starts with `start` (a code span may wrap).
fn inline_command(start: &str) -> Vec<String> {
    let readme = readme();
    let from = readme
        .find(&format!("`{start}"))
        .unwrap_or_else(|| panic!("the README has no `{start}...`"));
    let span = readme[from + 1..].split('`').next().unwrap();
    span.split_whitespace().map(str::to_owned).collect()
}

/// What `switchyard serve` prints to try it: its curl line, its body line, and that body.
fn printed_request(proc: &Proc) -> (String, String, Value) {
    let curl = proc.wait_for_line("curl ");
    let data = proc
        .next_line(Instant::now() + Duration::from_secs(10))
        .expect("the request's body line");
    let body = data
        .trim()
        .strip_prefix("-d '")
        .and_then(|d| d.strip_suffix('\''))
        .unwrap_or_else(|| panic!("not a -d line: {data}"));
    (curl, data.clone(), serde_json::from_str(body).unwrap())
}

async fn post(url: &str, body: &Value) -> String {
    let r = client().post(url).json(body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{url}");
    r.text().await.unwrap()
}

#[tokio::test]
async fn the_printed_request_is_the_readmes_and_names_the_configured_model() {
    // The embedded default prints the README's request (for its own address), and it streams.
    let proc = Proc::switchyard(&["serve", "--port", "0"]);
    let (curl, data, body) = printed_request(&proc);
    let url = curl.split_whitespace().nth(1).unwrap();
    let addr = url.split('/').nth(2).unwrap();
    let readme = readme();
    assert!(
        readme.contains(curl.trim().replace(addr, "127.0.0.1:8000").as_str()),
        "the README does not show {curl}"
    );
    assert!(
        readme.contains(data.trim()),
        "the README does not show {data}"
    );
    assert!(!chat_text(&post(url, &body).await, true).is_empty());

    // With a configured model name, the printed request names it, and it is served.
    let config = TempFile::new("switchyard.toml", "[model]\nname = \"house-model\"\n");
    let path = config.path.to_string_lossy().into_owned();
    let proc = Proc::switchyard(&["serve", "--config", &path, "--port", "0"]);
    let (curl, _, body) = printed_request(&proc);
    assert_eq!(body["model"], "house-model");
    let url = curl.split_whitespace().nth(1).unwrap();
    assert!(!chat_text(&post(url, &body).await, true).is_empty());
}

#[test]
fn the_simulate_example_runs_as_written() {
    let words = inline_command("switchyard simulate");
    // Run where a clone's relative paths resolve, without writing into the repository.
    let marker = TempFile::new("README", "a scratch directory");
    let dir = marker.path.parent().unwrap();
    std::os::unix::fs::symlink(repo().join("examples"), dir.join("examples")).unwrap();
    let out = std::process::Command::new(crate::support::switchyard_bin())
        .args(&words[1..])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{words:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report_at = words.iter().position(|w| w == "--report").unwrap() + 1;
    let report: Value =
        serde_json::from_slice(&std::fs::read(dir.join(&words[report_at])).unwrap()).unwrap();
    let hit = |policy: &str| {
        let runs = report["runs"].as_array().unwrap();
        let run = runs.iter().find(|r| r["policy"] == policy).unwrap();
        assert_eq!(run["failed_requests"], 0, "{run}");
        run["prefix_hit_ratio"].as_f64().unwrap()
    };
    // The fixture's shared prefixes are found by KV-aware routing, not by round robin.
    assert!(hit("kv-cost") > 2.0 * hit("round-robin"), "{report}");
}
