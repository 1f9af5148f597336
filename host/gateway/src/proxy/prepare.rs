//! The first stage: a client's body decoded into the internal representation, checked, and its
//! prompt tokenized exactly as the engine will see it.

use crate::agent::{AgentContext, Harness};
use crate::error::GatewayError;
use crate::metrics::{SessionLabels, ToolTypeLabels};
use crate::server::Shared;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use switchyard_frontend::{
    AgentHints, Api, ApiError, Block, CacheControl, Completion, Conversation, ErrorKind, Prompt,
    ResponsesRequest, chat, completions, messages, responses, to_template_messages,
};
use switchyard_tokenizer::{CacheOutcome, ChatTemplateInput, IncrementalEncoding, content_key};

/// A decoded request.
#[derive(Debug)]
pub(crate) enum Request {
    /// Chat completions or Anthropic messages.
    Chat(Conversation),
    /// The Responses API: a conversation plus what the response store needs.
    Responses(ResponsesRequest),
    /// Text completions: a raw prompt.
    Completion(Completion),
}

impl Request {
    /// The conversation, for the chat-shaped APIs.
    pub(crate) fn conversation(&self) -> Option<&Conversation> {
        match self {
            Request::Chat(c) => Some(c),
            Request::Responses(r) => Some(&r.conversation),
            Request::Completion(_) => None,
        }
    }

    /// `(stream, include_usage)` as the client asked.
    pub(crate) fn streaming(&self) -> (bool, bool) {
        match self {
            Request::Completion(c) => (c.stream, c.include_usage),
            _ => self
                .conversation()
                .map_or((false, false), |c| (c.stream, c.include_usage)),
        }
    }

    /// The agent hints (`nvext.agent_hints`).
    pub(crate) fn hints(&self) -> AgentHints {
        match self {
            Request::Completion(c) => c.hints,
            _ => self.conversation().map(|c| c.hints).unwrap_or_default(),
        }
    }

    /// How long to keep the prompt's prefix cached, if asked.
    pub(crate) fn cache_control(&self) -> Option<CacheControl> {
        match self {
            Request::Completion(c) => c.cache_control,
            _ => self.conversation().and_then(|c| c.cache_control),
        }
    }

    /// Output tokens to expect: the hint, else the limit.
    pub(crate) fn expected_output_tokens(&self) -> Option<u32> {
        let max_tokens = match self {
            Request::Completion(c) => c.sampling.max_tokens,
            _ => self.conversation().and_then(|c| c.sampling.max_tokens),
        };
        self.hints().osl.or(max_tokens)
    }
}

/// A request ready to route: decoded, and its prompt tokenized.
#[derive(Debug)]
pub(crate) struct Turn {
    pub(crate) api: Api,
    pub(crate) request: Request,
    /// The prompt's token ids, exactly as the engine will see them.
    pub(crate) tokens: Vec<u32>,
    /// The output limit the engine gets when the client set none: the rest of the context
    /// window, as vLLM's chat endpoint would allow (its completions endpoint, which `tokens` mode
    /// uses, would stop after 16).
    pub(crate) default_max_tokens: u32,
    /// The client's body, for traces that include content.
    pub(crate) body: Value,
}

/// Decode `bytes` for `api` and tokenize its prompt. A Responses request's `prompt_cache_key`
/// becomes `agent`'s session when no header named one.
pub(crate) async fn prepare(
    shared: &Arc<Shared>,
    api: Api,
    bytes: &[u8],
    agent: &mut AgentContext,
) -> Result<Turn, GatewayError> {
    let body = switchyard_frontend::parse_body(bytes)?;
    let mut request = match api {
        Api::ChatCompletions => Request::Chat(chat::decode(&body)?),
        Api::Messages => Request::Chat(messages::decode(&body)?),
        Api::Completions => Request::Completion(completions::decode(&body)?),
        Api::Responses => {
            let mut request = responses::decode(&body)?;
            request.attach_history(&mut shared.responses())?;
            if agent.session_id.is_none() {
                agent.session_id = request.prompt_cache_key.clone();
            }
            Request::Responses(request)
        }
    };
    normalise(shared, &mut request)?;
    let (request, tokens) = tokenize(shared, request, agent, bytes.len()).await?;
    let default_max_tokens = room_to_generate(shared, tokens.len())?;
    Ok(Turn {
        api,
        request,
        tokens,
        default_max_tokens,
        body,
    })
}

/// `/v1/messages/count_tokens`: the prompt's token count, as `/v1/messages` would see it.
pub(crate) async fn count_tokens(
    shared: &Arc<Shared>,
    bytes: &[u8],
) -> Result<Value, GatewayError> {
    let body = switchyard_frontend::parse_body(bytes)?;
    let mut request = Request::Chat(messages::decode_count_tokens(&body)?);
    normalise(shared, &mut request)?;
    // Not a turn of the session: leave its incremental state alone.
    let (_, tokens) = tokenize(shared, request, &AgentContext::default(), bytes.len()).await?;
    Ok(messages::count_tokens_body(tokens.len() as u64))
}

/// The served model in place of an alias; volatile system lines removed; dropped hosted tools
/// counted.
fn normalise(shared: &Shared, request: &mut Request) -> Result<(), GatewayError> {
    let model = match request {
        Request::Completion(c) => &mut c.model,
        Request::Chat(c) => &mut c.model,
        Request::Responses(r) => &mut r.conversation.model,
    };
    if *model != shared.model_name {
        if !shared.live().model_aliases.is_match(model.as_str()) {
            return Err(GatewayError::UnknownModel(model.clone()));
        }
        *model = shared.model_name.clone();
    }
    let conversation = match request {
        Request::Completion(_) => return Ok(()),
        Request::Chat(c) => c,
        Request::Responses(r) => &mut r.conversation,
    };
    conversation.strip_volatile_lines(&shared.live().config.frontend.volatile_system_lines);
    for kind in &conversation.dropped_tools {
        shared
            .metrics
            .dropped_tools
            .get_or_create(&ToolTypeLabels { kind: kind.clone() })
            .inc();
    }
    Ok(())
}

/// What is left of the context window after a prompt of `prompt_tokens`; a prompt that fills it
/// is refused, as an engine would.
fn room_to_generate(shared: &Shared, prompt_tokens: usize) -> Result<u32, GatewayError> {
    let context = shared.live().context_length;
    match u32::try_from(prompt_tokens) {
        Ok(prompt) if prompt < context => Ok(context - prompt),
        _ => Err(GatewayError::Api(
            ApiError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "the prompt is {prompt_tokens} tokens, the model's context window is {context}"
                ),
            )
            .with_code("context_length_exceeded"),
        )),
    }
}

/// Bodies up to this size are rendered on the reactor, and answered there when their prompt is
/// cached (a resent conversation, a retry): rendering a few KB takes microseconds, less than the
/// trip to the blocking pool and back (docs/benchmarks.md (k)). Larger ones, and prompts the
/// tokenizer has to encode, go to the blocking pool.
const RENDER_INLINE_BYTES: usize = 32 * 1024;

/// The prompt's tokens. Chat-shaped requests render the chat template from the canonical
/// template messages, so one conversation is the same tokens through every API; a session's
/// next turn only tokenizes what it added (the session cache). `body_bytes` is the size of the
/// client's body. The request travels to the blocking pool and back rather than being copied.
async fn tokenize(
    shared: &Arc<Shared>,
    request: Request,
    agent: &AgentContext,
    body_bytes: usize,
) -> Result<(Request, Vec<u32>), GatewayError> {
    if let Request::Completion(Completion {
        prompt: Prompt::Tokens(ids),
        ..
    }) = &request
    {
        let tokens = ids.clone();
        return Ok((request, tokens));
    }
    let harness = agent.harness;
    if body_bytes <= RENDER_INLINE_BYTES
        && let Some(conversation) = request.conversation()
    {
        let text = render_conversation(shared, conversation)?;
        let key = cache_key(agent.session_id.as_deref(), &text);
        let now = Instant::now();
        if let Some(encoded) = shared
            .tokenizer
            .encode_if_cached(&shared.sessions, &key, &text, now)
        {
            return Ok((request, counted(shared, encoded, harness)));
        }
        let shared = shared.clone();
        let job =
            tokio::task::spawn_blocking(move || encode_rendered(&shared, &key, text, harness));
        let tokens = job
            .await
            .map_err(|e| GatewayError::Internal(e.to_string()))??;
        return Ok((request, tokens));
    }
    // Templates and tokenizers of 100K-token prompts take milliseconds: off the reactor.
    let shared = shared.clone();
    let session = agent.session_id.clone();
    let job = tokio::task::spawn_blocking(move || {
        let tokens = match &request {
            Request::Completion(c) => match &c.prompt {
                Prompt::Text(text) => shared
                    .tokenizer
                    .encode(text, true)
                    .map_err(|e| GatewayError::BadRequest(format!("prompt: cannot tokenize: {e}"))),
                Prompt::Tokens(ids) => Ok(ids.clone()),
            },
            Request::Chat(conversation)
            | Request::Responses(ResponsesRequest { conversation, .. }) => {
                render_conversation(&shared, conversation).and_then(|text| {
                    let key = cache_key(session.as_deref(), &text);
                    encode_rendered(&shared, &key, text, harness)
                })
            }
        };
        tokens.map(|tokens| (request, tokens))
    });
    job.await
        .map_err(|e| GatewayError::Internal(e.to_string()))?
}

/// The conversation as the model's chat template writes it.
fn render_conversation(
    shared: &Shared,
    conversation: &Conversation,
) -> Result<String, GatewayError> {
    let (messages, tools) = to_template_messages(conversation);
    let input = ChatTemplateInput {
        messages: &messages,
        tools: tools.as_deref(),
        add_generation_prompt: true,
        extra: conversation
            .extra
            .get("chat_template_kwargs")
            .and_then(Value::as_object),
    };
    shared.tokenizer.render_chat(&input).map_err(|e| {
        // A text-only template fails on an image part deep inside Jinja; say what was sent.
        // (No message number: the IR's count includes a system prompt that some APIs send
        // beside their messages.)
        let with_image = (conversation.messages.iter())
            .flat_map(|message| &message.blocks)
            .any(|block| matches!(block, Block::Image { .. }));
        GatewayError::BadRequest(if with_image {
            format!(
                "the conversation has an image, and this model's chat template could not render \
                 it (a text-only model takes text parts only): {e}"
            )
        } else {
            format!("cannot render the chat template: {e}")
        })
    })
}

/// Where a prompt's tokens are cached: its session's entry or, without a session id, its
/// content's (OpenAI-style clients resend the whole conversation and would otherwise be
/// tokenized whole every turn).
fn cache_key(session: Option<&str>, text: &str) -> String {
    session.map_or_else(|| content_key(text), str::to_owned)
}

/// `text`'s tokens through the session cache under `key`.
fn encode_rendered(
    shared: &Shared,
    key: &str,
    text: String,
    harness: Harness,
) -> Result<Vec<u32>, GatewayError> {
    let encoded = shared
        .tokenizer
        .encode_incremental(&shared.sessions, key, text, Instant::now())
        .map_err(|e| GatewayError::BadRequest(format!("cannot tokenize the prompt: {e}")))?;
    Ok(counted(shared, encoded, harness))
}

/// The tokens, with the cache's outcome counted.
fn counted(shared: &Shared, encoded: IncrementalEncoding, harness: Harness) -> Vec<u32> {
    let outcome = match encoded.outcome {
        CacheOutcome::Hit => "hit",
        CacheOutcome::Miss => "miss",
        CacheOutcome::Fallback => "fallback",
    };
    let m = &shared.metrics;
    m.session_tokenizations
        .get_or_create(&SessionLabels {
            outcome,
            harness: harness.as_str(),
        })
        .inc();
    m.reused_prompt_tokens.inc_by(encoded.reused_tokens as u64);
    encoded.tokens
}
