//! Golden tests against Hugging Face `transformers` (fixtures/make_fixtures.py wrote golden.json).

use serde::Deserialize;
use serde_json::{Map, Value};
use switchyard_tokenizer::{ChatTemplateInput, ModelTokenizer, TokenizerError};

const GOLDEN: &str = include_str!("fixtures/golden.json");

#[derive(Deserialize)]
struct Golden {
    vocab_size: u32,
    eos_token_id: u32,
    chat: Vec<ChatCase>,
    encode: Vec<EncodeCase>,
}

#[derive(Deserialize)]
struct ChatCase {
    model: String,
    name: String,
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    add_generation_prompt: bool,
    extra: Option<Map<String, Value>>,
    text: Option<String>,
    ids: Option<Vec<u32>>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct EncodeCase {
    text: String,
    ids: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

fn golden() -> Golden {
    serde_json::from_str(GOLDEN).expect("golden.json parses")
}

fn tokenizer(model: &str) -> ModelTokenizer {
    match model {
        "smollm2" => ModelTokenizer::embedded_default(),
        "tool-template" => ModelTokenizer::from_json(
            model,
            include_bytes!("../assets/smollm2-135m-instruct/tokenizer.json"),
            include_bytes!("fixtures/tool-template/tokenizer_config.json"),
        ),
        other => panic!("unknown fixture model {other}"),
    }
    .expect("fixture model loads")
}

#[test]
fn chat_renders_and_encodes_like_hugging_face() {
    let golden = golden();
    let smollm2 = tokenizer("smollm2");
    let tool_template = tokenizer("tool-template");
    for case in &golden.chat {
        let tokenizer = if case.model == "smollm2" {
            &smollm2
        } else {
            &tool_template
        };
        let input = ChatTemplateInput {
            messages: &case.messages,
            tools: case.tools.as_deref(),
            add_generation_prompt: case.add_generation_prompt,
            extra: case.extra.as_ref(),
        };
        match (&case.text, &case.ids, &case.error) {
            (Some(text), Some(ids), None) => {
                assert_eq!(
                    &tokenizer.render_chat(&input).expect(&case.name),
                    text,
                    "{}",
                    case.name
                );
                assert_eq!(
                    &tokenizer.encode_chat(&input).expect(&case.name),
                    ids,
                    "{}",
                    case.name
                );
            }
            (None, None, Some(error)) => {
                let err = tokenizer.render_chat(&input).expect_err(&case.name);
                match err {
                    TokenizerError::Raised(message) => assert_eq!(&message, error, "{}", case.name),
                    TokenizerError::EmptyConversation => {
                        assert!(error.contains("empty conversation"), "{}", case.name);
                    }
                    other => panic!("{}: unexpected error {other}", case.name),
                }
            }
            _ => panic!("{}: malformed fixture", case.name),
        }
    }
}

#[test]
fn fixtures_cover_each_outcome() {
    let golden = golden();
    let names: Vec<&str> = golden.chat.iter().map(|case| case.name.as_str()).collect();
    for name in [
        "multi_turn",
        "non_ascii",
        "tool_use",
        "empty_conversation",
        "bad_role",
    ] {
        assert!(names.contains(&name), "missing fixture {name}");
    }
}

#[test]
fn encode_and_decode_like_hugging_face() {
    let golden = golden();
    let tokenizer = tokenizer("smollm2");
    for case in &golden.encode {
        let ids = tokenizer.encode(&case.text, false).expect("encodes");
        assert_eq!(ids, case.ids, "{:?}", case.text);
        // SmolLM2 has no post-processor: special tokens add nothing.
        assert_eq!(
            tokenizer.encode(&case.text, true).expect("encodes"),
            case.ids
        );
        assert_eq!(
            tokenizer.decode(&ids, false).expect("decodes"),
            case.decoded
        );
        assert_eq!(
            tokenizer.decode(&ids, true).expect("decodes"),
            case.decoded_skip_special
        );
    }
}

#[test]
fn vocabulary_and_special_tokens_match_hugging_face() {
    let golden = golden();
    let tokenizer = tokenizer("smollm2");
    assert_eq!(tokenizer.vocab_size(), golden.vocab_size);
    assert_eq!(tokenizer.eos_token_id(), Some(golden.eos_token_id));
}
