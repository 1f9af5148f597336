//! Synthetic prompts: token ids that stand for a trace's block ids.
//!
//! A block id becomes `block_size` token ids drawn from a generator seeded by the id alone, so
//! equal ids give equal blocks and the engines' prefix caches, their KV events and the router's
//! hashes all see exactly the trace's prefix structure.
//!
//! [`Workload::with_block_size`]: crate::workload::Workload::with_block_size

/// Token ids used; low ids are left to special tokens, as a tokenizer would.
const VOCAB: std::ops::Range<u32> = 1_000..100_000;

/// The prompt of `input_tokens` tokens (at least one) whose blocks are `hash_ids`. A prompt longer
/// than its blocks gets a tail drawn from `salt` (unique per request), so the tail is never shared.
pub fn prompt(hash_ids: &[u64], block_size: u32, input_tokens: u32, salt: u64) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(input_tokens.max(1) as usize);
    complete_prompt(&mut tokens, hash_ids, block_size, input_tokens, salt);
    tokens
}

/// [`prompt`], given its first `tokens.len() / block_size` blocks (whole blocks only, taken
/// from another prompt with the same leading ids): draws only the rest.
pub fn complete_prompt(
    tokens: &mut Vec<u32>,
    hash_ids: &[u64],
    block_size: u32,
    input_tokens: u32,
    salt: u64,
) {
    let len = input_tokens.max(1) as usize;
    let block_size = block_size as usize;
    let given = tokens.len() / block_size.max(1);
    debug_assert_eq!(tokens.len(), given * block_size, "whole blocks only");
    for (i, &id) in hash_ids.iter().enumerate().skip(given) {
        if tokens.len() >= len {
            break;
        }
        let take = block_size.min(len - tokens.len());
        let start = tokens.len();
        if i > 0 && hash_ids[i - 1] == id {
            // A refined trace block is one block repeated ([`Workload::with_block_size`]):
            // copied, not drawn again.
            tokens.extend_from_within(start - block_size..start - block_size + take);
        } else {
            extend(tokens, id, take);
        }
    }
    let rest = len - tokens.len();
    extend(tokens, salt ^ TAIL_SALT, rest);
}

/// How many blocks of a prompt of `input_tokens` tokens with `ids` blocks are whole (their
/// tokens are a function of their ids alone).
pub fn whole_blocks(ids: usize, block_size: u32, input_tokens: u32) -> usize {
    (input_tokens.max(1) as usize / block_size.max(1) as usize).min(ids)
}

const TAIL_SALT: u64 = 0x7461_696c_5f74_6f6b;

/// Append the first `n` tokens drawn from `seed`: splitmix64, each output giving two tokens (its
/// low then its high half, each mapped onto the vocabulary by a multiply and a shift). A
/// function of `seed` only, and cheap: synthesising prompts was a tenth of a simulation.
fn extend(tokens: &mut Vec<u32>, seed: u64, n: usize) {
    let span = u64::from(VOCAB.end - VOCAB.start);
    let token = |half: u64| VOCAB.start + (((half & 0xffff_ffff) * span) >> 32) as u32;
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let start = tokens.len();
    tokens.resize(start + n, 0);
    let mut pairs = tokens[start..].chunks_exact_mut(2);
    for pair in &mut pairs {
        let z = next();
        pair[0] = token(z);
        pair[1] = token(z >> 32);
    }
    if let [last] = pairs.into_remainder() {
        *last = token(next());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_ids_give_equal_blocks_and_tails_differ() {
        let a = prompt(&[7, 8], 4, 10, 1);
        let b = prompt(&[7, 9], 4, 10, 2);
        assert_eq!(a.len(), 10);
        assert_eq!(a[..4], b[..4]);
        assert_ne!(a[4..8], b[4..8]);
        assert_ne!(a[8..], b[8..]);
    }

    #[test]
    fn a_prompt_completed_from_a_shared_prefix_is_the_prompt() {
        let before = prompt(&[7, 8, 9], 4, 11, 1);
        assert_eq!(whole_blocks(3, 4, 11), 2);
        for shared in 0..=2 {
            let mut tokens = before[..shared * 4].to_vec();
            complete_prompt(&mut tokens, &[7, 8, 5, 6], 4, 15, 2);
            assert_eq!(
                tokens,
                prompt(&[7, 8, 5, 6], 4, 15, 2),
                "{shared} blocks shared"
            );
        }
    }

    #[test]
    fn tokens_are_splitmix64_halves_on_the_vocabulary() {
        // splitmix64 seeded with 0: first output 0xe220a8397b1dcdaf (Vigna's reference); its low
        // half gives the first token, its high half the second.
        let z: u64 = 0xe220_a839_7b1d_cdaf;
        let span = u64::from(VOCAB.end - VOCAB.start);
        let on_vocab = |half: u64| VOCAB.start + ((half * span) >> 32) as u32;
        assert_eq!(
            prompt(&[0], 4, 2, 9),
            [on_vocab(z & 0xffff_ffff), on_vocab(z >> 32)]
        );
        let block = prompt(&[42], 64, 64, 0);
        assert!(block.iter().all(|t| VOCAB.contains(t)));
        assert_eq!(
            block,
            prompt(&[42], 64, 64, 1),
            "a function of the block id alone"
        );
    }

    #[test]
    fn a_repeated_id_repeats_its_block() {
        let a = prompt(&[7, 7, 8, 7], 4, 15, 1);
        let seven = prompt(&[7], 4, 4, 0);
        assert_eq!(a[..4], seven[..]);
        assert_eq!(a[4..8], seven[..]);
        assert_eq!(a[12..], seven[..3], "cut like any last block");
        let mut tokens = a[..4].to_vec();
        complete_prompt(&mut tokens, &[7, 7, 8, 7], 4, 15, 1);
        assert_eq!(tokens, a, "completed after a shared block");
    }

    #[test]
    fn a_partial_last_block_is_cut_to_the_input_length() {
        let full = prompt(&[1, 2], 4, 8, 0);
        let cut = prompt(&[1, 2], 4, 6, 0);
        assert_eq!(cut, full[..6]);
        assert_eq!(prompt(&[], 4, 0, 0).len(), 1);
    }
}
