//! The service on 127.0.0.1: the client against it, its refusals, and its event stream read
//! by a real ZMQ SUB and replayed from its ROUTER.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking")]

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use switchyard_kv_events::wire::mooncake::{MooncakeEventType, decode_batch};
use switchyard_kv_pool::{
    ClientTls, DiskConfig, PoolClient, PoolConfig, PoolError, PoolService, PoolTier, PutBlock,
    PutRetention, ServiceConfig, spawn,
};
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const BLOCK: usize = 4096;
const TOKEN: &str = "pool-secret";

fn bytes_of(hash: u64) -> Bytes {
    let mut bytes = vec![(hash % 251) as u8; BLOCK];
    bytes[..8].copy_from_slice(&hash.to_le_bytes());
    bytes.into()
}

fn block(hash: u64, parent: Option<u64>) -> PutBlock {
    PutBlock {
        hash,
        parent,
        token_ids: (0..16).map(|i| hash as u32 * 16 + i).collect(),
        retention: None,
        bytes: bytes_of(hash),
    }
}

struct Running {
    service: PoolService,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

async fn start(memory: usize, disk: usize, token: Option<&str>, events: bool) -> Running {
    start_with(memory, disk, token, events, None).await
}

async fn start_with(
    memory: usize,
    disk: usize,
    token: Option<&str>,
    events: bool,
    tls: Option<switchyard_tls::ServerTls>,
) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let pool = PoolConfig {
        disk: (disk > 0).then(|| DiskConfig {
            dir: dir.path().to_owned(),
            blocks: disk,
            max_bytes: None,
        }),
        max_batch_blocks: 8,
        ..PoolConfig::memory(BLOCK, memory)
    };
    let config = ServiceConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        pool,
        auth_token: token.map(str::to_owned),
        events_endpoint: events.then(|| "tcp://127.0.0.1:0".to_owned()),
        replay_endpoint: events.then(|| "tcp://127.0.0.1:0".to_owned()),
        tls,
    };
    let shutdown = CancellationToken::new();
    let service = spawn(config, shutdown.clone()).await.unwrap();
    Running {
        service,
        shutdown,
        _dir: dir,
    }
}

impl Running {
    fn client(&self) -> PoolClient {
        PoolClient::new(&self.service.base_url(), BLOCK as u32)
            .unwrap()
            .with_token(TOKEN)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.service.stopped().await.unwrap();
    }
}

#[tokio::test]
async fn put_get_exists_round_trip_with_bytes_and_idempotent_puts() {
    let pool = start(16, 0, Some(TOKEN), false).await;
    let client = pool.client();
    let summary = client
        .put(&[block(1, None), block(2, Some(1))])
        .await
        .unwrap();
    assert_eq!((summary.stored, summary.duplicates), (2, 0));
    let again = client
        .put(&[PutBlock {
            retention: Some(PutRetention {
                priority: 80,
                duration_ms: Some(60_000),
            }),
            ..block(1, None)
        }])
        .await
        .unwrap();
    assert_eq!((again.stored, again.duplicates), (0, 1));
    assert_eq!(
        client.exists(&[1, 3, 2]).await.unwrap(),
        vec![true, false, true]
    );
    assert_eq!(
        client.get(&[2, 3, 1]).await.unwrap(),
        vec![Some(bytes_of(2)), None, Some(bytes_of(1))]
    );
    let health: Value = reqwest::get(format!("{}/health", pool.service.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    let info = client.info().await.unwrap();
    assert_eq!((info.block_bytes, info.memory_blocks), (BLOCK as u64, 16));
    let metrics = reqwest::get(format!("{}/metrics", pool.service.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "kvbm_tier_usage_blocks{tier=\"memory\"} 2",
        "kvbm_tier_capacity_blocks{tier=\"memory\"} 16",
        "kvbm_pool_puts_total 2",
        "kvbm_pool_duplicate_puts_total 1",
        "kvbm_hits_total{tier=\"memory\"} 2",
        "kvbm_misses_total{tier=\"memory\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    pool.stop().await;
}

async fn refused(error: PoolError) -> (u16, String, String) {
    match error {
        PoolError::Refused {
            status,
            kind,
            message,
        } => (status, kind, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn bad_requests_are_4xx_with_their_reason() {
    let pool = start(16, 0, Some(TOKEN), false).await;
    let base = pool.service.base_url();
    // Another block size, on put and on get.
    let small = PoolClient::new(&base, 1024).unwrap().with_token(TOKEN);
    let put = PutBlock {
        bytes: vec![0u8; 1024].into(),
        ..block(1, None)
    };
    let (status, kind, message) = refused(small.put(&[put]).await.unwrap_err()).await;
    assert_eq!((status, kind.as_str()), (400, "wrong_block_size"));
    assert!(
        message.contains("1024") && message.contains("4096"),
        "{message}"
    );
    let (status, kind, _) = refused(small.get(&[1]).await.unwrap_err()).await;
    assert_eq!((status, kind.as_str()), (400, "wrong_block_size"));

    // Tokens: missing, wrong.
    let anonymous = PoolClient::new(&base, BLOCK as u32).unwrap();
    let (status, kind, _) = refused(anonymous.exists(&[1]).await.unwrap_err()).await;
    assert_eq!((status, kind.as_str()), (401, "unauthorized"));
    let wrong = anonymous.clone().with_token("guess");
    let (status, _, message) = refused(wrong.exists(&[1]).await.unwrap_err()).await;
    assert_eq!(status, 401);
    assert!(message.contains("not this pool's"), "{message}");

    // An unknown version says which exist.
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{base}/v2/exists"))
        .bearer_auth(TOKEN)
        .json(&json!({"hashes": [1]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "unsupported_version");
    assert_eq!(body["error"]["supported"], json!(["v1"]));
    let response = http
        .post(format!("{base}/v1/exists"))
        .bearer_auth(TOKEN)
        .header("x-kv-pool-version", "7")
        .json(&json!({"hashes": [1]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "unsupported_version");
    assert_eq!(body["error"]["supported"], json!(["v1"]));

    // Over the batch bound (8 blocks), and a JSON put.
    let blocks: Vec<PutBlock> = (0..9).map(|h| block(h, None)).collect();
    let unsplit = pool.client().with_max_batch(64);
    let (status, kind, message) = refused(unsplit.put(&blocks).await.unwrap_err()).await;
    assert_eq!((status, kind.as_str()), (413, "batch_too_large"));
    assert!(message.contains("at most 8"), "{message}");
    // A client told the bound splits the call.
    let split = pool.client().with_max_batch(8);
    assert_eq!(split.put(&blocks).await.unwrap().stored, 9);
    assert_eq!(
        split.get(&(0..9).collect::<Vec<_>>()).await.unwrap().len(),
        9
    );
    let response = http
        .get(format!("{base}/v1/put"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 405);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "method_not_allowed");
    let response = http
        .post(format!("{base}/v1/put"))
        .bearer_auth(TOKEN)
        .json(&json!({"blocks": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    // A frame cut short.
    let response = http
        .post(format!("{base}/v1/put"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/octet-stream")
        .body(&b"SYKP\x01\x00"[..])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "bad_frame");

    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("kvbm_pool_refused_total{reason=\"unauthorized\"} 2"),
        "{metrics}"
    );
    pool.stop().await;
}

#[tokio::test]
async fn an_unreachable_or_silent_pool_is_unavailable_not_refused() {
    // Nobody listens: unreachable.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = PoolClient::new(&format!("http://127.0.0.1:{port}"), BLOCK as u32).unwrap();
    let error = client.exists(&[1]).await.unwrap_err();
    assert!(matches!(error, PoolError::Unreachable(_)), "{error:?}");
    assert!(error.is_unavailable());
    // Accepts, never answers: a timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let client = PoolClient::new(&format!("http://{addr}"), BLOCK as u32)
        .unwrap()
        .with_timeout(Duration::from_millis(200));
    let error = client.get(&[1]).await.unwrap_err();
    assert!(matches!(error, PoolError::Timeout(_)), "{error:?}");
    assert!(error.is_unavailable());
    held.abort();
}

#[tokio::test]
async fn a_corrupt_disk_block_is_a_counted_miss() {
    let pool = start(1, 4, None, false).await;
    let client = PoolClient::new(&pool.service.base_url(), BLOCK as u32).unwrap();
    client.put(&[block(1, None), block(2, None)]).await.unwrap();
    assert_eq!(pool.service.pool().tier_of(1), Some(PoolTier::Disk));
    let (path, offset) = pool.service.pool().disk_record(1).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[0xee; 16], offset).unwrap();
    assert_eq!(
        client.get(&[1, 2]).await.unwrap(),
        vec![None, Some(bytes_of(2))]
    );
    let metrics = reqwest::get(format!("{}/metrics", pool.service.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("kvbm_checksum_failures_total{tier=\"disk\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kvbm_misses_total{tier=\"disk\"} 1"),
        "{metrics}"
    );
    pool.stop().await;
}

/// What the events say each medium holds.
#[derive(Debug, Default, PartialEq, Eq)]
struct Replayed {
    cpu: BTreeSet<u64>,
    disk: BTreeSet<u64>,
}

impl Replayed {
    fn apply(&mut self, payload: &[u8]) {
        for event in decode_batch(payload).unwrap().events {
            let set = match event.medium.as_str() {
                "CPU" => &mut self.cpu,
                "DISK" => &mut self.disk,
                other => panic!("medium {other}"),
            };
            for hash in event.seq_hashes {
                match event.event_type {
                    MooncakeEventType::Stored => assert!(set.insert(hash.0)),
                    MooncakeEventType::Removed => assert!(set.remove(&hash.0)),
                }
            }
        }
    }

    fn of(pool: &switchyard_kv_pool::Pool) -> Replayed {
        Replayed {
            cpu: pool.hashes(PoolTier::Memory).into_iter().collect(),
            disk: pool.hashes(PoolTier::Disk).into_iter().collect(),
        }
    }
}

/// Every batch the replay socket has from `start`, in order.
async fn replay_from(endpoint: &str, start: u64) -> Vec<(u64, Bytes)> {
    let mut dealer = DealerSocket::new();
    dealer.connect(endpoint).await.unwrap();
    let request = vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())];
    dealer
        .send(ZmqMessage::try_from(request).unwrap())
        .await
        .unwrap();
    let mut batches = Vec::new();
    loop {
        // `[b"", topic, seq, payload]`, as vLLM answers.
        let frames = dealer.recv().await.unwrap().into_vec();
        assert_eq!(frames.len(), 4);
        if frames[2].as_ref() == (-1i64).to_be_bytes() {
            return batches;
        }
        batches.push((seq_of(&frames[2]), frames[3].clone()));
    }
}

fn seq_of(frame: &Bytes) -> u64 {
    u64::from_be_bytes(<[u8; 8]>::try_from(frame.as_ref()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_replay_to_exactly_what_the_pool_holds() {
    let pool = start(4, 4, None, true).await;
    let client = PoolClient::new(&pool.service.base_url(), BLOCK as u32).unwrap();
    let endpoints = pool.service.events().unwrap().clone();
    // Published before anyone listens: only the replay socket has these.
    client
        .put(&[block(1, None), block(2, Some(1)), block(3, Some(2))])
        .await
        .unwrap();
    let replay = endpoints.replay.clone().unwrap();
    let mut tries = 0;
    while replay_from(&replay, 0).await.is_empty() {
        tries += 1;
        assert!(tries < 500, "the first put was never published");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let mut sub = SubSocket::new();
    sub.connect(&endpoints.publish).await.unwrap();
    sub.subscribe("").await.unwrap();
    // Put probes until one arrives: the subscription has then reached the publisher.
    let mut replayed = Replayed::default();
    let mut probe = 100;
    let first = loop {
        client.put(&[block(probe, None)]).await.unwrap();
        probe += 1;
        if let Ok(message) = tokio::time::timeout(Duration::from_millis(200), sub.recv()).await {
            break message.unwrap().into_vec();
        }
        assert!(probe < 200, "the SUB never received an event");
    };
    let first_seq = seq_of(&first[1]);
    assert!(
        first_seq >= 1,
        "the first batch was published before the SUB joined"
    );

    // The missed range, from the replay socket: contiguous from 0.
    let batches = replay_from(&replay, 0).await;
    assert!(
        batches.len() as u64 > first_seq,
        "replay covers the missed range"
    );
    for (expected, (seq, payload)) in batches.iter().enumerate() {
        assert_eq!(*seq, expected as u64);
        if *seq < first_seq {
            replayed.apply(payload);
        }
    }
    replayed.apply(&first[2]);

    // Enough traffic to evict to disk and off it, and a get.
    for hash in 10..24 {
        client.put(&[block(hash, Some(hash - 1))]).await.unwrap();
    }
    client.get(&[10, 11, 23]).await.unwrap();
    let mut next = first_seq + 1;
    let pool_now = Replayed::of(pool.service.pool());
    while replayed != pool_now {
        let message = tokio::time::timeout(Duration::from_secs(10), sub.recv())
            .await
            .expect("events keep coming until they match the pool")
            .unwrap()
            .into_vec();
        assert_eq!(seq_of(&message[1]), next, "no gap on the live stream");
        next += 1;
        replayed.apply(&message[2]);
    }
    assert!(
        !pool_now.disk.is_empty() && pool_now.cpu.len() == 4,
        "{pool_now:?}"
    );
    pool.stop().await;
}

/// With TLS the pool serves `https://` only, and with a client CA only to clients that CA signed:
/// a client that trusts the pool and presents its certificate puts and gets; plain HTTP, a client
/// that does not trust the pool and one without a certificate get nothing (and an engine reads
/// that as "unavailable": recompute).
#[tokio::test]
async fn over_mutual_tls_only_a_client_that_trusts_the_pool_and_is_trusted_reaches_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = switchyard_tls::test_util::TestCa::new("pool CA");
    let ca_file = ca.write(dir.path(), "ca.crt");
    let tls = ca.server(dir.path(), &["127.0.0.1"], Some(ca_file.clone()));
    let pool = start_with(16, 0, Some(TOKEN), false, Some(tls)).await;
    let url = pool.service.base_url();
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let client = |ca_file: Option<&std::path::Path>, identity| {
        let tls = ClientTls {
            ca_file: ca_file.map(ToOwned::to_owned),
            identity,
        };
        PoolClient::with_tls(&url, BLOCK as u32, &tls)
            .unwrap()
            .with_token(TOKEN)
    };

    let engine = client(Some(&ca_file), Some(ca.client(dir.path(), "engine")));
    engine.put(&[block(7, None)]).await.unwrap();
    assert_eq!(engine.get(&[7]).await.unwrap(), vec![Some(bytes_of(7))]);

    let plain = url.replacen("https://", "http://", 1);
    let in_the_clear = PoolClient::new(&plain, BLOCK as u32)
        .unwrap()
        .with_token(TOKEN);
    let error = in_the_clear.exists(&[7]).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    let untrusting = client(None, Some(ca.client(dir.path(), "engine")));
    let error = untrusting.exists(&[7]).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    let anonymous = client(Some(&ca_file), None);
    let error = anonymous.exists(&[7]).await.unwrap_err();
    assert!(error.is_unavailable(), "{error}");
    pool.stop().await;
}
