//! Cut points and the prefix compare; the end-to-end properties are in `tests/incremental.rs`.

use proptest::prelude::*;
use tokenizers::{AddedToken, Tokenizer};

use super::common_prefix_len;
use super::seams::{Anchor, Seams};

const TOKENIZER_JSON: &[u8] = include_bytes!("../../assets/smollm2-135m-instruct/tokenizer.json");

fn smollm() -> Tokenizer {
    Tokenizer::from_bytes(TOKENIZER_JSON).expect("tokenizer loads")
}

fn anchors_of(seams: &Seams, tokenizer: &Tokenizer, text: &str) -> Vec<Anchor> {
    let encoding = tokenizer.encode(text, false).expect("encodes");
    let mut anchors = Vec::new();
    seams.collect_anchors(
        text,
        encoding.get_ids(),
        encoding.get_offsets(),
        0,
        0,
        &mut anchors,
    );
    anchors
}

#[test]
fn anchors_are_the_added_tokens_of_the_text() {
    let tokenizer = smollm();
    let seams = Seams::new(&tokenizer).expect("SmolLM has cut points");
    let text = "<|im_start|>user\nsay <|im_end|> twice<|im_end|>\n";
    let anchors = anchors_of(&seams, &tokenizer, text);
    let ids = tokenizer.encode(text, false).expect("encodes");
    let starts: Vec<usize> = anchors.iter().map(|a| a.start).collect();
    let expected: Vec<usize> = text.match_indices("<|im_").map(|(at, _)| at).collect();
    assert_eq!(starts, expected);
    for anchor in &anchors {
        let token = ids.get_ids()[anchor.token];
        assert_eq!(
            tokenizer.id_to_token(token).as_deref(),
            Some(&text[anchor.start..anchor.end])
        );
    }
}

#[test]
fn rejects_a_cut_that_a_longer_added_token_could_cross() {
    let mut tokenizer = smollm();
    // "<|im_end|>\n" extends the anchor "<|im_end|>": whether it matches depends on the byte after
    // the anchor.
    tokenizer.add_special_tokens(&[AddedToken::from("<|im_end|>\n", true)]);
    let seams = Seams::new(&tokenizer).expect("has cut points");
    let old = "<|im_start|>user\nhi<|im_end|>";
    let anchors = anchors_of(&seams, &tokenizer, old);
    let last = anchors.len() - 1;

    let plain = format!("{old} and more");
    let cut = seams.last_cut(&anchors, plain.as_bytes(), old.len());
    assert_eq!(cut, Some(last), "nothing crosses: the last anchor is fine");

    let crossing = format!("{old}\nmore");
    let cut = seams.last_cut(&anchors, crossing.as_bytes(), old.len());
    assert_eq!(
        cut,
        Some(last - 1),
        "the longer token ends past the shared prefix"
    );
}

#[test]
fn rejects_anchors_past_the_shared_prefix() {
    let tokenizer = smollm();
    let seams = Seams::new(&tokenizer).expect("has cut points");
    let old =
        "<|im_start|>user\nhello there, a long first message<|im_end|>\n<|im_start|>assistant\n";
    let anchors = anchors_of(&seams, &tokenizer, old);
    assert_eq!(anchors.len(), 3);
    let edited = old.replace("assistant", "user");
    let shared = common_prefix_len(old.as_bytes(), edited.as_bytes());
    // The last "<|im_start|>" ends at the divergence: still usable.
    assert_eq!(seams.last_cut(&anchors, edited.as_bytes(), shared), Some(2));
    // A divergence inside the first message leaves only the anchor at 0.
    let early = old.replace("first", "1st");
    let shared = common_prefix_len(old.as_bytes(), early.as_bytes());
    assert_eq!(seams.last_cut(&anchors, early.as_bytes(), shared), Some(0));
    // A divergence inside the first anchor's span leaves none.
    assert_eq!(seams.last_cut(&anchors, b"<|im_st", 7), None);
}

#[test]
fn tokenizers_without_safe_cut_points_are_refused() {
    let mut tokenizer = smollm();
    tokenizer.set_encode_special_tokens(true);
    assert!(Seams::new(&tokenizer).is_err());

    let mut tokenizer = smollm();
    tokenizer.add_special_tokens(&[AddedToken::from("<word>", true).single_word(true)]);
    assert!(Seams::new(&tokenizer).is_err());
}

#[test]
fn stripping_tokens_are_not_cut_points() {
    let mut tokenizer = smollm();
    tokenizer.add_special_tokens(&[
        AddedToken::from("<l>", true).lstrip(true),
        AddedToken::from("<r>", true).rstrip(true),
    ]);
    let seams = Seams::new(&tokenizer).expect("ChatML tokens remain");
    let text = "a <l> b <r> c<|im_end|>";
    let anchors = anchors_of(&seams, &tokenizer, text);
    let starts: Vec<usize> = anchors.iter().map(|a| a.start).collect();
    assert_eq!(starts, vec![text.find("<|im_end|>").expect("present")]);
}

proptest! {
    #[test]
    fn common_prefix_len_is_the_first_difference(
        a in proptest::collection::vec(0u8..4, 0..1500),
        cut in 0usize..1600,
        tail in proptest::collection::vec(0u8..4, 0..40),
    ) {
        let cut = cut.min(a.len());
        let mut b = a[..cut].to_vec();
        b.extend(&tail);
        let naive = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        prop_assert_eq!(common_prefix_len(&a, &b), naive);
        prop_assert_eq!(common_prefix_len(&b, &a), naive);
    }
}
