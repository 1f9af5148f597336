//! `Publisher` -> real ZMQ sockets on 127.0.0.1 -> `run_subscriber` -> `KvIndex`.

mod support;

use bytes::Bytes;
use std::time::Duration;
use support::{BLOCK_SIZE, Harness, JOIN_TIME, free_endpoint, ours};
use switchyard_core::worker::{Rank, Tier};
use switchyard_kv_events::publisher::Publisher;
use switchyard_kv_events::subscriber::SubscriberSnapshot;
use switchyard_kv_events::wire::{Encoding, EngineHash, EventBatch, KvEvent};
use zeromq::{PubSocket, Socket, SocketSend, ZmqMessage};

const RANK: Rank = Rank {
    worker: switchyard_core::worker::WorkerId(1),
    dp_rank: 0,
};

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events,
        dp_rank: None,
    }
}

/// Blocks `hashes` holding `tokens` (engine hashes are arbitrary: we re-hash the tokens).
fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: hashes.iter().copied().map(EngineHash).collect(),
        parent_block_hash: parent.map(EngineHash),
        token_ids: tokens.to_vec(),
        block_size: BLOCK_SIZE,
        lora_id: None,
        lora_name: None,
        extra_keys: false,
        kv_cache_spec_kind: None,
        medium: None,
        group_idx: None,
    }
}

/// An engine's publisher on a free port, with a replay socket keeping 100 batches if `replay`.
async fn publisher(replay: bool, encoding: Encoding) -> Publisher {
    let replay = replay.then_some("tcp://127.0.0.1:0");
    Publisher::bind("tcp://127.0.0.1:0", replay, encoding, 100)
        .await
        .expect("publisher binds")
}

#[tokio::test]
async fn stores_offloads_and_removes_reach_the_index() {
    let publisher = publisher(true, Encoding::Map).await;
    let mut sub = Harness::start(
        RANK,
        publisher.endpoint(),
        publisher.replay_endpoint(),
        false,
    );
    sub.joined().await;

    let tokens: Vec<u32> = (0..8).collect();
    let events = vec![
        stored(&[1, 2], None, &tokens),
        KvEvent::BlockStored {
            block_hashes: vec![EngineHash(1), EngineHash(2)],
            parent_block_hash: None,
            token_ids: vec![],
            block_size: 0,
            lora_id: None,
            lora_name: None,
            extra_keys: false,
            kv_cache_spec_kind: None,
            medium: Some("CPU".into()),
            group_idx: None,
        },
    ];
    assert_eq!(publisher.publish(&batch(events)).await.expect("sent"), 0);
    let removed = KvEvent::BlockRemoved {
        block_hashes: vec![EngineHash(2)],
        medium: Some("GPU".into()),
        group_idx: None,
    };
    assert_eq!(
        publisher
            .publish(&batch(vec![removed]))
            .await
            .expect("sent"),
        1
    );

    let [first, second] = ours(&tokens)[..] else {
        panic!("two blocks");
    };
    sub.wait_until("the device copy of block 2 removed", |index, _| {
        index.contains(RANK, Tier::Device, first)
            && !index.contains(RANK, Tier::Device, second)
            && index.contains(RANK, Tier::Host, second)
    })
    .await;
    sub.settle().await;
    assert_eq!(sub.index.blocks(RANK, Tier::Device), 1);
    assert_eq!(sub.index.blocks(RANK, Tier::Host), 2);
    assert_eq!(sub.stats.snapshot().messages, 2);
    sub.stop().await;
    publisher.close().await;
}

#[tokio::test]
async fn a_subscriber_started_late_learns_what_the_engine_published_before() {
    // A gateway started after its engine: the first two batches went out to nobody.
    let engine = publisher(true, Encoding::Map).await;
    let tokens: Vec<u32> = (0..12).collect();
    let chain = ours(&tokens);
    for (i, parent) in [(0, None), (1, Some(0))] {
        let block = &tokens[i * 4..i * 4 + 4];
        engine
            .publish(&batch(vec![stored(&[i as u64], parent, block)]))
            .await
            .expect("sent");
    }
    let mut sub = Harness::start(RANK, engine.endpoint(), engine.replay_endpoint(), false);
    sub.wait_until("the history", |index, _| {
        index.contains(RANK, Tier::Device, chain[1])
    })
    .await;
    // The live stream goes on from there.
    sub.joined().await;
    let third = batch(vec![stored(&[2], Some(1), &tokens[8..])]);
    engine.publish(&third).await.expect("sent");
    sub.wait_until("the live block", |index, _| {
        index.contains(RANK, Tier::Device, chain[2])
    })
    .await;
    let stats = sub.stats.snapshot();
    assert_eq!((stats.gaps, stats.replays, stats.clears), (0, 0, 0));
    sub.stop().await;
    engine.close().await;

    // A buffer that no longer starts at 0 gives nothing (the history before it is lost): the
    // index learns from the live stream on.
    let rolled = Publisher::bind(
        "tcp://127.0.0.1:0",
        Some("tcp://127.0.0.1:0"),
        Encoding::Map,
        1,
    )
    .await
    .expect("publisher binds");
    for (i, parent) in [(0, None), (1, Some(0))] {
        let block = &tokens[i * 4..i * 4 + 4];
        rolled
            .publish(&batch(vec![stored(&[i as u64], parent, block)]))
            .await
            .expect("sent");
    }
    let mut sub = Harness::start(RANK, rolled.endpoint(), rolled.replay_endpoint(), false);
    sub.joined().await;
    let root: Vec<u32> = (100..104).collect();
    rolled
        .publish(&batch(vec![stored(&[9], None, &root)]))
        .await
        .expect("sent");
    sub.wait_until("the live block", |index, _| {
        index.contains(RANK, Tier::Device, ours(&root)[0])
    })
    .await;
    sub.settle().await;
    assert_eq!(sub.index.total_blocks(RANK), 1);
    sub.stop().await;
    rolled.close().await;
}

#[tokio::test]
async fn a_lost_message_is_replayed() {
    let publisher = publisher(true, Encoding::Array).await;
    let mut sub = Harness::start(
        RANK,
        publisher.endpoint(),
        publisher.replay_endpoint(),
        false,
    );
    sub.joined().await;

    let tokens: Vec<u32> = (10..22).collect();
    publisher
        .publish(&batch(vec![stored(&[1], None, &tokens[..4])]))
        .await
        .expect("sent");
    publisher.skip_sequence();
    publisher
        .publish(&batch(vec![stored(&[2], Some(1), &tokens[4..8])]))
        .await
        .expect("kept");
    publisher
        .publish(&batch(vec![stored(&[3], Some(2), &tokens[8..])]))
        .await
        .expect("sent");

    let hashes = ours(&tokens);
    sub.wait_until("all three blocks", |index, _| {
        hashes
            .iter()
            .all(|&h| index.contains(RANK, Tier::Device, h))
    })
    .await;
    let stats = sub.stats.snapshot();
    assert_eq!(
        (
            stats.gaps,
            stats.replays,
            stats.replay_failures,
            stats.clears
        ),
        (1, 1, 0, 0)
    );
    sub.stop().await;
    publisher.close().await;
}

#[tokio::test]
async fn a_lost_message_without_replay_clears_the_rank() {
    let stats = lose_a_message(None).await;
    assert_eq!((stats.replays, stats.replay_failures), (0, 0));
}

#[tokio::test]
async fn a_failed_replay_clears_the_rank() {
    let stats = lose_a_message(Some(free_endpoint())).await;
    assert_eq!((stats.replays, stats.replay_failures), (1, 1));
}

/// Lose one message of a publisher without replay, check that only the blocks stored after the
/// loss remain, and return the subscriber's counters.
async fn lose_a_message(replay_endpoint: Option<String>) -> SubscriberSnapshot {
    let publisher = publisher(false, Encoding::Array).await;
    let mut sub = Harness::start(RANK, publisher.endpoint(), replay_endpoint, false);
    sub.joined().await;

    let before: Vec<u32> = (0..4).collect();
    let after: Vec<u32> = (100..104).collect();
    publisher
        .publish(&batch(vec![stored(&[1], None, &before)]))
        .await
        .expect("sent");
    sub.wait_until("the first block", |index, _| index.total_blocks(RANK) == 1)
        .await;
    publisher.skip_sequence();
    publisher
        .publish(&batch(vec![stored(&[2], None, &[7; 4])]))
        .await
        .expect("lost");
    publisher
        .publish(&batch(vec![stored(&[3], None, &[8; 4])]))
        .await
        .expect("sent");
    publisher
        .publish(&batch(vec![stored(&[4], None, &after)]))
        .await
        .expect("sent");

    sub.wait_until("only the block after the loss", |index, stats| {
        stats.clears == 1 && index.contains(RANK, Tier::Device, ours(&after)[0])
    })
    .await;
    assert_eq!(sub.index.total_blocks(RANK), 1);
    let stats = sub.stats.snapshot();
    sub.stop().await;
    publisher.close().await;
    stats
}

#[tokio::test]
async fn a_restarted_publisher_clears_the_rank() {
    let old = publisher(true, Encoding::Array).await;
    let (endpoint, replay) = (old.endpoint(), old.replay_endpoint());
    let mut sub = Harness::start(RANK, endpoint.clone(), replay.clone(), false);
    sub.joined().await;

    let before: Vec<u32> = (0..4).collect();
    for (hash, block) in [(1, [1; 4]), (2, [2; 4]), (3, [3; 4])] {
        old.publish(&batch(vec![stored(&[hash], None, &block)]))
            .await
            .expect("sent");
    }
    old.publish(&batch(vec![stored(&[4], None, &before)]))
        .await
        .expect("sent");
    sub.wait_until("four blocks", |index, _| index.total_blocks(RANK) == 4)
        .await;
    old.close().await;
    // The SUB socket stays up to reconnect, but nothing is attached to it.
    sub.wait_until("the publisher gone", |_, stats| !stats.connected)
        .await;

    // Same ports, sequence back to 0, no AllBlocksCleared: like a vLLM restart.
    let replay = replay.as_deref();
    let new = Publisher::bind(&endpoint, replay, Encoding::Array, 100)
        .await
        .expect("rebinds");
    tokio::time::sleep(JOIN_TIME * 2).await; // the SUB reconnects with backoff
    let after: Vec<u32> = (50..54).collect();
    new.publish(&batch(vec![stored(&[9], None, &after)]))
        .await
        .expect("sent");
    new.publish(&batch(vec![])).await.expect("sent");

    // Cleared either way: on the reconnection (the SUB saw the peer go and come back) or, if
    // the new messages raced it, on the sequence going back.
    sub.wait_until("only the new block", |index, stats| {
        stats.restarts + stats.clears >= 1 && index.contains(RANK, Tier::Device, ours(&after)[0])
    })
    .await;
    sub.settle().await;
    assert_eq!(sub.index.total_blocks(RANK), 1);
    assert!(!sub.index.contains(RANK, Tier::Device, ours(&before)[0]));
    sub.stop().await;
    new.close().await;
}

#[tokio::test]
async fn bad_frames_are_skipped_and_a_bound_sub_accepts_the_engine() {
    // The gateway binds, the engine connects (vLLM does so when its endpoint has no `*`).
    let endpoint = free_endpoint();
    let mut sub = Harness::start(RANK, endpoint.clone(), None, true);
    // Bound, but no engine yet: not connected.
    tokio::time::sleep(JOIN_TIME).await;
    assert!(!sub.stats.snapshot().connected);
    let mut engine = PubSocket::new();
    tokio::time::timeout(support::DEADLINE, engine.connect(&endpoint))
        .await
        .expect("connects in time")
        .expect("connects");
    sub.joined().await;

    let tokens: Vec<u32> = (0..4).collect();
    let good = switchyard_kv_events::wire::encode_batch(
        &batch(vec![stored(&[1], None, &tokens)]),
        Encoding::Array,
    );
    let seq = |n: u64| Bytes::copy_from_slice(&n.to_be_bytes());
    let messages = [
        vec![Bytes::new(), seq(0)], // two frames
        vec![Bytes::new(), Bytes::from_static(b"x"), good.clone().into()], // short sequence
        vec![Bytes::new(), seq(0), Bytes::from_static(b"\xc1garbage")], // not msgpack
        vec![Bytes::new(), seq(1), good.into()],
    ];
    for frames in messages {
        let message = ZmqMessage::try_from(frames).expect("frames");
        engine.send(message).await.expect("sent");
    }
    sub.wait_until("the good batch", |index, _| {
        index.contains(RANK, Tier::Device, ours(&tokens)[0])
    })
    .await;
    assert_eq!(sub.stats.snapshot().malformed, 3);
    sub.stop().await;
}

#[tokio::test]
async fn a_subscriber_started_first_receives_once_the_engine_binds() {
    let endpoint = free_endpoint();
    let mut sub = Harness::start(RANK, endpoint.clone(), None, false);
    tokio::time::sleep(JOIN_TIME).await;
    assert!(!sub.stats.snapshot().connected);

    let publisher = Publisher::bind(&endpoint, None, Encoding::Array, 0)
        .await
        .expect("binds");
    sub.joined().await;
    let tokens: Vec<u32> = (0..4).collect();
    publisher
        .publish(&batch(vec![stored(&[1], None, &tokens)]))
        .await
        .expect("sent");
    sub.wait_until("the block", |index, _| {
        index.contains(RANK, Tier::Device, ours(&tokens)[0])
    })
    .await;
    sub.stop().await;
    publisher.close().await;
}

/// A replay requester that asks again and again and reads nothing fills its queue at the
/// publisher (the `zeromq` crate's ROUTER then waits for room): the live stream and the other
/// requesters' replays go on.
#[tokio::test]
async fn a_replay_requester_that_stops_reading_holds_up_neither_the_stream_nor_other_replays() {
    use zeromq::{DealerSocket, SocketRecv};
    const BUFFERED: usize = 1_000;
    let publisher = Publisher::bind(
        "tcp://127.0.0.1:0",
        Some("tcp://127.0.0.1:0"),
        Encoding::Array,
        BUFFERED,
    )
    .await
    .expect("publisher binds");
    let replay = publisher.replay_endpoint().expect("a replay socket");
    for n in 0..BUFFERED as u32 {
        publisher
            .publish(&batch(vec![stored(&[u64::from(n) + 1], None, &[n; 4])]))
            .await
            .expect("buffered");
    }
    let request = |start: u64| {
        ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&start.to_be_bytes()),
        ])
        .expect("two frames")
    };
    // A requester that reads nothing: the answers fill the sockets' buffers, then the
    // publisher's queue for it (100,000 messages). 1,000 answers of 1,001 messages are far more
    // (400 already held up the publisher before the fix).
    let mut stuck = DealerSocket::new();
    stuck.connect(&replay).await.expect("connects");
    for _ in 0..1_000 {
        stuck.send(request(0)).await.expect("request sent");
    }
    // The publisher's answers to it fill up while the live stream goes on.
    let mut sub = Harness::start(RANK, publisher.endpoint(), None, false);
    sub.joined().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tokens: Vec<u32> = (5_000..5_004).collect();
    tokio::time::timeout(
        Duration::from_secs(5),
        publisher.publish(&batch(vec![stored(&[99_999], None, &tokens)])),
    )
    .await
    .expect("the stream is not held up by the replay socket")
    .expect("sent");
    sub.wait_until("the live block", |index, _| {
        index.contains(RANK, Tier::Device, ours(&tokens)[0])
    })
    .await;
    // Another requester is answered in full.
    let mut other = DealerSocket::new();
    other.connect(&replay).await.expect("connects");
    other
        .send(request(BUFFERED as u64 - 10))
        .await
        .expect("request sent");
    let mut seqs = Vec::new();
    loop {
        let answer = tokio::time::timeout(Duration::from_secs(5), other.recv())
            .await
            .expect("answered while the stuck requester is not")
            .expect("a message");
        let seq = answer.get(2).expect("a sequence frame").to_vec();
        if seq == (-1i64).to_be_bytes() {
            break;
        }
        seqs.push(u64::from_be_bytes(seq.try_into().expect("8 bytes")));
    }
    assert_eq!(
        seqs,
        (BUFFERED as u64 - 10..=BUFFERED as u64).collect::<Vec<_>>()
    );
    sub.stop().await;
    drop(stuck);
    tokio::time::timeout(Duration::from_secs(5), publisher.close())
        .await
        .expect("the publisher closes");
}
