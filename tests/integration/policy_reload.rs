//! Hot-swapping Wasm routing policies under continuous traffic, by writing files into the
//! watched policy directory: no request may fail, and each valid swap shows in the routing
//! decisions (the `x-switchyard-worker` header) within one debounce window.
//!
//! The policies are the host's inline WAT fixtures: `PICK_FIRST` and `PICK_LAST` make decisions
//! that differ on every request, so a swap is visible at once; the trapping and the looping
//! policies pass their canary and trap or spin on real traffic, so the native fallback must carry
//! them.

use crate::support::{Gateway, MockEngine, TempFile, client, eventually, get_text, metric_sum};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_policy_host::test_util::{Router, SPIN, TRAP, route, unless_canary};

const MODEL: &str = "smollm2-135m-instruct";
const DEBOUNCE: Duration = Duration::from_millis(200);
/// How long a swap may take to show before the test gives up: generous, since a debug build
/// compiles each component under whatever else the machine runs.
const SETTLE: Duration = Duration::from_secs(30);
const TOKEN: &str = "test-admin-token";

fn component(route: String) -> Vec<u8> {
    Router {
        route,
        ..Router::default()
    }
    .bytes()
}

/// Write like cargo or an editor: a temporary file renamed into place.
fn install(dir: &Path, bytes: &[u8]) {
    let tmp = dir.join(".active.wasm.tmp");
    std::fs::write(&tmp, bytes).unwrap();
    // Whatever the umask: the loader refuses group- or other-writable policy files.
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    std::fs::rename(tmp, dir.join("active.wasm")).unwrap();
}

/// Responses seen by the traffic loops: (when, worker header) per success, failures counted.
#[derive(Default)]
struct Traffic {
    seen: Mutex<Vec<(Instant, String)>>,
    failures: AtomicU64,
    stop: AtomicBool,
}

impl Traffic {
    async fn run(self: Arc<Self>, url: String, lane: usize) {
        let http = client();
        let mut n = 0;
        while !self.stop.load(Ordering::Relaxed) {
            n += 1;
            let body = json!({"model": MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": format!("lane {lane} request {n}")}]});
            match http
                .post(format!("{url}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
            {
                Ok(r) if r.status() == 200 => {
                    let worker = r.headers()["x-switchyard-worker"]
                        .to_str()
                        .unwrap()
                        .to_string();
                    let _ = r.bytes().await;
                    self.seen.lock().unwrap().push((Instant::now(), worker));
                }
                Ok(r) => {
                    eprintln!(
                        "request failed: {} {}",
                        r.status(),
                        r.text().await.unwrap_or_default()
                    );
                    self.failures.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    eprintln!("request failed: {e}");
                    self.failures.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// When responses started coming only from `worker` (10 in a row, up to now) after `since`.
    async fn switched_to(&self, worker: &str, since: Instant) -> Option<Instant> {
        let deadline = Instant::now() + SETTLE;
        while Instant::now() < deadline {
            {
                let seen = self.seen.lock().unwrap();
                let after: Vec<_> = seen.iter().filter(|(t, _)| *t >= since).collect();
                // The final run of answers from `worker`.
                let run = after.iter().rev().take_while(|(_, w)| w == worker).count();
                if run >= 10 {
                    return Some(after[after.len() - run].0);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

async fn admin(url: &str) -> Value {
    client()
        .get(format!("{url}/admin/policies"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swapping_policies_under_traffic_fails_no_request() {
    let engines = [
        MockEngine::start(100.0, 4096),
        MockEngine::start(100.0, 4096),
    ];
    let marker = TempFile::new("README", "policy directory");
    let dir = marker.path.parent().unwrap().to_path_buf();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    install(&dir, &component(route::PICK_FIRST.into()));
    let mut config = Gateway::config_for(&[&engines[0], &engines[1]], "kv-cost");
    config += &format!(
        "[policies]\ndir = {:?}\nrouter = \"active\"\nadmin_token = \"{TOKEN}\"\ndebounce = \"{}ms\"\n\
         [[policies.admin_tokens]]\nrole = \"read\"\ntoken = \"reader\"\n",
        dir.display().to_string(),
        DEBOUNCE.as_millis()
    );
    let gateway = Gateway::start(&config);
    let url = gateway.url.clone();

    let unauthorized = client()
        .get(format!("{url}/admin/policies"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status(), 401);
    let body: Value = unauthorized.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    // A read token lists but may not change anything.
    let reader = |request: reqwest::RequestBuilder| request.bearer_auth("reader").send();
    let listing = reader(client().get(format!("{url}/admin/policies")))
        .await
        .unwrap();
    assert_eq!(listing.status(), 200);
    let forbidden = reader(
        client()
            .post(format!("{url}/admin/policies/rollback"))
            .body("{}"),
    )
    .await
    .unwrap();
    assert_eq!(forbidden.status(), 403);
    let body: Value = forbidden.json().await.unwrap();
    assert_eq!(body["error"]["code"], "insufficient_permissions");

    let traffic = Arc::new(Traffic::default());
    let lanes: Vec<_> = (0..4)
        .map(|lane| tokio::spawn(traffic.clone().run(url.clone(), lane)))
        .collect();
    assert!(traffic.switched_to("0.0", Instant::now()).await.is_some());

    // A valid swap: every decision moves to worker 1 (one debounce window plus the compile and
    // a round trip; how long is measured, not asserted: these machines are shared).
    let written = Instant::now();
    install(&dir, &component(route::PICK_LAST.into()));
    let switched = traffic
        .switched_to("1.0", written)
        .await
        .expect("no swap to PICK_LAST");
    eprintln!("swap took {:?}", switched.duration_since(written));

    // A policy that traps on real traffic: loaded (it passes its canary), contained by the
    // native fallback on every call.
    install(&dir, &component(unless_canary(TRAP)));
    let fell_back = eventually(SETTLE.as_secs(), async || {
        let metrics = get_text(&format!("{url}/metrics")).await;
        metric_sum(&metrics, "switchyard_policy_fallbacks_total") > 0.0
    })
    .await;
    assert!(fell_back, "the trapping policy never fell back");
    let listing = admin(&url).await;
    let active = &listing["policies"][0];
    assert_eq!(active["role"], "router");
    assert!(active["fallbacks_total"].as_u64().unwrap() > 0, "{listing}");
    assert!(
        active["last_error"].as_str().unwrap().contains("trap"),
        "{listing}"
    );

    // A policy that loops forever on real traffic: each call is cut off at its deadline and the
    // native fallback routes; the other lanes' requests keep being served meanwhile.
    let trapped = active["fallbacks_total"].as_u64().unwrap();
    install(&dir, &component(unless_canary(SPIN)));
    let cut_off = eventually(SETTLE.as_secs(), async || {
        let listing = admin(&url).await;
        let active = &listing["policies"][0];
        active["fallbacks_total"].as_u64() > Some(trapped)
            && active["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("deadline"))
    })
    .await;
    assert!(
        cut_off,
        "the looping policy was never cut off: {}",
        admin(&url).await
    );
    let served_while_looping = traffic.seen.lock().unwrap().len();
    assert!(
        eventually(SETTLE.as_secs(), async || {
            traffic.seen.lock().unwrap().len() >= served_while_looping + 20
        })
        .await,
        "traffic stalled behind the looping policy"
    );

    // Back to a valid policy.
    let written = Instant::now();
    install(&dir, &component(route::PICK_FIRST.into()));
    let switched = traffic
        .switched_to("0.0", written)
        .await
        .expect("no swap back");
    eprintln!("swap back took {:?}", switched.duration_since(written));

    // A broken file is refused, named in the listing, and traffic stays on PICK_FIRST.
    install(&dir, b"not a component");
    let refused = eventually(SETTLE.as_secs(), async || {
        let listing = admin(&url).await;
        let error = listing["policies"][0]["load_error"].as_str();
        error.is_some_and(|e| e.contains("active.wasm"))
    })
    .await;
    assert!(refused, "{}", admin(&url).await);
    assert!(traffic.switched_to("0.0", Instant::now()).await.is_some());

    traffic.stop.store(true, Ordering::Relaxed);
    for lane in lanes {
        lane.await.unwrap();
    }
    let served = traffic.seen.lock().unwrap().len();
    assert_eq!(
        traffic.failures.load(Ordering::Relaxed),
        0,
        "failed requests ({served} served)"
    );
    assert!(served > 50, "too little traffic: {served}");
}
