//! `switchyard kv-pool` as a process: the client puts and gets over HTTP (through memory and
//! disk), and SIGTERM stops it cleanly.

use crate::support::{Proc, TempFile, get_text, metric_sum};
use std::time::Duration;
use switchyard_kv_pool::{PoolClient, PoolError, PutBlock};

const BLOCK: u32 = 4096;
const TOKEN: &str = "integration-secret";

fn block(hash: u64, parent: Option<u64>) -> PutBlock {
    PutBlock {
        hash,
        parent,
        token_ids: (0..16).collect(),
        retention: None,
        bytes: vec![hash as u8; BLOCK as usize].into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kv_pool_process_serves_blocks_and_stops_on_sigterm() {
    let scratch = TempFile::new("kv-pool", "");
    let disk = scratch.path.with_file_name("disk");
    let disk = disk.to_str().unwrap();
    let mut pool = Proc::switchyard(&[
        "kv-pool",
        "--listen",
        "127.0.0.1:0",
        "--block-bytes",
        "4096",
        "--memory-blocks",
        "4",
        "--disk-dir",
        disk,
        "--disk-blocks",
        "16",
        "--events-endpoint",
        "tcp://127.0.0.1:0",
        "--events-replay-endpoint",
        "tcp://127.0.0.1:0",
        "--auth-token",
        TOKEN,
    ]);
    let url = pool.wait_for("kv pool listening on ");
    assert!(
        pool.wait_for("kv pool events on ")
            .starts_with("tcp://127.0.0.1:")
    );
    let client = PoolClient::new(&url, BLOCK).unwrap().with_token(TOKEN);

    // A chain of eight through a memory of four: half of it ends up on disk.
    let chain: Vec<PutBlock> = (1..=8).map(|h| block(h, (h > 1).then(|| h - 1))).collect();
    let summary = client.put(&chain).await.unwrap();
    assert_eq!((summary.stored, summary.duplicates), (8, 0));
    assert_eq!(client.put(&chain[..1]).await.unwrap().duplicates, 1);
    let hashes: Vec<u64> = (1..=9).collect();
    let mut expected: Vec<_> = chain.iter().map(|b| Some(b.bytes.clone())).collect();
    expected.push(None);
    assert_eq!(client.get(&hashes).await.unwrap(), expected);
    let metrics = get_text(&format!("{url}/metrics")).await;
    assert_eq!(metric_sum(&metrics, "kvbm_tier_usage_blocks"), 8.0);
    assert!(metric_sum(&metrics, "kvbm_offload_blocks_h2d_total") >= 4.0);

    // The token is required.
    let anonymous = PoolClient::new(&url, BLOCK).unwrap();
    assert!(matches!(
        anonymous.exists(&[1]).await,
        Err(PoolError::Refused { status: 401, .. })
    ));

    pool.terminate();
    let status = pool
        .exited_within(Duration::from_secs(20))
        .expect("exits on SIGTERM");
    assert!(status.success(), "{status:?}");
    // Gone: the engine would now recompute.
    let error = client.exists(&[1]).await.unwrap_err();
    assert!(error.is_unavailable(), "{error:?}");
}
