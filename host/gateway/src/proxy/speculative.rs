//! Speculative prefill (`nvext.agent_hints.speculative_prefill`): when a turn ends, send the next
//! turn's likely prefix (the history plus this answer) to the same worker with `max_tokens = 1`,
//! so its KV is computed while the agent's tool runs and the next request finds it warm.

use crate::config::UpstreamMode;
use crate::server::Shared;
use serde_json::{Value, json};
use std::sync::Arc;
use switchyard_core::worker::Rank;
use switchyard_frontend::{Block, Conversation, Reply, to_chat_request, to_template_messages};
use switchyard_tokenizer::ChatTemplateInput;

/// A turn to warm the next one of, once its answer is complete.
#[derive(Debug)]
pub(crate) struct Speculation {
    conversation: Conversation,
    rank: Rank,
}

impl Speculation {
    pub(crate) fn new(conversation: Conversation, rank: Rank) -> Self {
        Self { conversation, rank }
    }

    /// Send the prefix in the background; failures only count in the metrics.
    pub(crate) fn send(mut self, shared: Arc<Shared>, reply: &Reply) {
        let mut answer = reply.message();
        // The answer will be an earlier turn next time: templates drop its reasoning.
        answer
            .blocks
            .retain(|b| !matches!(b, Block::Thinking { .. } | Block::RedactedThinking { .. }));
        self.conversation.messages.push(answer);
        tokio::spawn(async move {
            let outcome = match self.prefill(&shared).await {
                Ok(()) => "sent",
                Err(e) => {
                    tracing::debug!(error = %e, "speculative prefill failed");
                    "failed"
                }
            };
            shared.metrics.speculative_prefill(outcome);
        });
    }

    async fn prefill(&self, shared: &Arc<Shared>) -> Result<(), String> {
        let member = shared
            .fleet
            .get(self.rank.worker)
            .ok_or("the worker left")?;
        let upstream = &member.upstream;
        let (path, body) = match upstream.mode {
            UpstreamMode::Chat => {
                let mut body = to_chat_request(&self.conversation);
                body["add_generation_prompt"] = false.into();
                ("/v1/chat/completions", limit(body))
            }
            UpstreamMode::Tokens => {
                let tokens = self.tokens(shared).await?;
                let body = json!({"model": self.conversation.model, "prompt": tokens});
                ("/v1/completions", limit(body))
            }
        };
        let timeout = shared.live().config.server.request_timeout;
        let response = upstream
            .request(&shared.client, path, self.rank.dp_rank, body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        // Read to the end: the prefix is computed by the time the engine answers.
        let status = response.status();
        response.bytes().await.map_err(|e| e.to_string())?;
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("engine answered {status}"))
        }
    }

    /// The closed conversation's tokens, with no generation prompt: the prefix of the next turn.
    async fn tokens(&self, shared: &Arc<Shared>) -> Result<Vec<u32>, String> {
        let (messages, tools) = to_template_messages(&self.conversation);
        let extra = self
            .conversation
            .extra
            .get("chat_template_kwargs")
            .and_then(Value::as_object)
            .cloned();
        let tokenizer = shared.tokenizer.clone();
        tokio::task::spawn_blocking(move || {
            tokenizer.encode_chat(&ChatTemplateInput {
                messages: &messages,
                tools: tools.as_deref(),
                add_generation_prompt: false,
                extra: extra.as_ref(),
            })
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
    }
}

/// One output token, not streamed.
fn limit(mut body: Value) -> Value {
    body["max_tokens"] = 1.into();
    body["stream"] = false.into();
    if let Some(map) = body.as_object_mut() {
        map.remove("stream_options");
    }
    body
}
