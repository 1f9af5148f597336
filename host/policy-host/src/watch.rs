//! [`PolicyWatcher`]: reload policies when files in the policy directory change.

use crate::error::PolicyError;
use crate::registry::PolicyRegistry;
use notify::RecursiveMode;
use notify_debouncer_full::{DebounceEventResult, Debouncer, RecommendedCache, new_debouncer};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Watches the registry's directory; reloads run on the watcher's thread, off the request path.
/// Stops when dropped.
pub struct PolicyWatcher {
    _debouncer: Debouncer<notify::RecommendedWatcher, RecommendedCache>,
}

impl std::fmt::Debug for PolicyWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyWatcher").finish_non_exhaustive()
    }
}

impl PolicyWatcher {
    /// Watch the registry's directory. Events are debounced by `debounce` (200-500 ms): editors
    /// and `cargo` write a file in several steps or replace it by rename, which is also why the
    /// directory is watched rather than the files.
    pub fn start(registry: Arc<PolicyRegistry>, debounce: Duration) -> Result<Self, PolicyError> {
        let dir = registry
            .dir()
            .ok_or_else(|| PolicyError::Io("no policy directory to watch".into()))?
            .to_path_buf();
        let handler = move |result: DebounceEventResult| match result {
            Ok(events) => {
                // Only writes, creations and renames: reading a file (as a reload does) raises
                // access events, which would otherwise trigger the next reload.
                let changed: BTreeSet<PathBuf> = events
                    .iter()
                    .filter(|event| event.kind.is_create() || event.kind.is_modify())
                    .flat_map(|event| event.paths.iter())
                    .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
                    .cloned()
                    .collect();
                for path in changed {
                    registry.file_changed(&path);
                }
            }
            Err(errors) => {
                for error in errors {
                    tracing::warn!(%error, "policy directory watch error");
                }
            }
        };
        let mut debouncer = new_debouncer(debounce, None, handler)
            .map_err(|e| PolicyError::Io(format!("cannot watch {}: {e}", dir.display())))?;
        debouncer
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|e| PolicyError::Io(format!("cannot watch {}: {e}", dir.display())))?;
        Ok(Self {
            _debouncer: debouncer,
        })
    }
}
