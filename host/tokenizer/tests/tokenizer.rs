//! Loading, special tokens, round trips and template errors.

use std::path::{Path, PathBuf};

use serde_json::json;
use switchyard_tokenizer::{
    ChatTemplateInput, EMBEDDED_DEFAULT_NAME, ModelTokenizer, TokenizerError,
};

const TOKENIZER_JSON: &[u8] = include_bytes!("../assets/smollm2-135m-instruct/tokenizer.json");

fn assets() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/smollm2-135m-instruct")
}

/// A model with SmolLM2's tokenizer and `template` as its chat template.
fn with_template(template: &str) -> ModelTokenizer {
    let config = json!({ "chat_template": template, "eos_token": "<|im_end|>" });
    ModelTokenizer::from_json("inline", TOKENIZER_JSON, config.to_string().as_bytes())
        .expect("model loads")
}

fn render(tokenizer: &ModelTokenizer) -> Result<String, TokenizerError> {
    let messages = [json!({"role": "user", "content": "hi"})];
    tokenizer.render_chat(&ChatTemplateInput {
        messages: &messages,
        ..Default::default()
    })
}

#[test]
fn from_dir_matches_the_embedded_default() {
    let from_dir = ModelTokenizer::from_dir(&assets()).expect("loads");
    let embedded = ModelTokenizer::embedded_default().expect("loads");
    assert_eq!(from_dir.name(), EMBEDDED_DEFAULT_NAME);
    assert_eq!(embedded.name(), EMBEDDED_DEFAULT_NAME);
    assert_eq!(
        render(&from_dir).expect("renders"),
        render(&embedded).expect("renders")
    );
}

#[test]
fn from_dir_prefers_chat_template_jinja() {
    let dir = std::env::temp_dir().join(format!("switchyard-tokenizer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(assets().join(file), dir.join(file)).expect("copy");
    }
    std::fs::write(
        dir.join("chat_template.jinja"),
        "{{ messages | length }} message",
    )
    .expect("write");
    let tokenizer = ModelTokenizer::from_dir(&dir);
    std::fs::remove_dir_all(&dir).expect("cleanup");
    assert_eq!(
        render(&tokenizer.expect("loads")).expect("renders"),
        "1 message"
    );
}

#[test]
fn from_dir_reports_the_missing_file() {
    let err = ModelTokenizer::from_dir(Path::new("/nonexistent/model")).expect_err("no files");
    assert!(
        matches!(err, TokenizerError::Io { ref path, .. } if path.ends_with("tokenizer_config.json"))
    );
}

#[test]
fn encode_decode_round_trip() {
    let tokenizer = ModelTokenizer::embedded_default().expect("loads");
    let text = "Routing 32K-token prompts: naïve → KV-aware 🚦\n\tfn f() { 42 }";
    let ids = tokenizer.encode(text, false).expect("encodes");
    assert_eq!(tokenizer.decode(&ids, false).expect("decodes"), text);
}

#[test]
fn special_tokens() {
    let tokenizer = ModelTokenizer::embedded_default().expect("loads");
    assert_eq!(tokenizer.vocab_size(), 49_152);
    assert_eq!(tokenizer.eos_token_id(), Some(2));
    assert_eq!(
        tokenizer
            .encode("<|im_start|><|im_end|>", false)
            .expect("encodes"),
        [1, 2]
    );
    assert!((0..=16).all(|id| tokenizer.is_special(id)));
    assert!(!tokenizer.is_special(17));
    assert_eq!(
        tokenizer.decode(&[1, 6004, 2], true).expect("decodes"),
        "hi"
    );
}

#[test]
fn clones_are_shareable_across_threads() {
    let tokenizer = ModelTokenizer::embedded_default().expect("loads");
    let clone = tokenizer.clone();
    let ids = std::thread::spawn(move || clone.encode("shared", false).expect("encodes"))
        .join()
        .expect("thread");
    assert_eq!(ids, tokenizer.encode("shared", false).expect("encodes"));
}

#[test]
fn missing_chat_template_is_a_clear_error() {
    let tokenizer = ModelTokenizer::from_json("bare", TOKENIZER_JSON, b"{}").expect("loads");
    assert!(
        matches!(render(&tokenizer), Err(TokenizerError::NoChatTemplate(name)) if name == "bare")
    );
    // Encoding needs no template.
    assert_eq!(tokenizer.encode("hi", false).expect("encodes"), [6004]);
}

#[test]
fn named_templates_without_default_are_a_clear_error() {
    let config = json!({ "chat_template": [{ "name": "tool_use", "template": "tools" }] });
    let tokenizer =
        ModelTokenizer::from_json("named", TOKENIZER_JSON, config.to_string().as_bytes())
            .expect("loads");
    assert!(matches!(
        render(&tokenizer),
        Err(TokenizerError::NoChatTemplate(_))
    ));
    let messages = [json!({"role": "user", "content": "hi"})];
    let input = ChatTemplateInput {
        messages: &messages,
        tools: Some(&[]),
        ..Default::default()
    };
    assert_eq!(tokenizer.render_chat(&input).expect("renders"), "tools");
}

#[test]
fn syntax_errors_fail_at_load_with_their_line() {
    let config = json!({ "chat_template": "ok\n{% if %}" });
    let err = ModelTokenizer::from_json("broken", TOKENIZER_JSON, config.to_string().as_bytes())
        .expect_err("does not compile");
    assert!(
        matches!(err, TokenizerError::Template { line: Some(2), .. }),
        "{err:?}"
    );
}

#[test]
fn render_errors_carry_their_line() {
    let err = render(&with_template("ok\n{{ messages[0].content + 1 }}")).expect_err("str + int");
    let TokenizerError::Template { message, line } = err else {
        panic!("{err:?}")
    };
    assert_eq!(line, Some(2));
    assert!(
        message.contains("line 2") || message.contains(":2"),
        "{message}"
    );
}

#[test]
fn raise_exception_is_its_own_error() {
    let tokenizer = with_template("{{ raise_exception('Only user turns, please') }}");
    assert!(
        matches!(render(&tokenizer), Err(TokenizerError::Raised(m)) if m == "Only user turns, please")
    );
}

#[test]
fn template_sees_special_tokens_and_extra_variables() {
    let tokenizer =
        with_template("{{ eos_token }}|{{ bos_token is defined }}|{{ tools is none }}|{{ mode }}");
    let messages = [json!({"role": "user", "content": "hi"})];
    let extra = json!({"mode": "fast", "eos_token": "<overridden>"});
    let input = ChatTemplateInput {
        messages: &messages,
        extra: extra.as_object(),
        ..Default::default()
    };
    assert_eq!(
        tokenizer.render_chat(&input).expect("renders"),
        "<overridden>|False|True|fast"
    );
}

#[test]
fn python_methods_and_loop_controls() {
    let template = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}\
        {{ m.content.strip().split(',') | join('+') }}{% for k, v in m.items() %} {{ k }}{% endfor %}{% endfor %}";
    let tokenizer = with_template(template);
    let messages = [
        json!({"role": "user", "content": " a,b "}),
        json!({"role": "user", "content": "x"}),
    ];
    let input = ChatTemplateInput {
        messages: &messages,
        ..Default::default()
    };
    assert_eq!(
        tokenizer.render_chat(&input).expect("renders"),
        "a+b role content"
    );
}

#[test]
fn strftime_now_formats_the_clock() {
    let year = render(&with_template("{{ strftime_now('%Y') }}")).expect("renders");
    assert!(year.len() == 4 && year.as_str() >= "2025", "{year}");
}

#[test]
fn the_embedded_agent_model_renders_tools_calls_results_and_reasoning() {
    let agent = ModelTokenizer::embedded_agent_model().expect("loads");
    let plain = ModelTokenizer::embedded_default().expect("loads");
    let tools = [json!({"type": "function", "function": {"name": "read_file",
        "description": "Read a file.", "parameters": {"type": "object",
        "properties": {"path": {"type": "string"}}}}})];
    let messages = [
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Fix the bug."}),
        json!({"role": "assistant", "content": "", "reasoning_content": "Look first.",
            "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "read_file", "arguments": {"path": "src/lib.rs"}}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "fn main() {}"}),
    ];
    let input = ChatTemplateInput {
        messages: &messages,
        tools: Some(&tools),
        add_generation_prompt: true,
        ..Default::default()
    };
    let text = agent.render_chat(&input).expect("renders");
    let expected = "<|im_start|>system\nYou are a coding agent.\n\n# Tools\n";
    assert!(text.starts_with(expected), "{text}");
    for part in [
        "\"name\": \"read_file\"",
        "<|im_start|>assistant\n<think>\nLook first.\n</think>\n\n\n<tool_call>\n{\"name\": \"read_file\", \"arguments\": {\"path\": \"src/lib.rs\"}}\n</tool_call><|im_end|>\n",
        "<|im_start|>tool\n<tool_response>\nfn main() {}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    ] {
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }
    // SmolLM2's own template leaves the tools out; without tools both templates agree.
    let with_tools = agent.encode_chat(&input).expect("encodes").len();
    assert!(with_tools > plain.encode_chat(&input).expect("encodes").len() + 40);
    let no_tools = ChatTemplateInput {
        tools: None,
        ..input
    };
    assert_eq!(
        agent.render_chat(&no_tools).expect("renders"),
        plain.render_chat(&no_tools).expect("renders")
    );
    assert_eq!(agent.name(), EMBEDDED_DEFAULT_NAME);
}
