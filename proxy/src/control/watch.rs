//! `serve --watch-config`: reloads the configuration when its file is saved.
//!
//! The file's folder is watched, not the file: an editor that saves by writing a new file and
//! renaming it over the old one replaces the file a watch on it would follow. Events for other
//! files in the folder are ignored. The events of one save (an editor may truncate, write,
//! change modes and rename) are taken together: the reload starts once the file has been quiet
//! for [`SETTLE`]. A symbolic link is not followed: a configuration swapped by relinking (as a
//! Kubernetes ConfigMap is) is not seen; `SIGHUP` is the way to reload it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

use super::AppState;

/// How long the file must be quiet after an event before it is read.
const SETTLE: Duration = Duration::from_millis(100);

/// Watches the configuration file at `path` (absolute) and reloads `state` when it changes,
/// until the returned watcher is dropped.
pub fn watch(state: Arc<AppState>, path: &Path) -> notify::Result<notify::RecommendedWatcher> {
    let folder = path.parent().unwrap_or(Path::new("/")).to_path_buf();
    let name = path.file_name().map(ToOwned::to_owned);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut watcher =
        notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                let ours = event
                    .paths
                    .iter()
                    .any(|p| p.file_name().map(ToOwned::to_owned) == name);
                // Reads are not changes; a writer closing the file is (Linux says so when a
                // write finishes, which may be well after it began).
                let change = match event.kind {
                    EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
                    EventKind::Access(_) => false,
                    _ => true,
                };
                if ours && change {
                    let _ = tx.send(());
                }
            }
            Err(e) => tracing::warn!(error = %e, "watching the configuration file failed"),
        })?;
    watcher.watch(&folder, RecursiveMode::NonRecursive)?;
    let task = reload_on_change(state.clone(), rx, path.to_path_buf());
    if !state.background.spawn(task) {
        return Err(notify::Error::generic(
            "the server's background work has not started",
        ));
    }
    tracing::info!(config = %path.display(), "watching the configuration file for changes");
    Ok(watcher)
}

async fn reload_on_change(
    state: Arc<AppState>,
    mut changes: mpsc::UnboundedReceiver<()>,
    path: PathBuf,
) {
    while changes.recv().await.is_some() {
        // Take the rest of this save's events: wait until none came for `SETTLE`.
        loop {
            match tokio::time::timeout(SETTLE, changes.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) => return,
                Err(_quiet) => break,
            }
        }
        tracing::debug!(config = %path.display(), "configuration file changed");
        state.reload("file watch").await;
    }
}
