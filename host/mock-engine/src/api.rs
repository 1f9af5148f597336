//! The HTTP API: OpenAI chat and text completions, models, health, metrics, vLLM's
//! `/reset_prefix_cache`, and KV hints (`/v1/kv_hints`, and the `kv_hints` request field).

use crate::driver::{EngineClient, SubmitError};
use crate::hints::Capabilities;
use crate::length::AnswerLength;
use crate::respond::{self, Kind, Output};
use crate::script;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use switchyard_core::engine::{HintsError, RequestError};
use switchyard_core::kv_hints::actions::{KvHintsEnvelope, KvHintsReply, PROTOCOL_VERSION};
use switchyard_kv_events::publisher::PublisherFaults;
use switchyard_tokenizer::{ChatTemplateInput, ModelTokenizer, TokenizerError};

/// Largest request body: long agentic conversations, sent as token ids, exceed axum's 2 MB.
const MAX_BODY_BYTES: usize = 64 << 20;

/// Output length when the request names none.
const DEFAULT_MAX_TOKENS: u32 = 16;

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) engine: EngineClient,
    pub(crate) tokenizer: ModelTokenizer,
    pub(crate) model: String,
    pub(crate) max_tokens_cap: u32,
    pub(crate) registry: Registry,
    /// Tool-call format of scripted answers and parser of chat answers.
    pub(crate) tool_parser: String,
    /// Reasoning parser of chat answers.
    pub(crate) reasoning_parser: Option<String>,
    /// Natural lengths of unscripted answers.
    pub(crate) answer_length: AnswerLength,
    /// What `GET /v1/kv_hints` advertises.
    pub(crate) hint_capabilities: Capabilities,
    /// The KV-event publisher's fault switches, when `fault_switches` is on.
    pub(crate) faults: Option<Arc<PublisherFaults>>,
}

pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/v1/kv_hints", post(kv_hints).get(kv_hint_capabilities))
        .route("/debug/kv_events", post(kv_event_faults))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Fields shared by both completion APIs.
#[derive(Debug, Deserialize)]
struct Common {
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    nvext: Option<NvExt>,
    /// KV hints riding on the request (vLLM's merged field), applied before it is scheduled.
    kv_hints: Option<KvHintsEnvelope>,
    /// vLLM's KV connector parameters; only `max_offload_tokens` is read.
    kv_transfer_params: Option<KvTransferParams>,
}

#[derive(Debug, Deserialize)]
struct KvTransferParams {
    /// Blocks ending past this many tokens are not offloaded (and, here, evicted first).
    max_offload_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct NvExt {
    agent_hints: Option<AgentHints>,
    /// Keep the prompt's KV cached after the request (prompt caching).
    cache_control: Option<CacheControl>,
}

#[derive(Debug, Deserialize)]
struct CacheControl {
    /// `5m`, `1h` or `<N>s`; default 5 minutes.
    ttl: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AgentHints {
    /// Expected output length.
    osl: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    #[serde(default = "default_true")]
    add_generation_prompt: bool,
    chat_template_kwargs: Option<Map<String, Value>>,
    #[serde(flatten)]
    common: Common,
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: Prompt,
    #[serde(flatten)]
    common: Common,
}

/// The shapes OpenAI accepts for `prompt`; a list asks for one completion per element.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn bad_request(message: impl ToString) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.to_string(),
        }
    }

    fn not_found(message: impl ToString) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.to_string(),
        }
    }

    pub(crate) fn unavailable() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the engine is shutting down".to_owned(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        };
        let body = json!({"error": {
            "message": self.message,
            "type": kind,
            "param": null,
            "code": self.status.as_u16(),
        }});
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<SubmitError> for ApiError {
    fn from(error: SubmitError) -> Self {
        match error {
            // Ids are ours, so a duplicate is a server bug.
            SubmitError::Rejected(error @ RequestError::DuplicateId(_)) => Self {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: error.to_string(),
            },
            SubmitError::Rejected(error) => Self::bad_request(error),
            SubmitError::Stopped => Self::unavailable(),
        }
    }
}

impl From<TokenizerError> for ApiError {
    fn from(error: TokenizerError) -> Self {
        match error {
            TokenizerError::EmptyConversation | TokenizerError::Raised(_) => {
                Self::bad_request(error)
            }
            error => Self {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: error.to_string(),
            },
        }
    }
}

impl From<HintsError> for ApiError {
    fn from(error: HintsError) -> Self {
        Self::bad_request(error)
    }
}

/// Refuse an envelope of another protocol version before anything of it is applied.
fn check_version(envelope: &KvHintsEnvelope) -> Result<(), HintsError> {
    if envelope.protocol_version == PROTOCOL_VERSION {
        Ok(())
    } else {
        Err(HintsError::ProtocolVersion(
            envelope.protocol_version.clone(),
        ))
    }
}

fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let mut request: ChatRequest = parse(&body)?;
    template_arguments(&mut request.messages);
    let prompt = state.tokenizer.encode_chat(&ChatTemplateInput {
        messages: &request.messages,
        tools: request.tools.as_deref(),
        add_generation_prompt: request.add_generation_prompt,
        extra: request.chat_template_kwargs.as_ref(),
    })?;
    generate(&state, Kind::Chat, vec![prompt], &request.common).await
}

/// Tool-call arguments as JSON objects, the way vLLM hands them to chat templates (the API sends
/// them as JSON text); text that is not an object stays as it is.
fn template_arguments(messages: &mut [Value]) {
    let calls = messages
        .iter_mut()
        .filter_map(|m| m.get_mut("tool_calls")?.as_array_mut())
        .flatten();
    for call in calls {
        let Some(arguments) = call.pointer_mut("/function/arguments") else {
            continue;
        };
        if let Some(Ok(parsed @ Value::Object(_))) =
            arguments.as_str().map(serde_json::from_str::<Value>)
        {
            *arguments = parsed;
        }
    }
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse(&body)?;
    let encode = |text: &str| state.tokenizer.encode(text, true);
    let prompts = match request.prompt {
        Prompt::Text(text) => vec![encode(&text)?],
        Prompt::Texts(texts) => texts.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        Prompt::Tokens(tokens) => vec![tokens],
        Prompt::TokenLists(lists) => lists,
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request("prompt must not be empty"));
    }
    // vLLM refuses ids the model has no embedding for, in these words.
    let vocab = state.tokenizer.vocab_size();
    if let Some(&id) = prompts.iter().flatten().find(|&&id| id >= vocab) {
        return Err(ApiError::bad_request(format!(
            "Token id {id} is out of vocabulary"
        )));
    }
    generate(&state, Kind::Completion, prompts, &request.common).await
}

/// Prompt tokens searched for [`script`] directives (they end the prompt; a scripted answer
/// is at most about this long).
const SCRIPT_WINDOW_TOKENS: usize = 4096;

/// What to answer `prompt` with: a script if its last message asks for one.
fn output(state: &AppState, prompt: &[u32]) -> Result<Output, ApiError> {
    let tail = &prompt[prompt.len().saturating_sub(SCRIPT_WINDOW_TOKENS)..];
    let text = state.tokenizer.decode(tail, false)?;
    let starts_with_special = |trailer: &str| {
        state
            .tokenizer
            .encode(trailer, false)
            .ok()
            .and_then(|ids| ids.first().copied())
            .is_some_and(|id| state.tokenizer.is_special(id))
    };
    let script = script::answer(&text, &state.tool_parser, starts_with_special)
        .map_err(ApiError::bad_request)?
        .map(|answer| state.tokenizer.encode(&answer, false))
        .transpose()?;
    Ok(Output {
        stops_on_its_own: script.is_some(),
        script,
        reasoning_parser: state.reasoning_parser.clone(),
        tool_parser: Some(state.tool_parser.clone()),
    })
}

/// Submit one generation per prompt and answer with all of them.
async fn generate(
    state: &AppState,
    kind: Kind,
    prompts: Vec<Vec<u32>>,
    common: &Common,
) -> Result<Response, ApiError> {
    // Batched prompts answer like the first (tests script one prompt at a time).
    let mut output = output(state, prompts.first().map_or(&[][..], Vec::as_slice))?;
    let osl = common
        .nvext
        .as_ref()
        .and_then(|n| n.agent_hints.as_ref())
        .and_then(|h| h.osl);
    let max_tokens = common
        .max_completion_tokens
        .or(common.max_tokens)
        .or(osl)
        .unwrap_or(DEFAULT_MAX_TOKENS)
        .min(state.max_tokens_cap);
    // A scripted answer is as long as its script, like a model that stops on its own; an
    // unscripted one stops at its natural length unless the limit comes first.
    let max_tokens = match &output.script {
        Some(script) => script.len().clamp(1, u32::MAX as usize) as u32,
        None => {
            let prompt = prompts.first().map_or(&[][..], Vec::as_slice);
            let natural = state.answer_length.draw(prompt);
            output.stops_on_its_own = natural <= max_tokens;
            natural.min(max_tokens)
        }
    };
    let pin = match common.nvext.as_ref().and_then(|n| n.cache_control.as_ref()) {
        Some(cache) => Some(
            humantime::parse_duration(cache.ttl.as_deref().unwrap_or("5m"))
                .ok()
                .ok_or_else(|| {
                    ApiError::bad_request("nvext.cache_control.ttl: expected 5m, 1h or <N>s")
                })?,
        ),
        None => None,
    };
    let mut hints = match &common.kv_hints {
        Some(envelope) => {
            check_version(envelope)?;
            envelope.actions.clone()
        }
        None => Vec::new(),
    };
    let prompt_tokens = prompts.iter().map(Vec::len).sum();
    let mut generations = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        // The hints ride on the first prompt only: applied once.
        let hints = std::mem::take(&mut hints);
        let max_offload_tokens = common
            .kv_transfer_params
            .as_ref()
            .and_then(|p| p.max_offload_tokens);
        generations.push(
            state
                .engine
                .submit(prompt, max_tokens, pin, hints, max_offload_tokens)
                .await?,
        );
    }
    let answer = respond::Answer::new(
        kind,
        &state.model,
        state.tokenizer.clone(),
        prompt_tokens,
        output,
    );
    if common.stream {
        let include_usage = common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        answer.stream(generations, include_usage)
    } else {
        answer.collect(generations).await
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.model,
            "object": "model",
            "created": respond::unix_seconds(),
            "owned_by": "switchyard",
        }],
    }))
    .into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Apply a `kv_hints` envelope now: one outcome per action, in order.
async fn kv_hints(
    State(state): State<Arc<AppState>>,
    body: Bytes,
) -> Result<axum::Json<KvHintsReply>, ApiError> {
    let envelope: KvHintsEnvelope = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid kv_hints envelope: {e}")))?;
    check_version(&envelope)?;
    let outcomes = state.engine.apply_hints(envelope.actions).await?;
    Ok(axum::Json(KvHintsReply {
        message_id: envelope.message_id,
        outcomes,
    }))
}

/// Whether and which KV hints this engine takes.
async fn kv_hint_capabilities(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(&state.hint_capabilities).into_response()
}

/// `POST /debug/kv_events`: the fault switches of the KV-event stream.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KvEventFaults {
    /// Lose this many more of the next batches (numbered, buffered for replay, never sent).
    #[serde(default)]
    lose_batches: u64,
    /// `"silent"`: the replay socket answers no request; `"answering"`: as usual.
    replay: Option<ReplayMode>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ReplayMode {
    Silent,
    Answering,
}

/// Test faults on the KV-event stream (`--fault-switches`; a 404 otherwise).
async fn kv_event_faults(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let Some(faults) = &state.faults else {
        let message =
            "fault switches are off (start the engine with --fault-switches and --kv-events)";
        return ApiError::not_found(message).into_response();
    };
    let request: KvEventFaults = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return ApiError::bad_request(format!("invalid faults: {e}")).into_response(),
    };
    faults.lose(request.lose_batches);
    if let Some(mode) = request.replay {
        faults.silence_replay(matches!(mode, ReplayMode::Silent));
    }
    StatusCode::NO_CONTENT.into_response()
}

/// vLLM's development endpoint: drop the prefix cache (publishes `AllBlocksCleared`).
async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> StatusCode {
    if state.engine.reset_prefix_cache().await {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    }
}
