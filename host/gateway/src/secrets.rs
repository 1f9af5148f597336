//! Secrets named in the configuration (admin tokens, client API keys): given inline, by an
//! environment variable, or by a file such as a mounted Kubernetes Secret; exactly one of them.

use crate::config::ConfigError;
use std::path::PathBuf;

/// Where one secret comes from; `names` are the configuration's keys for the three sources.
#[derive(Clone, Copy)]
pub(crate) struct Source<'a> {
    pub(crate) names: [&'static str; 3],
    pub(crate) inline: Option<&'a str>,
    pub(crate) env: Option<&'a str>,
    pub(crate) file: Option<&'a PathBuf>,
}

impl Source<'_> {
    /// Exactly one source is given (`field` names the entry in errors).
    pub(crate) fn validate(&self, field: &str) -> Result<(), ConfigError> {
        let given = [
            self.inline.is_some(),
            self.env.is_some(),
            self.file.is_some(),
        ];
        match given.iter().filter(|g| **g).count() {
            1 => Ok(()),
            n => Err(ConfigError::Invalid(format!(
                "{field}: give exactly one of {} (found {n})",
                self.names.join(", ")
            ))),
        }
    }

    /// The secret, read from wherever it is (trailing whitespace and newline trimmed); an empty
    /// one is an error.
    pub(crate) fn resolve(&self, field: &str) -> Result<String, ConfigError> {
        self.validate(field)?;
        let [_, env_name, file_name] = self.names;
        let secret = match (self.inline, self.env, self.file) {
            (Some(secret), _, _) => secret.to_string(),
            (_, Some(var), _) => std::env::var(var)
                .map_err(|e| ConfigError::Invalid(format!("{field}.{env_name}: ${var}: {e}")))?,
            (_, _, Some(path)) => std::fs::read_to_string(path).map_err(|e| {
                ConfigError::Invalid(format!("{field}.{file_name}: {}: {e}", path.display()))
            })?,
            (None, None, None) => String::new(),
        };
        let secret = secret.trim_end().to_string();
        if secret.trim().is_empty() {
            return Err(ConfigError::Invalid(format!(
                "{field}: the {} is empty",
                self.names[0]
            )));
        }
        Ok(secret)
    }
}

/// For each of `secrets`, whether `given` equals it, each compared in constant time. Consume
/// it whole (`fold`, not `any`), so the time taken reveals neither which one matched nor how
/// much of one.
pub(crate) fn matches<'a>(
    secrets: impl IntoIterator<Item = &'a str>,
    given: &'a [u8],
) -> impl Iterator<Item = bool> {
    use subtle::ConstantTimeEq;
    secrets
        .into_iter()
        .map(move |secret| bool::from(given.ct_eq(secret.as_bytes())))
}
