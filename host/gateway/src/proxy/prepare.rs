//! The first stage: a client's body decoded into the internal representation, checked, and its
//! prompt tokenized exactly as the engine will see it.

use crate::agent::AgentContext;
use crate::error::GatewayError;
use crate::metrics::OutcomeLabels;
use crate::server::Shared;
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use switchyard_frontend::{
    AgentHints, Api, CacheControl, Completion, Conversation, Prompt, ResponsesRequest, chat,
    completions, messages, responses, to_template_messages,
};
use switchyard_tokenizer::{CacheOutcome, ChatTemplateInput};

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

    fn model(&self) -> &str {
        match self {
            Request::Completion(c) => &c.model,
            _ => self.conversation().map_or("", |c| &c.model),
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
    /// The client's body, for traces that include content.
    pub(crate) body: Value,
}

/// Decode `bytes` for `api` and tokenize its prompt.
pub(crate) async fn prepare(
    shared: &Arc<Shared>,
    api: Api,
    bytes: &[u8],
    agent: &AgentContext,
) -> Result<Turn, GatewayError> {
    let body = switchyard_frontend::parse_body(bytes)?;
    let request = match api {
        Api::ChatCompletions => Request::Chat(chat::decode(&body)?),
        Api::Messages => Request::Chat(messages::decode(&body)?),
        Api::Completions => Request::Completion(completions::decode(&body)?),
        Api::Responses => {
            let mut request = responses::decode(&body)?;
            request.attach_history(&mut shared.responses())?;
            Request::Responses(request)
        }
    };
    check_model(shared, request.model())?;
    let tokens = tokenize(shared, &request, agent).await?;
    Ok(Turn {
        api,
        request,
        tokens,
        body,
    })
}

/// `/v1/messages/count_tokens`: the prompt's token count, as `/v1/messages` would see it.
pub(crate) async fn count_tokens(
    shared: &Arc<Shared>,
    bytes: &[u8],
) -> Result<Value, GatewayError> {
    let body = switchyard_frontend::parse_body(bytes)?;
    let conversation = messages::decode_count_tokens(&body)?;
    check_model(shared, &conversation.model)?;
    // Not a turn of the session: leave its incremental state alone.
    let request = Request::Chat(conversation);
    let tokens = tokenize(shared, &request, &AgentContext::default()).await?;
    Ok(messages::count_tokens_body(tokens.len() as u64))
}

fn check_model(shared: &Shared, model: &str) -> Result<(), GatewayError> {
    if model == shared.model_name {
        Ok(())
    } else {
        Err(GatewayError::UnknownModel(model.to_owned()))
    }
}

/// The prompt's tokens. Chat-shaped requests render the chat template from the canonical
/// template messages, so one conversation is the same tokens through every API; a session's
/// next turn only tokenizes what it added (the session cache).
async fn tokenize(
    shared: &Arc<Shared>,
    request: &Request,
    agent: &AgentContext,
) -> Result<Vec<u32>, GatewayError> {
    let shared = shared.clone();
    let job: Box<dyn FnOnce() -> Result<Vec<u32>, GatewayError> + Send> = match request {
        Request::Completion(c) => match &c.prompt {
            Prompt::Tokens(ids) => return Ok(ids.clone()),
            Prompt::Text(text) => {
                let text = text.clone();
                Box::new(move || {
                    shared.tokenizer.encode(&text, true).map_err(|e| {
                        GatewayError::BadRequest(format!("prompt: cannot tokenize: {e}"))
                    })
                })
            }
        },
        _ => {
            let conversation = request.conversation().cloned().unwrap_or_default();
            let session = agent.session_id.clone();
            Box::new(move || encode_conversation(&shared, &conversation, session.as_deref()))
        }
    };
    // Templates and tokenizers of 100K-token prompts take milliseconds: off the reactor.
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|e| GatewayError::Internal(e.to_string()))?
}

fn encode_conversation(
    shared: &Shared,
    conversation: &Conversation,
    session: Option<&str>,
) -> Result<Vec<u32>, GatewayError> {
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
    let bad = |e| GatewayError::BadRequest(format!("cannot render the chat template: {e}"));
    match session {
        Some(session) => {
            let encoded = shared
                .tokenizer
                .encode_chat_incremental(&shared.sessions, session, &input, Instant::now())
                .map_err(bad)?;
            let outcome = match encoded.outcome {
                CacheOutcome::Hit => "hit",
                CacheOutcome::Miss => "miss",
                CacheOutcome::Fallback => "fallback",
            };
            let m = &shared.metrics;
            m.session_tokenizations
                .get_or_create(&OutcomeLabels { outcome })
                .inc();
            m.reused_prompt_tokens.inc_by(encoded.reused_tokens as u64);
            Ok(encoded.tokens)
        }
        None => shared.tokenizer.encode_chat(&input).map_err(bad),
    }
}
