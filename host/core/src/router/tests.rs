use super::*;
use crate::hash::BlockHasher;
use crate::index::{IndexOp, SHARED_POOL};
use crate::worker::Tier;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn router(ranks: u32, policy: Box<dyn RoutingPolicy>) -> Router {
    let mut r = Router::new(
        RouterConfig {
            block_size: 4,
            ..RouterConfig::default()
        },
        policy,
    );
    for w in 0..ranks {
        r.add_rank(Rank::new(w, 0), false);
    }
    r
}

fn request(hashes: &[SequenceHash], tokens: u32) -> RouteRequest<'_> {
    RouteRequest {
        hashes,
        tokens,
        ..RouteRequest::default()
    }
}

#[test]
fn prefers_the_rank_holding_the_prefix() {
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = BlockHasher::new(4).sequence(&tokens);
    let mut index = KvIndex::new();
    index.apply(&IndexOp::Store {
        rank: Rank::new(2, 0),
        tier: Tier::Device,
        blocks: hashes[..12].to_vec(),
        locals: Vec::new(),
    });
    let mut r = router(4, Box::new(KvCost));
    let d = r
        .route(RequestId(1), &request(&hashes, 64), &index, ms(0))
        .unwrap();
    assert_eq!(d.rank, Rank::new(2, 0));
    assert_eq!(d.indexed.device, 12);
    assert_eq!(
        d.cost,
        Some(4.0 + 4.0),
        "4 uncached prefill blocks + 4 new blocks"
    );
}

#[test]
fn host_tier_earns_partial_credit() {
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = BlockHasher::new(4).sequence(&tokens);
    let mut index = KvIndex::new();
    index.apply(&IndexOp::Store {
        rank: Rank::new(0, 0),
        tier: Tier::Host,
        blocks: hashes.clone(),
        locals: Vec::new(),
    });
    index.apply(&IndexOp::Store {
        rank: Rank::new(1, 0),
        tier: Tier::Device,
        blocks: hashes[..8].to_vec(),
        locals: Vec::new(),
    });
    let mut r = router(2, Box::new(KvCost));
    // rank 0: prefill 16 - 0.75*16 = 4, decode 16 -> 20; rank 1: prefill 8, decode 8 -> 16.
    let d = r
        .route(RequestId(1), &request(&hashes, 64), &index, ms(0))
        .unwrap();
    assert_eq!(d.rank, Rank::new(1, 0));
}

#[test]
fn the_shared_pool_is_credited_only_beyond_each_ranks_own_prefix() {
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = BlockHasher::new(4).sequence(&tokens);
    let mut index = KvIndex::new();
    // The pool holds the first 12 blocks; rank 1 holds 8 on its device, rank 0 nothing.
    index.apply(&IndexOp::Store {
        rank: SHARED_POOL,
        tier: Tier::Host,
        blocks: hashes[..12].to_vec(),
        locals: Vec::new(),
    });
    index.apply(&IndexOp::Store {
        rank: Rank::new(1, 0),
        tier: Tier::Device,
        blocks: hashes[..8].to_vec(),
        locals: Vec::new(),
    });
    let mut r = router(2, Box::new(KvCost));
    let d = r
        .route(RequestId(1), &request(&hashes, 64), &index, ms(0))
        .unwrap();
    // rank 1: prefill 16 - 8 - 0.5 x 4 = 6, decode 8 -> 14;
    // rank 0: prefill 16 - 0.5 x 12 = 10, decode 16 -> 26.
    assert_eq!(d.rank, Rank::new(1, 0));
    assert_eq!(
        d.shared_blocks, 4,
        "blocks 8..12: the pool run beyond rank 1's device"
    );
    assert_eq!(d.cost, Some(14.0));
    assert_eq!(d.candidates, 2, "the pool is never a candidate");

    // Without the pool's credit the same request costs rank 1 the 2 blocks more.
    let ignore_pool = RouteRequest {
        weights: Some(CostWeights {
            shared_credit: 0.0,
            ..CostWeights::default()
        }),
        ..request(&hashes, 64)
    };
    let d = router(2, Box::new(KvCost))
        .route(RequestId(1), &ignore_pool, &index, ms(0))
        .unwrap();
    assert_eq!(d.cost, Some(16.0));
}

#[test]
fn bookings_let_siblings_see_each_other() {
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = BlockHasher::new(4).sequence(&tokens);
    let index = KvIndex::new();
    let mut r = router(4, Box::new(KvCost));
    let first = r
        .route(RequestId(1), &request(&hashes, 64), &index, ms(0))
        .unwrap();
    r.first_token(RequestId(1), Duration::ZERO);
    // Same prompt a millisecond later, no events yet: the booking predicts the prefix.
    let second = r
        .route(RequestId(2), &request(&hashes, 64), &index, ms(1))
        .unwrap();
    assert_eq!(first.rank, second.rank);
    assert_eq!(second.overlap.device, 16);
    assert_eq!(second.indexed.device, 0);
    // After the booking TTL, the prediction is gone and load spreads the third one.
    let third = r
        .route(RequestId(3), &request(&hashes, 64), &index, ms(5_000))
        .unwrap();
    assert_ne!(third.rank, first.rank);
}

#[test]
fn load_is_released_at_first_token_and_finish() {
    let hashes = BlockHasher::new(4).sequence(&[1; 40]);
    let index = KvIndex::new();
    let mut r = router(1, Box::new(KvCost));
    let req = RouteRequest {
        expected_output_tokens: Some(8),
        ..request(&hashes, 40)
    };
    let d = r.route(RequestId(7), &req, &index, ms(0)).unwrap();
    assert_eq!(
        r.load(d.rank),
        RankLoad {
            prefill_tokens: 40,
            decode_blocks: 12,
            requests: 1
        }
    );
    r.first_token(RequestId(7), Duration::ZERO);
    assert_eq!(r.load(d.rank).prefill_tokens, 0);
    assert_eq!(r.load(d.rank).decode_blocks, 12);
    r.finish(RequestId(7), ms(10));
    assert_eq!(r.load(d.rank), RankLoad::default());
    assert_eq!(r.in_flight(), 0);
    r.finish(RequestId(7), ms(11)); // idempotent
}

#[test]
fn unhealthy_and_excluded_ranks_are_skipped() {
    let index = KvIndex::new();
    let mut r = router(3, Box::new(KvCost));
    r.set_healthy(Rank::new(0, 0), false);
    let exclude = [Rank::new(1, 0)];
    let req = RouteRequest {
        exclude: &exclude,
        ..request(&[], 3)
    };
    for i in 0..10 {
        let d = r.route(RequestId(i), &req, &index, ms(i)).unwrap();
        assert_eq!(d.rank, Rank::new(2, 0));
    }
    r.set_healthy(Rank::new(2, 0), false);
    assert_eq!(
        r.route(RequestId(99), &req, &index, ms(20)),
        Err(RouteError::NoHealthyWorker)
    );
}

#[test]
fn a_retired_rank_finishes_its_requests_and_never_comes_back() {
    let index = KvIndex::new();
    let mut r = router(2, Box::new(KvCost));
    let pinned = RouteRequest {
        pinned_rank: Some(Rank::new(0, 0)),
        ..request(&[], 8)
    };
    let d = r.route(RequestId(1), &pinned, &index, ms(0)).unwrap();
    assert_eq!(d.rank, Rank::new(0, 0));
    r.retire_rank(Rank::new(0, 0));
    // A health check that passes cannot bring it back; it is no longer listed.
    r.set_healthy(Rank::new(0, 0), true);
    assert_eq!(r.ranks().collect::<Vec<_>>(), [(Rank::new(1, 0), true)]);
    for i in 2..10 {
        let d = r.route(RequestId(i), &pinned, &index, ms(i)).unwrap();
        assert_eq!(d.rank, Rank::new(1, 0));
        r.finish(RequestId(i), ms(i));
    }
    // The request already on it still releases its load.
    assert_eq!(r.load(Rank::new(0, 0)).requests, 1);
    r.finish(RequestId(1), ms(20));
    assert_eq!(r.load(Rank::new(0, 0)), RankLoad::default());
    assert_eq!(r.in_flight(), 0);
}

#[test]
fn ties_go_to_the_emptier_rank() {
    let index = {
        let mut i = KvIndex::new();
        i.apply(&IndexOp::Store {
            rank: Rank::new(0, 0),
            tier: Tier::Device,
            blocks: BlockHasher::new(4).sequence(&[9; 400]),
            locals: Vec::new(),
        });
        i
    };
    let mut r = router(2, Box::new(KvCost));
    let hashes = BlockHasher::new(4).sequence(&[1; 8]);
    let d = r
        .route(RequestId(1), &request(&hashes, 8), &index, ms(0))
        .unwrap();
    assert_eq!(d.rank, Rank::new(1, 0));
}

#[test]
fn temperature_spreads_choices_and_is_seeded() {
    let index = KvIndex::new();
    let run = || {
        let mut r = router(4, Box::new(KvCost));
        let mut picks = Vec::new();
        for i in 0..200 {
            let req = RouteRequest {
                temperature: Some(1.0),
                ..request(&[], 4)
            };
            let d = r.route(RequestId(i), &req, &index, ms(i)).unwrap();
            r.finish(RequestId(i), ms(i));
            picks.push(d.rank.worker.0);
        }
        picks
    };
    let picks = run();
    assert_eq!(picks, run(), "same seed, same choices");
    for w in 0..4 {
        assert!(picks.contains(&w), "worker {w} never chosen");
    }
}

#[test]
fn round_robin_rotates() {
    let index = KvIndex::new();
    let mut r = router(3, Box::new(RoundRobin::default()));
    let picks: Vec<u32> = (0..6)
        .map(|i| {
            r.route(RequestId(i), &request(&[], 1), &index, ms(0))
                .unwrap()
                .rank
                .worker
                .0
        })
        .collect();
    assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
}

#[derive(Debug)]
struct Broken(Selection);

impl RoutingPolicy for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn select(&mut self, _: &PolicyRequest, _: &[Candidate]) -> Selection {
        self.0.clone()
    }
}

#[test]
fn invalid_selections_are_errors_not_panics() {
    let index = KvIndex::new();
    for bad in [
        Selection::Pick(5),
        Selection::Costs(vec![1.0]),
        Selection::Costs(vec![f64::NAN, 1.0]),
    ] {
        let mut r = router(2, Box::new(Broken(bad)));
        assert!(matches!(
            r.route(RequestId(1), &request(&[], 1), &index, ms(0)),
            Err(RouteError::BadSelection { .. })
        ));
        assert_eq!(r.in_flight(), 0);
    }
    let mut r = router(2, Box::new(Broken(Selection::Reject("full".into()))));
    assert_eq!(
        r.route(RequestId(1), &request(&[], 1), &index, ms(0)),
        Err(RouteError::Rejected {
            reason: "full".into()
        })
    );
}

#[test]
fn the_stored_event_of_the_prompts_last_full_block_ends_its_prefill_load() {
    let hashes = BlockHasher::new(4).sequence(&[5; 42]);
    assert_eq!(hashes.len(), 10, "ten full blocks and two tokens");
    let index = KvIndex::new();
    let mut r = router(2, Box::new(KvCost));
    let d = r
        .route(RequestId(1), &request(&hashes, 42), &index, ms(0))
        .unwrap();
    assert!(!d.engine_streams);
    let other = Rank::new(1 - d.rank.worker.0, 0);
    r.blocks_stored(hashes[..9].iter().map(|&b| (d.rank, b)), Duration::ZERO);
    r.blocks_stored(hashes[9..].iter().map(|&b| (other, b)), Duration::ZERO);
    assert_eq!(r.load(d.rank).prefill_tokens, 42, "not yet, not there");
    assert!(r.blocks_stored(hashes[8..].iter().map(|&b| (d.rank, b)), Duration::ZERO));
    assert_eq!(r.load(d.rank).prefill_tokens, 0);
    assert_eq!(r.load(d.rank).requests, 1, "still decoding");

    // The same prompt again: its blocks are booked there already, so no event will come, and
    // what is left to prefill (two tokens) is not worth one.
    let again = r
        .route(RequestId(2), &request(&hashes, 42), &index, ms(1))
        .unwrap();
    assert_eq!((again.rank, again.overlap.device), (d.rank, 10));
    assert!(!again.engine_streams);
    assert!(r.prefill_ends.is_empty(), "it waits for nothing");
    r.finish(RequestId(1), ms(2));
    r.finish(RequestId(2), ms(2));

    // A retried request waits for its new rank's event only.
    let fresh = BlockHasher::new(4).sequence(&[6; 40]);
    let first = r
        .route(RequestId(3), &request(&fresh, 40), &index, ms(2))
        .unwrap();
    let exclude = [first.rank];
    let retry = RouteRequest {
        exclude: &exclude,
        ..request(&fresh, 40)
    };
    let second = r.route(RequestId(3), &retry, &index, ms(3)).unwrap();
    assert_ne!(second.rank, first.rank);
    r.blocks_stored(fresh.iter().map(|&b| (first.rank, b)), Duration::ZERO);
    assert_eq!(r.load(second.rank).prefill_tokens, 40);
    r.blocks_stored(fresh.iter().map(|&b| (second.rank, b)), Duration::ZERO);
    assert_eq!(r.load(second.rank).prefill_tokens, 0);

    r.finish(RequestId(3), ms(10));
    assert!(r.prefill_ends.is_empty());
    assert_eq!(r.load(d.rank), RankLoad::default());

    // Bookings whose predictions expired see the same prompt as new: the engine will store its
    // last block once, so only the first waits for it (the second needs its first token).
    let mut r = Router::new(
        RouterConfig {
            block_size: 4,
            booking_ttl: ms(1),
            ..RouterConfig::default()
        },
        Box::new(KvCost),
    );
    r.add_rank(Rank::new(0, 0), false);
    let first = r
        .route(RequestId(5), &request(&fresh, 40), &index, ms(0))
        .unwrap();
    let second = r
        .route(RequestId(6), &request(&fresh, 40), &index, ms(10))
        .unwrap();
    assert_eq!(second.overlap.device, 0);
    assert!(!first.engine_streams && second.engine_streams);
    r.blocks_stored(fresh.iter().map(|&b| (first.rank, b)), Duration::ZERO);
    assert_eq!(r.load(first.rank).prefill_tokens, 40, "the second's");
    r.first_token(RequestId(6), Duration::ZERO);
    assert_eq!(r.load(first.rank).prefill_tokens, 0);

    // A last block the rank holds already, its parents evicted: computing up to it stores
    // nothing new, so nothing is waited for.
    let mut index = KvIndex::new();
    let orphan = BlockHasher::new(4).sequence(&[7; 40]);
    index.apply(&IndexOp::Store {
        rank: Rank::new(0, 0),
        tier: Tier::Device,
        blocks: orphan[9..].to_vec(),
        locals: Vec::new(),
    });
    let d = r
        .route(RequestId(7), &request(&orphan, 40), &index, ms(20))
        .unwrap();
    assert_eq!((d.rank, d.overlap.device), (Rank::new(0, 0), 0));
    assert!(d.engine_streams);

    // A rank without events never waits for them.
    r.add_rank(Rank::new(2, 0), true);
    let pinned = RouteRequest {
        pinned_rank: Some(Rank::new(2, 0)),
        ..request(&fresh, 40)
    };
    let approximate = r.route(RequestId(4), &pinned, &index, ms(20)).unwrap();
    assert_eq!(approximate.rank, Rank::new(2, 0));
    assert!(approximate.engine_streams);
}

#[test]
fn without_events_a_whole_answers_prefill_ends_when_the_ranks_learnt_pace_says() {
    let index = KvIndex::new();
    let rank = Rank::new(0, 0);
    let router_with = |engine_stream| {
        let mut r = Router::new(
            RouterConfig {
                block_size: 4,
                engine_stream,
                ..RouterConfig::default()
            },
            Box::new(KvCost),
        );
        r.add_rank(rank, true);
        r
    };
    let prompts: Vec<Vec<SequenceHash>> = (0..40u32)
        .map(|i| BlockHasher::new(4).sequence(&[i; 80]))
        .collect();
    let mut r = router_with(EngineStream::Auto);
    // Until the pace is learnt, the engine streams and first tokens teach it: 40 uncached tokens
    // prefilled in 100 ms, 2.5 ms a token.
    for (i, prompt) in prompts[..3].iter().enumerate() {
        let at = ms(1_000 * i as u64);
        let d = r
            .route(RequestId(i as u64), &request(&prompt[..10], 40), &index, at)
            .unwrap();
        assert!(d.engine_streams && d.prefill_due.is_none(), "{i}");
        r.first_token(RequestId(i as u64), at + ms(100));
        r.finish(RequestId(i as u64), at + ms(200));
    }

    // Now a whole answer's prefill of 80 tokens is due 200 ms after its booking.
    let whole = r
        .route(RequestId(10), &request(&prompts[10], 80), &index, ms(3_000))
        .unwrap();
    assert!(!whole.engine_streams);
    let due = whole.prefill_due.expect("a predicted end");
    assert!(
        due.abs_diff(ms(3_200)) < Duration::from_micros(1),
        "{due:?}"
    );
    // A client that streams gets a stream, and no prediction.
    let streamed = RouteRequest {
        client_streams: true,
        ..request(&prompts[11], 80)
    };
    let d = r
        .route(RequestId(11), &streamed, &index, ms(3_000))
        .unwrap();
    assert!(d.engine_streams && d.prefill_due.is_none());
    assert_eq!(r.load(rank).prefill_tokens, 160);
    assert!(!r.end_due_prefills(ms(3_199)));
    assert!(r.end_due_prefills(ms(3_201)));
    assert_eq!(
        r.load(rank).prefill_tokens,
        80,
        "the streamed one waits for its token"
    );
    // A late first token of the whole answer changes nothing.
    r.first_token(RequestId(10), ms(3_300));
    assert_eq!(r.load(rank).prefill_tokens, 80);
    r.first_token(RequestId(11), ms(3_300));
    assert_eq!(r.load(rank).prefill_tokens, 0);
    r.finish(RequestId(10), ms(3_400));
    r.finish(RequestId(11), ms(3_400));

    // One whole answer in sixteen is streamed again, so that the pace keeps up.
    let streams = (12..44u64)
        .filter(|&i| {
            let prompt = &prompts[i as usize % prompts.len()];
            let d = r
                .route(RequestId(i), &request(prompt, 80), &index, ms(4_000))
                .unwrap();
            d.engine_streams
        })
        .count();
    assert_eq!(streams, 2);
    // A predicted end is dropped with its booking: routing later ends nothing twice.
    for i in 12..44 {
        r.finish(RequestId(i), ms(4_001));
    }
    assert_eq!(r.load(rank), RankLoad::default());
    let fresh = BlockHasher::new(4).sequence(&[99; 80]);
    r.route(RequestId(50), &request(&fresh, 80), &index, ms(60_000))
        .unwrap();
    assert_eq!(r.load(rank).prefill_tokens, 80);

    // `always` streams everything and predicts nothing; `as-client` never streams, and
    // predicts once the pace is learnt (from its streaming clients).
    for (engine_stream, streams) in [
        (EngineStream::Always, true),
        (EngineStream::AsClient, false),
    ] {
        let mut r = router_with(engine_stream);
        for (i, prompt) in prompts[..4].iter().enumerate() {
            let at = ms(1_000 * i as u64);
            let streamed = RouteRequest {
                client_streams: i < 3,
                ..request(&prompt[..10], 40)
            };
            let d = r.route(RequestId(i as u64), &streamed, &index, at).unwrap();
            let whole_and_learnt = i == 3 && !streams;
            assert_eq!(d.engine_streams, streams || i < 3, "{engine_stream:?} {i}");
            assert_eq!(
                d.prefill_due.is_some(),
                whole_and_learnt,
                "{engine_stream:?} {i}"
            );
            r.first_token(RequestId(i as u64), at + ms(100));
        }
    }
}

#[test]
fn approximate_ranks_learn_from_decisions() {
    let hashes = BlockHasher::new(4).sequence(&[3; 64]);
    let index = KvIndex::new();
    let mut r = Router::new(
        RouterConfig {
            block_size: 4,
            approx_ttl: Duration::from_secs(60),
            ..RouterConfig::default()
        },
        Box::new(KvCost),
    );
    r.add_rank(Rank::new(0, 0), true);
    r.add_rank(Rank::new(1, 0), true);
    let first = r
        .route(RequestId(1), &request(&hashes, 64), &index, ms(0))
        .unwrap();
    r.finish(RequestId(1), ms(1_000));
    // Much later than a booking TTL but within the approximate TTL: still sticks.
    let again = r
        .route(RequestId(2), &request(&hashes, 64), &index, ms(30_000))
        .unwrap();
    assert_eq!(first.rank, again.rank);
    assert_eq!(again.overlap.device, 16);
    r.finish(RequestId(2), ms(31_000));
    // After the TTL the knowledge is gone.
    let late = r
        .route(RequestId(3), &request(&hashes, 64), &index, ms(200_000))
        .unwrap();
    assert_eq!(late.overlap.device, 0);
}

/// Session, parent session, priority and osl, as a policy saw them.
type SeenRequest = (Option<String>, Option<String>, i32, Option<u32>);

/// Records what the router passes to a policy.
#[derive(Debug, Default)]
struct Recorder {
    sessions: Vec<SeenRequest>,
    outcomes: Vec<Outcome>,
}

impl RoutingPolicy for std::sync::Arc<std::sync::Mutex<Recorder>> {
    fn name(&self) -> &str {
        "recorder"
    }
    fn select(&mut self, r: &PolicyRequest<'_>, _: &[Candidate]) -> Selection {
        let mut me = self.lock().unwrap();
        me.sessions.push((
            r.session_id.map(Into::into),
            r.parent_session_id.map(Into::into),
            r.priority,
            r.osl,
        ));
        Selection::Pick(1)
    }
    fn observe(&mut self, outcome: &Outcome) {
        self.lock().unwrap().outcomes.push(outcome.clone());
    }
}

#[test]
fn policies_see_session_fields_and_outcomes() {
    let index = KvIndex::new();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Recorder::default()));
    let mut r = router(3, Box::new(seen.clone()));
    let req = RouteRequest {
        tokens: 16,
        expected_output_tokens: Some(7),
        session_id: Some("s1"),
        parent_session_id: Some("p0"),
        priority: -2,
        ..RouteRequest::default()
    };
    let d = r.route(RequestId(1), &req, &index, ms(0)).unwrap();
    assert_eq!(d.candidate_index, 1);
    let outcome = Outcome {
        rank: d.rank,
        candidate_index: d.candidate_index,
        session_id: Some("s1".into()),
        ttft: Some(Duration::from_millis(12)),
        itl: None,
        cached_tokens: 0,
        prompt_tokens: 16,
        output_tokens: 7,
        error: None,
    };
    r.observe(&outcome);
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.sessions,
        vec![(Some("s1".into()), Some("p0".into()), -2, Some(7))]
    );
    assert_eq!(seen.outcomes, vec![outcome]);
}

#[test]
fn a_pinned_rank_bypasses_the_policy_unless_it_cannot_take_the_request() {
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = BlockHasher::new(4).sequence(&tokens);
    let mut index = KvIndex::new();
    index.apply(&IndexOp::Store {
        rank: Rank::new(2, 0),
        tier: Tier::Device,
        blocks: hashes.clone(),
        locals: Vec::new(),
    });
    let mut r = router(3, Box::new(KvCost));
    let pinned = RouteRequest {
        pinned_rank: Some(Rank::new(0, 0)),
        ..request(&hashes, 64)
    };
    let d = r.route(RequestId(1), &pinned, &index, ms(0)).unwrap();
    assert_eq!((d.rank, d.cost), (Rank::new(0, 0), None));
    // Unhealthy: the policy decides (the rank holding the prefix).
    r.set_healthy(Rank::new(0, 0), false);
    let d = r.route(RequestId(2), &pinned, &index, ms(1)).unwrap();
    assert_eq!(d.rank, Rank::new(2, 0));
    assert!(d.cost.is_some());
}

#[test]
fn peer_load_steers_away_from_a_rank_another_replica_filled() {
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = BlockHasher::new(4).sequence(&tokens);
    let index = KvIndex::new();
    let peer = PeerId(7);
    let mut r = router(2, Box::new(KvCost));
    // Without peer load both ranks cost the same and the tie-break decides; with rank 0 loaded
    // by a peer, rank 1 wins every time.
    assert!(r.peer_booked(peer, RequestId(1), Rank::new(0, 0), (64, 16), ms(1000)));
    assert_eq!(
        r.peer_load(Rank::new(0, 0)),
        RankLoad {
            prefill_tokens: 64,
            decode_blocks: 16,
            requests: 1
        }
    );
    assert_eq!(
        r.load(Rank::new(0, 0)),
        RankLoad::default(),
        "own load apart"
    );
    let d = r
        .route(RequestId(1), &request(&hashes, 64), &index, ms(0))
        .unwrap();
    assert_eq!(d.rank, Rank::new(1, 0));
    assert_eq!(d.cost, Some(16.0 + 16.0));
    // The peer's prefill ends, then the request: its load goes in two steps.
    r.peer_prefill_done(peer, RequestId(1));
    assert_eq!(r.peer_load(Rank::new(0, 0)).prefill_tokens, 0);
    assert_eq!(r.peer_load(Rank::new(0, 0)).decode_blocks, 16);
    r.peer_finished(peer, RequestId(1));
    assert_eq!(r.peer_load(Rank::new(0, 0)), RankLoad::default());
    assert_eq!(r.peer_bookings(), 0);
}

#[test]
fn peer_bookings_expire_replace_and_ignore_unknown_ranks() {
    let mut r = router(2, Box::new(KvCost));
    let (a, b) = (PeerId(1), PeerId(2));
    let rank = Rank::new(0, 0);
    r.peer_booked(a, RequestId(1), rank, (10, 2), ms(100));
    r.peer_booked(b, RequestId(1), rank, (20, 3), ms(300));
    assert_eq!(
        r.peer_load(rank).requests,
        2,
        "same id, two replicas: two bookings"
    );
    // A retried request books again: it replaces its first booking, on whatever rank.
    r.peer_booked(a, RequestId(1), Rank::new(1, 0), (5, 1), ms(200));
    assert_eq!(r.peer_load(rank).prefill_tokens, 20);
    assert_eq!(r.peer_load(Rank::new(1, 0)).prefill_tokens, 5);
    assert!(!r.peer_booked(a, RequestId(9), Rank::new(5, 0), (1, 1), ms(100)));
    r.expire_peers(ms(199));
    assert_eq!(r.peer_bookings(), 2);
    r.expire_peers(ms(200));
    assert_eq!(r.peer_load(Rank::new(1, 0)), RankLoad::default());
    assert_eq!(r.peer_bookings(), 1);
    r.forget_peer(b);
    assert_eq!(r.peer_load(rank), RankLoad::default());
    // Unknown ids are no-ops.
    r.peer_finished(a, RequestId(42));
    r.peer_prefill_done(a, RequestId(42));
    assert_eq!(r.peer_bookings(), 0);
}

#[test]
fn peer_bookings_expire_on_route() {
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = BlockHasher::new(4).sequence(&tokens);
    let index = KvIndex::new();
    let mut r = router(2, Box::new(KvCost));
    r.peer_booked(PeerId(1), RequestId(1), Rank::new(0, 0), (640, 160), ms(10));
    r.route(RequestId(5), &request(&hashes, 64), &index, ms(20))
        .unwrap();
    assert_eq!(r.peer_bookings(), 0);
}

#[test]
fn the_journal_records_own_booking_changes_only_when_on() {
    let tokens: Vec<u32> = (0..64).collect();
    let hashes = BlockHasher::new(4).sequence(&tokens);
    let index = KvIndex::new();
    let mut r = router(1, Box::new(KvCost));
    r.route(RequestId(1), &request(&hashes, 64), &index, ms(0))
        .unwrap();
    assert!(r.take_deltas().is_empty(), "off by default");
    r.record_deltas(true);
    r.route(RequestId(2), &request(&hashes, 64), &index, ms(0))
        .unwrap();
    r.first_token(RequestId(2), Duration::ZERO);
    r.first_token(RequestId(2), Duration::ZERO);
    r.finish(RequestId(2), ms(1));
    r.finish(RequestId(2), ms(1));
    // Peer bookings are not ours: never recorded.
    r.peer_booked(PeerId(1), RequestId(3), Rank::new(0, 0), (1, 1), ms(10));
    let deltas = r.take_deltas();
    assert_eq!(deltas.len(), 3, "{deltas:?}");
    let BookingDelta::Booked {
        id,
        rank,
        decode_blocks,
        ..
    } = deltas[0]
    else {
        panic!("{deltas:?}");
    };
    assert_eq!(
        (id, rank, decode_blocks),
        (RequestId(2), Rank::new(0, 0), 16)
    );
    assert_eq!(deltas[1], BookingDelta::PrefillDone { id: RequestId(2) });
    assert_eq!(deltas[2], BookingDelta::Finished { id: RequestId(2) });
    assert!(r.take_deltas().is_empty());
}
