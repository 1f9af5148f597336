//! Errors of loading a model's tokenizer and of rendering or encoding with it.

use std::path::PathBuf;

/// Why a tokenizer could not be loaded, or a chat could not be rendered, encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A model file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `tokenizer_config.json` is not valid JSON or has fields of the wrong shape.
    #[error("invalid tokenizer_config.json: {0}")]
    Config(#[source] serde_json::Error),
    /// The Hugging Face tokenizer failed to load `tokenizer.json`, encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(#[source] tokenizers::Error),
    /// The model has no chat template for this request (none at all, or no `default` one).
    #[error("model {0} has no chat template")]
    NoChatTemplate(String),
    /// The request has no messages; Hugging Face refuses those before rendering.
    #[error("cannot apply a chat template to an empty conversation")]
    EmptyConversation,
    /// The chat template called `raise_exception(message)`: the request is invalid for this model.
    #[error("chat template rejected the request: {0}")]
    Raised(String),
    /// The chat template failed to compile or to render.
    #[error("chat template error: {message}")]
    Template {
        /// minijinja's message, with the template name and line.
        message: String,
        /// The template line the error is on, where known.
        line: Option<usize>,
    },
}

/// Source attached to the minijinja error of `raise_exception`, to tell it from a template bug.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RaisedByTemplate(pub(crate) String);

impl From<minijinja::Error> for TokenizerError {
    fn from(err: minijinja::Error) -> Self {
        let raised = std::error::Error::source(&err)
            .and_then(|source| source.downcast_ref::<RaisedByTemplate>());
        match raised {
            Some(RaisedByTemplate(message)) => Self::Raised(message.clone()),
            None => Self::Template {
                message: err.to_string(),
                line: err.line(),
            },
        }
    }
}
