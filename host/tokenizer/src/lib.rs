//! Switchyard's tokenizer: turns an OpenAI-style chat request into the exact token ids the engine
//! will see, so the router can hash the prompt into KV blocks before choosing a worker.
//!
//! A [`ModelTokenizer`] loads a Hugging Face model's `tokenizer.json` (with the `tokenizers`
//! crate) and the chat template of its `tokenizer_config.json` (with minijinja, configured like
//! Hugging Face's Jinja2 environment), and renders and encodes chats byte-for-byte as
//! `apply_chat_template` does. SmolLM2-135M-Instruct is compiled in as the default model.
//! [`ModelTokenizer::encode_chat_incremental`] with a [`SessionCache`] tokenizes only what each
//! turn of a session added, with the same result.
//!
//! ```
//! use switchyard_tokenizer::{ChatTemplateInput, ModelTokenizer};
//!
//! let tokenizer = ModelTokenizer::embedded_default()?;
//! let messages = [serde_json::json!({"role": "user", "content": "Hi"})];
//! let input = ChatTemplateInput { messages: &messages, add_generation_prompt: true, ..Default::default() };
//! let ids = tokenizer.encode_chat(&input)?;
//! assert!(tokenizer.decode(&ids, false)?.ends_with("<|im_start|>assistant\n"));
//! # Ok::<(), switchyard_tokenizer::TokenizerError>(())
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
mod incremental;
mod template;

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use minijinja::Environment;
use serde::Deserialize;
use tokenizers::Tokenizer;

pub use error::TokenizerError;
pub use incremental::{
    CONTENT_KEY_BYTES, CacheOutcome, IncrementalEncoding, SessionCache, SessionCacheConfig,
    SessionCacheStats, content_key,
};
pub use template::ChatTemplateInput;

/// Name of the model compiled in as [`ModelTokenizer::embedded_default`].
pub const EMBEDDED_DEFAULT_NAME: &str = "smollm2-135m-instruct";

/// Provenance and license (Apache-2.0) of the compiled-in model files, to ship with the binary.
pub const EMBEDDED_DEFAULT_NOTICE: &str = include_str!("../assets/smollm2-135m-instruct/README.md");

const EMBEDDED_TOKENIZER_JSON: &[u8] =
    include_bytes!("../assets/smollm2-135m-instruct/tokenizer.json");
const EMBEDDED_TOKENIZER_CONFIG_JSON: &[u8] =
    include_bytes!("../assets/smollm2-135m-instruct/tokenizer_config.json");
const EMBEDDED_TOOL_USE_TEMPLATE: &str =
    include_str!("../assets/smollm2-135m-instruct/agent_tool_use.jinja");

/// One model's tokenizer and chat template. Cheap to clone: clones share the loaded model.
#[derive(Clone)]
pub struct ModelTokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    /// Unique per loaded model (clones share it): a session cache never mixes models' tokens.
    id: u64,
    name: String,
    tokenizer: Tokenizer,
    /// The compiled chat templates, by name (`default`, `tool_use`, ...).
    templates: Environment<'static>,
    /// `bos_token`, `eos_token`, ... as the template sees them.
    special_tokens: Vec<(&'static str, String)>,
    vocab_size: u32,
    eos_token_id: Option<u32>,
    special_ids: HashSet<u32>,
    /// Where prompts can be cut for incremental encoding; `None` if nowhere.
    seams: Option<incremental::Seams>,
    model_max_length: Option<u32>,
}

/// Source of [`Inner::id`].
static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(0);

/// The fields of `tokenizer_config.json` that chat rendering needs.
#[derive(Deserialize)]
struct TokenizerConfig {
    chat_template: Option<ChatTemplates>,
    /// Often a placeholder (`1e30`) rather than the model's context: see
    /// [`ModelTokenizer::model_max_length`].
    model_max_length: Option<f64>,
    bos_token: Option<SpecialToken>,
    eos_token: Option<SpecialToken>,
    unk_token: Option<SpecialToken>,
    pad_token: Option<SpecialToken>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ChatTemplates {
    Single(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

/// A special token, written either as its text or as a serialized `AddedToken`.
#[derive(Deserialize)]
#[serde(untagged)]
enum SpecialToken {
    Text(String),
    Added { content: String },
}

impl SpecialToken {
    fn into_content(self) -> String {
        match self {
            Self::Text(content) | Self::Added { content } => content,
        }
    }
}

// === impl ModelTokenizer ===

impl ModelTokenizer {
    /// Loads a Hugging Face model directory: `tokenizer.json` and `tokenizer_config.json`, and
    /// `chat_template.jinja` where present (it overrides the config's template, as in Hugging
    /// Face). The model is named after the directory.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let read = |file: &str| {
            let path = dir.join(file);
            std::fs::read(&path).map_err(|source| TokenizerError::Io { path, source })
        };
        let mut config: TokenizerConfig = serde_json::from_slice(&read("tokenizer_config.json")?)
            .map_err(TokenizerError::Config)?;
        let template_path = dir.join("chat_template.jinja");
        if template_path.exists() {
            let template =
                std::fs::read_to_string(&template_path).map_err(|source| TokenizerError::Io {
                    path: template_path,
                    source,
                })?;
            config.chat_template = Some(ChatTemplates::Single(template));
        }
        let name = dir.file_name().unwrap_or(dir.as_os_str()).to_string_lossy();
        Self::build(name.into_owned(), &read("tokenizer.json")?, config)
    }

    /// The SmolLM2-135M-Instruct tokenizer and chat template, compiled into the binary.
    pub fn embedded_default() -> Result<Self, TokenizerError> {
        Self::from_json(
            EMBEDDED_DEFAULT_NAME,
            EMBEDDED_TOKENIZER_JSON,
            EMBEDDED_TOKENIZER_CONFIG_JSON,
        )
    }

    /// The embedded default's model as the embedded mock engines serve it: SmolLM2's tokenizer
    /// and template, plus a `tool_use` template that renders tools, tool calls and reasoning in
    /// the Hermes convention. SmolLM2's own template leaves tools out, which would make a coding
    /// agent's 20K tokens of tool definitions cost nothing.
    pub fn embedded_agent_model() -> Result<Self, TokenizerError> {
        let mut config: TokenizerConfig = serde_json::from_slice(EMBEDDED_TOKENIZER_CONFIG_JSON)
            .map_err(TokenizerError::Config)?;
        let default = match config.chat_template.take() {
            Some(ChatTemplates::Single(source)) => source,
            _ => return Err(TokenizerError::NoChatTemplate(EMBEDDED_DEFAULT_NAME.into())),
        };
        config.chat_template = Some(ChatTemplates::Named(vec![
            NamedTemplate {
                name: template::DEFAULT_TEMPLATE.to_owned(),
                template: default,
            },
            NamedTemplate {
                name: template::TOOL_USE_TEMPLATE.to_owned(),
                template: EMBEDDED_TOOL_USE_TEMPLATE.to_owned(),
            },
        ]));
        Self::build(
            EMBEDDED_DEFAULT_NAME.to_owned(),
            EMBEDDED_TOKENIZER_JSON,
            config,
        )
    }

    /// Loads a model from the contents of its `tokenizer.json` and `tokenizer_config.json`.
    pub fn from_json(
        name: &str,
        tokenizer_json: &[u8],
        tokenizer_config_json: &[u8],
    ) -> Result<Self, TokenizerError> {
        let config =
            serde_json::from_slice(tokenizer_config_json).map_err(TokenizerError::Config)?;
        Self::build(name.to_owned(), tokenizer_json, config)
    }

    fn build(
        name: String,
        tokenizer_json: &[u8],
        config: TokenizerConfig,
    ) -> Result<Self, TokenizerError> {
        let mut tokenizer =
            Tokenizer::from_bytes(tokenizer_json).map_err(TokenizerError::Tokenizer)?;
        // Hugging Face encodes chats without the truncation or padding a tokenizer.json may carry:
        // a silently truncated prompt would hash to the wrong blocks.
        tokenizer
            .with_truncation(None)
            .map_err(TokenizerError::Tokenizer)?
            .with_padding(None);

        let templates = match config.chat_template {
            None => Vec::new(),
            Some(ChatTemplates::Single(source)) => {
                vec![(template::DEFAULT_TEMPLATE.to_owned(), source)]
            }
            Some(ChatTemplates::Named(named)) => named
                .into_iter()
                .map(|NamedTemplate { name, template }| (name, template))
                .collect(),
        };
        let special_tokens: Vec<(&'static str, String)> = [
            ("bos_token", config.bos_token),
            ("eos_token", config.eos_token),
            ("unk_token", config.unk_token),
            ("pad_token", config.pad_token),
        ]
        .into_iter()
        .filter_map(|(name, token)| Some((name, token?.into_content())))
        .collect();
        let eos_token_id = special_tokens
            .iter()
            .find(|(name, _)| *name == "eos_token")
            .and_then(|(_, token)| tokenizer.token_to_id(token));
        let special_ids = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        // Token ids are u32, so a vocabulary always fits.
        let vocab_size = u32::try_from(tokenizer.get_vocab_size(true)).unwrap_or(u32::MAX);

        let seams = incremental::Seams::new(&tokenizer).ok();
        // Transformers writes a huge placeholder when the model's context is unknown.
        let model_max_length = config
            .model_max_length
            .filter(|&n| n >= 1.0 && n <= f64::from(u32::MAX))
            .map(|n| n as u32);

        Ok(Self {
            inner: Arc::new(Inner {
                id: NEXT_MODEL_ID.fetch_add(1, Ordering::Relaxed),
                name,
                templates: template::environment(templates)?,
                tokenizer,
                special_tokens,
                vocab_size,
                eos_token_id,
                special_ids,
                seams,
                model_max_length,
            }),
        })
    }

    /// `model_max_length` from `tokenizer_config.json`, when it is a real length (the model's
    /// context window, for most models).
    pub fn model_max_length(&self) -> Option<u32> {
        self.inner.model_max_length
    }

    /// The model's name: its directory's name, or [`EMBEDDED_DEFAULT_NAME`].
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Renders a chat to the prompt text, as `apply_chat_template(tokenize=False)`.
    ///
    /// [`TokenizerError::Raised`] and [`TokenizerError::EmptyConversation`] mean the request is
    /// invalid for this model; other errors are the model's or the server's.
    pub fn render_chat(&self, input: &ChatTemplateInput<'_>) -> Result<String, TokenizerError> {
        let inner = &*self.inner;
        template::render(&inner.templates, &inner.name, &inner.special_tokens, input)
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (e.g. BOS).
    /// Special tokens written in the text are always recognised.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let encoding = self
            .inner
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(TokenizerError::Tokenizer)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of a rendered chat, as `apply_chat_template(tokenize=True)`: the template writes
    /// the special tokens itself, so none are added.
    pub fn encode_chat(&self, input: &ChatTemplateInput<'_>) -> Result<Vec<u32>, TokenizerError> {
        self.encode(&self.render_chat(input)?, false)
    }

    /// Text of `ids`, dropping the tokens [`is_special`](Self::is_special) if asked.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(TokenizerError::Tokenizer)
    }

    /// Number of tokens, added tokens included (Python's `len(tokenizer)`).
    pub fn vocab_size(&self) -> u32 {
        self.inner.vocab_size
    }

    /// Id of `eos_token` from `tokenizer_config.json`, if it names a token.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.inner.eos_token_id
    }

    /// Whether `id` is an added token marked special in `tokenizer.json` (ChatML markers, EOS, ...).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.special_ids.contains(&id)
    }
}

impl fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("name", &self.inner.name)
            .field("vocab_size", &self.inner.vocab_size)
            .finish_non_exhaustive()
    }
}
