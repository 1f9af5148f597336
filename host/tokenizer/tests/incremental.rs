//! Incremental tokenization through a `SessionCache`: always equal to a full encode (properties
//! over random texts, edits and tokenizer configurations), reuse where it should, and the cache's
//! bounds, TTL and counters.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Value, json};
use switchyard_tokenizer::{
    CONTENT_KEY_BYTES, CacheOutcome, ChatTemplateInput, ModelTokenizer, SessionCache,
    SessionCacheConfig, content_key,
};

const TOKENIZER_JSON: &[u8] = include_bytes!("../assets/smollm2-135m-instruct/tokenizer.json");
const CONFIG_JSON: &[u8] = include_bytes!("../assets/smollm2-135m-instruct/tokenizer_config.json");
/// Length of SmolLM's longest added token, `<jupyter_script>`: a cut needs that much shared text
/// after it before no added token can reach past the shared prefix.
const LONGEST_ADDED: usize = 16;
const IM_START: &str = "<|im_start|>";

/// Pieces of text that random prompts are made of: ChatML markers whole and in halves, other
/// added tokens, whitespace, digits, code, and multi-byte characters (combining accents too).
const FRAGMENTS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|im_",
    "end|>",
    "start|>",
    "<",
    "|>",
    ">",
    "<|",
    "user",
    "assistant",
    "tool",
    "\n",
    "\n\n",
    " ",
    "  ",
    "\t",
    "fn main() {",
    "}",
    "let x = 42;",
    "123",
    "4567",
    "é",
    "e\u{301}",
    "naïve",
    "🚦",
    "日本語",
    "Hello",
    " world",
    "<tool_call>",
    "{\"path\": \"src/lib.rs\"}",
    "</tool_call>",
    "<repo_name>",
    "<jupyter_script>",
    "hello",
    "HELLO",
    "<mask>",
    "<pad>",
    "<|endoftext|>",
    "   \n",
    "ÅΩ",
    "\r\n",
    "//",
    " the",
];

// === Tokenizer variants ===

fn model(name: &str, edit: impl FnOnce(&mut Value)) -> ModelTokenizer {
    let mut tokenizer: Value = serde_json::from_slice(TOKENIZER_JSON).expect("valid JSON");
    edit(&mut tokenizer);
    ModelTokenizer::from_json(name, tokenizer.to_string().as_bytes(), CONFIG_JSON)
        .expect("model loads")
}

fn added_token(id: u32, content: &str, normalized: bool, lstrip: bool, rstrip: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": lstrip,
           "rstrip": rstrip, "normalized": normalized, "special": !normalized})
}

/// SmolLM as shipped.
static SMOLLM: LazyLock<ModelTokenizer> =
    LazyLock::new(|| ModelTokenizer::embedded_default().expect("loads"));

/// Added tokens that overlap the ChatML anchors ("<|im_end|>\n" extends one, "\n<|im_start|>"
/// ends with one, "=<|im_end|>\n" starts before one and ends after it), strip whitespace around
/// them, or match only after normalization; and a
/// post-processor that would add a BOS if special tokens were added.
static OVERLAPPING: LazyLock<ModelTokenizer> = LazyLock::new(|| {
    model("overlapping", |tokenizer| {
        let added = tokenizer["added_tokens"].as_array_mut().expect("list");
        added.push(added_token(49152, "<|im_end|>\n", false, false, false));
        added.push(added_token(49153, "\n<|im_start|>", false, false, false));
        added.push(added_token(49154, "d|><|im_s", false, false, false));
        added.push(added_token(49155, "=<|im_end|>\n", false, false, false));
        added.push(added_token(49156, "<mask>", false, true, false));
        added.push(added_token(49157, "<pad>", false, false, true));
        added.push(added_token(49158, "hello", true, false, false));
        tokenizer["post_processor"] = json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}},
        });
    })
});

/// A normalizer (NFC, lowercase) and a Metaspace pre-tokenizer that prepends "▁" only to the
/// piece at offset 0: a suffix encoded from just after an added token would get one too.
static METASPACE: LazyLock<ModelTokenizer> = LazyLock::new(|| {
    model("metaspace", |tokenizer| {
        tokenizer["normalizer"] = json!({"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Lowercase"}]});
        tokenizer["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "▁",
            "prepend_scheme": "first", "split": true});
        tokenizer["model"]["unk_token"] = json!("<|endoftext|>");
    })
});

fn variant(index: usize) -> &'static ModelTokenizer {
    match index % 3 {
        0 => &SMOLLM,
        1 => &OVERLAPPING,
        _ => &METASPACE,
    }
}

// === Random texts and edits ===

/// A change between two turns, on fragment indices (so always at char boundaries; fragments
/// themselves cut added tokens in the middle).
#[derive(Debug, Clone)]
enum Edit {
    Append(Vec<usize>),
    Insert(usize, Vec<usize>),
    Delete(usize, usize),
    Truncate(usize),
}

fn fragments() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0..FRAGMENTS.len(), 0..24)
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => fragments().prop_map(Edit::Append),
        1 => (any::<usize>(), fragments()).prop_map(|(at, frags)| Edit::Insert(at, frags)),
        1 => (any::<usize>(), 1usize..6).prop_map(|(at, len)| Edit::Delete(at, len)),
        1 => any::<usize>().prop_map(Edit::Truncate),
    ]
}

fn apply(text: &mut Vec<usize>, edit: &Edit) {
    let at = |i: usize| {
        if text.is_empty() {
            0
        } else {
            i % (text.len() + 1)
        }
    };
    match edit {
        Edit::Append(frags) => text.extend(frags),
        Edit::Insert(i, frags) => {
            let i = at(*i);
            text.splice(i..i, frags.iter().copied());
        }
        Edit::Delete(i, len) => {
            let i = at(*i);
            let end = (i + len).min(text.len());
            text.drain(i..end);
        }
        Edit::Truncate(i) => {
            let i = at(*i);
            text.truncate(i);
        }
    }
}

fn join(text: &[usize]) -> String {
    text.iter().map(|&i| FRAGMENTS[i]).collect()
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any sequence of prompts in one session encodes exactly as a full pass, with every
    /// tokenizer variant.
    #[test]
    fn incremental_equals_full_on_random_edits(
        variant_index in 0usize..3,
        start in fragments(),
        edits in proptest::collection::vec(edit(), 1..7),
    ) {
        let tokenizer = variant(variant_index);
        let cache = SessionCache::default();
        let t0 = Instant::now();
        let mut text = start;
        let mut previous: Option<String> = None;
        for (turn, edit) in std::iter::once(None).chain(edits.iter().map(Some)).enumerate() {
            if let Some(edit) = edit {
                apply(&mut text, edit);
            }
            let prompt = join(&text);
            let now = t0 + Duration::from_secs(turn as u64);
            let got = tokenizer
                .encode_incremental(&cache, "s", prompt.clone(), now)
                .expect("encodes");
            let full = tokenizer.encode(&prompt, false).expect("encodes");
            prop_assert_eq!(&got.tokens, &full, "turn {} of {:?}: {:?}", turn, tokenizer, prompt);
            prop_assert!(got.reused_tokens <= full.len());
            prop_assert_eq!(got.outcome == CacheOutcome::Hit, got.reused_tokens > 0);
            if let Some(previous) = &previous {
                // SmolLM's tokens never overlap, so the first "<|im_end|>" is always a cut point
                // once enough text after it is shared, and it is never token 0.
                if variant_index == 0
                    && let Some(at) = previous.find("<|im_end|>")
                    && at > 0
                    && common_prefix(previous, &prompt) >= at + 10 + LONGEST_ADDED
                {
                    prop_assert_eq!(got.outcome, CacheOutcome::Hit);
                }
            } else {
                prop_assert_eq!(got.outcome, CacheOutcome::Miss);
            }
            previous = Some(prompt);
        }
    }
}

/// Ends of a shared prefix: at a cut point, inside an added token, or before one that an
/// overlapping added token starts earlier than.
const SEAM_ENDS: &[&str] = &[
    "<|im_end|>",
    "<|im_start|>",
    "=<|im_end|>",
    "<|im_",
    "=",
    "<|im_end|>\n",
    "<|im_start|>user\n",
];
/// How a prompt continues past the shared prefix.
const CONTINUATIONS: &[&str] = &[
    "\n",
    "\n<|im_start|>",
    "<|im_start|>",
    "end|>",
    "x",
    " ",
    "|>",
    "\n\n",
    "<|im_end|>\n",
];

fn tail() -> impl Strategy<Value = (usize, Vec<usize>)> {
    (0..CONTINUATIONS.len(), fragments())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    /// Two turns whose shared prefix ends at or inside an added token, continued by text that
    /// added tokens can match across the end of the shared prefix: the second turn is exact.
    #[test]
    fn incremental_equals_full_across_the_seam(
        variant_index in 0usize..3,
        common in fragments(),
        end in 0..SEAM_ENDS.len(),
        old_tail in proptest::option::of(tail()),
        new_tail in tail(),
    ) {
        let tokenizer = variant(variant_index);
        let shared = join(&common) + SEAM_ENDS[end];
        let continued = |(first, rest): &(usize, Vec<usize>)| {
            format!("{shared}{}{}", CONTINUATIONS[*first], join(rest))
        };
        let old = old_tail.as_ref().map_or_else(|| shared.clone(), continued);
        let new = continued(&new_tail);
        let cache = SessionCache::default();
        let now = Instant::now();
        for prompt in [&old, &new] {
            let got = tokenizer
                .encode_incremental(&cache, "s", prompt.clone(), now)
                .expect("encodes");
            let full = tokenizer.encode(prompt, false).expect("encodes");
            prop_assert_eq!(got.tokens, full, "{:?}: {:?} then {:?}", tokenizer, old, new);
        }
    }
}

// === Random conversations through the chat template ===

#[derive(Debug, Clone)]
enum Turn {
    Append(Vec<(usize, Vec<usize>)>),
    EditContent(usize, Vec<usize>),
    DropLast(usize),
    ToggleGenerationPrompt,
}

fn message() -> impl Strategy<Value = (usize, Vec<usize>)> {
    (0usize..3, fragments())
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        5 => proptest::collection::vec(message(), 1..4).prop_map(Turn::Append),
        1 => (any::<usize>(), fragments()).prop_map(|(i, c)| Turn::EditContent(i, c)),
        1 => (1usize..3).prop_map(Turn::DropLast),
        1 => Just(Turn::ToggleGenerationPrompt),
    ]
}

fn to_message((role, content): &(usize, Vec<usize>)) -> Value {
    let role = ["user", "assistant", "tool"][role % 3];
    json!({"role": role, "content": join(content)})
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Agent-like sessions (appended turns, edited or dropped messages, the generation prompt on
    /// and off) encode exactly as `encode_chat`, and reuse whenever a message before the change
    /// is complete.
    #[test]
    fn chat_sessions_equal_encode_chat(
        system in fragments(),
        first in proptest::collection::vec(message(), 1..4),
        turns in proptest::collection::vec(turn(), 1..8),
    ) {
        let tokenizer = &*SMOLLM;
        let cache = SessionCache::default();
        let t0 = Instant::now();
        let mut messages = vec![json!({"role": "system", "content": join(&system)})];
        messages.extend(first.iter().map(to_message));
        let mut generation_prompt = true;
        let mut previous: Option<String> = None;
        for (index, turn) in std::iter::once(None).chain(turns.iter().map(Some)).enumerate() {
            match turn {
                None => {}
                Some(Turn::Append(new)) => messages.extend(new.iter().map(to_message)),
                Some(Turn::EditContent(i, content)) => {
                    let i = i % messages.len();
                    messages[i]["content"] = json!(join(content));
                }
                Some(Turn::DropLast(n)) => messages.truncate(messages.len().saturating_sub(*n).max(1)),
                Some(Turn::ToggleGenerationPrompt) => generation_prompt = !generation_prompt,
            }
            let input = ChatTemplateInput {
                messages: &messages,
                add_generation_prompt: generation_prompt,
                ..Default::default()
            };
            let now = t0 + Duration::from_secs(index as u64);
            let got = tokenizer
                .encode_chat_incremental(&cache, "agent", &input, now)
                .expect("encodes");
            prop_assert_eq!(&got.tokens, &tokenizer.encode_chat(&input).expect("encodes"));
            let prompt = tokenizer.render_chat(&input).expect("renders");
            if let Some(previous) = &previous {
                let first_end = previous.find("<|im_end|>").expect("a message") + 10;
                if common_prefix(previous, &prompt) >= first_end + LONGEST_ADDED {
                    prop_assert_eq!(got.outcome, CacheOutcome::Hit);
                }
            }
            previous = Some(prompt);
        }
    }
}

// === Where reuse happens ===

/// A coding-agent history: tool calls and code-like tool results.
fn history(steps: usize) -> Vec<Value> {
    let mut messages =
        vec![json!({"role": "system", "content": "You are a coding agent. Use the tools."})];
    for step in 0..steps {
        messages.push(json!({"role": "user", "content": format!("Step {step}: fix the bug in module_{step}.")}));
        messages.push(json!({"role": "assistant", "content": format!(
            "<tool_call>{{\"name\": \"read_file\", \"arguments\": {{\"path\": \"src/module_{step}.rs\"}}}}</tool_call>")}));
        messages.push(json!({"role": "tool", "content": format!(
            "fn step_{step}() {{\n    let naïve_{step} = cache({step}, \"🚦 prefix\");\n}}\n")}));
    }
    messages
}

fn chat(messages: &[Value]) -> ChatTemplateInput<'_> {
    ChatTemplateInput {
        messages,
        add_generation_prompt: true,
        ..Default::default()
    }
}

/// `encode_if_cached` answers only the very prompt the cache holds, with its tokens, and counts
/// a hit; anything else is left to a tokenizer pass and leaves the cache as it was.
#[test]
fn only_a_cached_prompt_is_answered_without_the_tokenizer() {
    let tokenizer = &*SMOLLM;
    let cache = SessionCache::default();
    let now = Instant::now();
    let messages = history(4);
    let text = tokenizer.render_chat(&chat(&messages)).expect("renders");
    let key = content_key(&text);
    assert!(
        tokenizer
            .encode_if_cached(&cache, &key, &text, now)
            .is_none()
    );
    assert_eq!(cache.stats().hits + cache.stats().misses, 0);

    let first = tokenizer
        .encode_incremental(&cache, &key, text.clone(), now)
        .expect("encodes");
    let again = tokenizer
        .encode_if_cached(&cache, &key, &text, now)
        .expect("the same prompt is cached");
    assert_eq!(again.tokens, first.tokens);
    assert_eq!(
        again.tokens,
        tokenizer.encode_chat(&chat(&messages)).expect("encodes")
    );
    assert_eq!(
        (again.outcome, again.reused_tokens),
        (CacheOutcome::Hit, first.tokens.len())
    );
    assert_eq!(cache.stats().hits, 1);

    // A prompt that continues it needs the tokenizer for what it added.
    let longer = format!("{text}more");
    assert!(
        tokenizer
            .encode_if_cached(&cache, &key, &longer, now)
            .is_none()
    );
    assert!(
        tokenizer
            .encode_if_cached(&cache, "another", &text, now)
            .is_none()
    );
    assert_eq!(cache.stats().hits, 1);
}

#[test]
fn an_appended_turn_encodes_only_from_the_generation_prompt() {
    let tokenizer = &*SMOLLM;
    let cache = SessionCache::default();
    let now = Instant::now();
    // The history up to the user's request of step 20, then the assistant's tool call and the
    // tool's result.
    let mut messages = history(21);
    let added = messages.split_off(62);
    let old = tokenizer.render_chat(&chat(&messages)).expect("renders");
    let first = tokenizer
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    assert_eq!(first.outcome, CacheOutcome::Miss);
    assert_eq!(first.reused_tokens, 0);

    messages.extend(added);
    let new = tokenizer.render_chat(&chat(&messages)).expect("renders");
    assert!(new.starts_with(&old));
    let second = tokenizer
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    assert_eq!(
        second.tokens,
        tokenizer.encode_chat(&chat(&messages)).expect("encodes")
    );
    assert_eq!(second.outcome, CacheOutcome::Hit);
    // The cut is the old prompt's trailing "<|im_start|>" (of "assistant\n"): everything before
    // it is reused, the rest is encoded.
    let cut = old.rfind(IM_START).expect("generation prompt");
    let suffix = tokenizer.encode(&new[cut..], false).expect("encodes");
    assert_eq!(second.tokens.len() - second.reused_tokens, suffix.len());
    assert_eq!(
        second.reused_tokens,
        tokenizer.encode(&old[..cut], false).expect("encodes").len()
    );
}

#[test]
fn an_edit_in_the_middle_reuses_up_to_the_edited_message() {
    let tokenizer = &*SMOLLM;
    let cache = SessionCache::default();
    let now = Instant::now();
    let mut messages = history(10);
    tokenizer
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    messages[13]["content"] = json!("Step 4: actually, fix module_9 first.");
    let edited = tokenizer.render_chat(&chat(&messages)).expect("renders");
    let got = tokenizer
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    assert_eq!(
        got.tokens,
        tokenizer.encode(&edited, false).expect("encodes")
    );
    assert_eq!(got.outcome, CacheOutcome::Hit);
    let at = edited.find("Step 4: actually").expect("edited");
    let cut = edited[..at].rfind(IM_START).expect("message start");
    assert_eq!(
        got.reused_tokens,
        tokenizer
            .encode(&edited[..cut], false)
            .expect("encodes")
            .len()
    );
}

#[test]
fn an_edit_of_the_first_message_falls_back() {
    let tokenizer = &*SMOLLM;
    let cache = SessionCache::default();
    let now = Instant::now();
    let mut messages = history(3);
    tokenizer
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    messages[0]["content"] = json!("You are a careful coding agent.");
    let got = tokenizer
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    assert_eq!(got.outcome, CacheOutcome::Fallback);
    assert_eq!(got.reused_tokens, 0);
    assert_eq!(
        got.tokens,
        tokenizer.encode_chat(&chat(&messages)).expect("encodes")
    );
    assert_eq!(cache.stats().fallbacks, 1);
}

#[test]
fn the_same_prompt_again_reuses_everything() {
    let tokenizer = &*SMOLLM;
    let cache = SessionCache::default();
    let now = Instant::now();
    let messages = history(4);
    let first = tokenizer
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    let again = tokenizer
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    assert_eq!(again.tokens, first.tokens);
    assert_eq!(again.reused_tokens, first.tokens.len());
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses), (1, 1));
    assert_eq!(stats.encoded_tokens, first.tokens.len() as u64);
    assert_eq!(stats.reused_tokens, first.tokens.len() as u64);
}

#[test]
fn without_a_session_id_the_prompt_is_found_by_its_content() {
    let tokenizer = &*SMOLLM;
    let cache = SessionCache::default();
    let now = Instant::now();
    let mut messages = history(12);
    let first = tokenizer
        .encode_chat_by_content(&cache, &chat(&messages), now)
        .expect("encodes");
    assert_eq!(first.outcome, CacheOutcome::Miss);
    // The same conversation resent: nothing is encoded again.
    let again = tokenizer
        .encode_chat_by_content(&cache, &chat(&messages), now)
        .expect("encodes");
    assert_eq!(again.tokens, first.tokens);
    assert_eq!(again.reused_tokens, first.tokens.len());
    // The next turn starts the same way, so it has the same key and reuses the turn before.
    messages.extend(history(13).split_off(37));
    let next = tokenizer
        .encode_chat_by_content(&cache, &chat(&messages), now)
        .expect("encodes");
    assert_eq!(
        next.tokens,
        tokenizer.encode_chat(&chat(&messages)).expect("encodes")
    );
    assert_eq!(next.outcome, CacheOutcome::Hit);
    assert!(next.reused_tokens > first.tokens.len() / 2);
    // Another conversation under the same key (the same first kilobyte) still gets its own
    // tokens: a key names where to look, the text decides what is reused.
    let mut other = history(12);
    other[30]["content"] = json!("Step 9: leave module_9 alone.");
    let rendered = tokenizer.render_chat(&chat(&other)).expect("renders");
    let mine = tokenizer.render_chat(&chat(&messages)).expect("renders");
    assert_eq!(content_key(&rendered), content_key(&mine));
    let got = tokenizer
        .encode_chat_by_content(&cache, &chat(&other), now)
        .expect("encodes");
    assert_eq!(
        got.tokens,
        tokenizer.encode_chat(&chat(&other)).expect("encodes")
    );
    assert_eq!(cache.stats().entries, 1);
}

#[test]
fn content_keys_cover_the_first_kilobyte_at_a_char_boundary() {
    let short = "é".repeat(CONTENT_KEY_BYTES);
    let longer = format!("{short}and more");
    // 1,024 bytes of two-byte characters: the key stops at a boundary, and what follows the
    // first kilobyte does not change it.
    assert_eq!(content_key(&short), content_key(&longer));
    assert_ne!(content_key("a"), content_key("b"));
    assert!(content_key("").starts_with("~content:"));
}

#[test]
fn a_model_without_cut_points_always_takes_the_full_pass() {
    let plain = model("no-added-tokens", |tokenizer| {
        tokenizer["added_tokens"] = json!([]);
    });
    assert!(!plain.supports_incremental());
    assert!(SMOLLM.supports_incremental());
    let cache = SessionCache::default();
    let now = Instant::now();
    let messages = history(3);
    for _ in 0..2 {
        let got = plain
            .encode_chat_incremental(&cache, "s", &chat(&messages), now)
            .expect("encodes");
        assert_eq!(got.outcome, CacheOutcome::Miss);
        assert_eq!(
            got.tokens,
            plain.encode_chat(&chat(&messages)).expect("encodes")
        );
    }
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn another_models_tokens_are_never_reused() {
    let a = ModelTokenizer::embedded_default().expect("loads");
    let b = METASPACE.clone();
    let cache = SessionCache::default();
    let now = Instant::now();
    let messages = history(3);
    a.encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    let got = b
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    assert_eq!(got.outcome, CacheOutcome::Miss);
    assert_eq!(
        got.tokens,
        b.encode_chat(&chat(&messages)).expect("encodes")
    );
    // A clone shares the model, and its cache entries.
    let again = b
        .clone()
        .encode_chat_incremental(&cache, "s", &chat(&messages), now)
        .expect("encodes");
    assert_eq!(again.outcome, CacheOutcome::Hit);
}

// === The cache's bounds ===

fn encode_turn(cache: &SessionCache, session: &str, steps: usize, now: Instant) -> CacheOutcome {
    let messages = history(steps);
    let got = SMOLLM
        .encode_chat_incremental(cache, session, &chat(&messages), now)
        .expect("encodes");
    assert_eq!(
        got.tokens,
        SMOLLM.encode_chat(&chat(&messages)).expect("encodes")
    );
    got.outcome
}

#[test]
fn least_recently_used_sessions_are_evicted_past_max_sessions() {
    let cache = SessionCache::new(SessionCacheConfig {
        max_sessions: 2,
        ..Default::default()
    });
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    encode_turn(&cache, "a", 2, at(0));
    encode_turn(&cache, "b", 2, at(1));
    assert_eq!(encode_turn(&cache, "a", 3, at(2)), CacheOutcome::Hit);
    encode_turn(&cache, "c", 2, at(3)); // evicts b, the least recently used
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.evictions), (2, 1));
    assert_eq!(encode_turn(&cache, "a", 4, at(4)), CacheOutcome::Hit);
    assert_eq!(encode_turn(&cache, "b", 3, at(5)), CacheOutcome::Miss);
}

#[test]
fn sessions_are_evicted_past_max_bytes_and_oversized_prompts_are_not_kept() {
    let probe = SessionCache::default();
    let now = Instant::now();
    encode_turn(&probe, "a", 2, now);
    let one = probe.stats().bytes;
    assert!(one > 0);

    // Room for two entries of this size, not three.
    let cache = SessionCache::new(SessionCacheConfig {
        max_bytes: one * 2 + one / 2,
        ..Default::default()
    });
    for session in ["a", "b", "c"] {
        encode_turn(&cache, session, 2, now);
    }
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.evictions), (2, 1));
    assert_eq!(stats.bytes, one * 2);
    assert_eq!(encode_turn(&cache, "a", 2, now), CacheOutcome::Miss);

    let tiny = SessionCache::new(SessionCacheConfig {
        max_bytes: one - 1,
        ..Default::default()
    });
    assert_eq!(encode_turn(&tiny, "a", 2, now), CacheOutcome::Miss);
    assert_eq!(tiny.stats().entries, 0);
    assert_eq!(encode_turn(&tiny, "a", 2, now), CacheOutcome::Miss);
}

#[test]
fn idle_sessions_expire_after_the_ttl() {
    let ttl = Duration::from_secs(60);
    let cache = SessionCache::new(SessionCacheConfig {
        idle_ttl: ttl,
        ..Default::default()
    });
    let t0 = Instant::now();
    encode_turn(&cache, "a", 2, t0);
    // Idle for exactly the TTL: still live, and the request refreshes it.
    assert_eq!(encode_turn(&cache, "a", 3, t0 + ttl), CacheOutcome::Hit);
    let later = t0 + ttl * 2 + Duration::from_millis(1);
    assert_eq!(encode_turn(&cache, "a", 4, later), CacheOutcome::Miss);
    assert_eq!(cache.stats().expirations, 1);

    encode_turn(&cache, "b", 2, later);
    assert_eq!(cache.evict_expired(later + ttl), 0);
    assert_eq!(
        cache.evict_expired(later + ttl + Duration::from_millis(1)),
        2
    );
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.bytes, stats.expirations), (0, 0, 3));
}

#[test]
fn remove_and_a_disabled_cache() {
    let cache = SessionCache::default();
    let now = Instant::now();
    encode_turn(&cache, "a", 2, now);
    assert!(cache.remove("a"));
    assert!(!cache.remove("a"));
    assert_eq!(cache.stats().bytes, 0);
    assert_eq!(encode_turn(&cache, "a", 3, now), CacheOutcome::Miss);

    let off = SessionCache::new(SessionCacheConfig {
        max_sessions: 0,
        ..Default::default()
    });
    encode_turn(&off, "a", 2, now);
    assert_eq!(encode_turn(&off, "a", 3, now), CacheOutcome::Miss);
    assert_eq!(off.stats().entries, 0);
}

#[test]
fn counters_add_up() {
    let cache = SessionCache::default();
    let now = Instant::now();
    let mut total = 0;
    for steps in 1..6 {
        let messages = history(steps);
        let got = SMOLLM
            .encode_chat_incremental(&cache, "s", &chat(&messages), now)
            .expect("encodes");
        total += got.tokens.len() as u64;
    }
    let stats = cache.stats();
    assert_eq!((stats.misses, stats.hits, stats.fallbacks), (1, 4, 0));
    assert_eq!(stats.reused_tokens + stats.encoded_tokens, total);
    assert!(stats.reused_tokens > stats.encoded_tokens);
}

#[test]
fn concurrent_sessions_share_one_cache() {
    let cache = SessionCache::new(SessionCacheConfig {
        max_sessions: 3,
        ..Default::default()
    });
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let cache = &cache;
            scope.spawn(move || {
                for steps in 1..6 {
                    // Two threads per session: interleaved turns of one session stay exact.
                    let session = format!("session-{}", thread % 2 + steps % 2);
                    encode_turn(cache, &session, steps + thread, t0);
                }
            });
        }
    });
    let stats = cache.stats();
    assert!(stats.entries <= 3);
    assert_eq!(stats.hits + stats.misses + stats.fallbacks, 20);
}

#[test]
fn side_requests_do_not_evict_the_conversation() {
    // OpenCode and Claude Code send titles and summaries under the conversation's session id.
    let cache = SessionCache::default();
    let now = Instant::now();
    let conversation = history(12);
    let first = SMOLLM
        .encode_chat_incremental(&cache, "s", &chat(&conversation), now)
        .expect("encodes");
    let title = vec![
        json!({"role": "system", "content": "You write titles."}),
        json!({"role": "user", "content": "Title for: fix the bug in module_0."}),
    ];
    for _ in 0..2 {
        let side = SMOLLM
            .encode_chat_incremental(&cache, "s", &chat(&title), now)
            .expect("encodes");
        assert_eq!(
            side.tokens,
            SMOLLM.encode_chat(&chat(&title)).expect("encodes")
        );
    }
    let next = history(13);
    let got = SMOLLM
        .encode_chat_incremental(&cache, "s", &chat(&next), now)
        .expect("encodes");
    assert_eq!(got.outcome, CacheOutcome::Hit);
    assert_eq!(
        got.tokens,
        SMOLLM.encode_chat(&chat(&next)).expect("encodes")
    );
    assert!(
        got.reused_tokens + 8 >= first.tokens.len(),
        "{} of {}",
        got.reused_tokens,
        first.tokens.len()
    );

    // Past `prompts_per_session`, the least recently used prompt goes.
    let one = SessionCache::new(SessionCacheConfig {
        prompts_per_session: 1,
        ..Default::default()
    });
    encode_turn(&one, "s", 3, now);
    SMOLLM
        .encode_chat_incremental(&one, "s", &chat(&title), now)
        .expect("encodes");
    assert_ne!(encode_turn(&one, "s", 4, now), CacheOutcome::Hit);
}
