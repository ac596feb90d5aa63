//! The configuration directory: read (`*.yaml` / `*.yml`, sorted by name,
//! hidden files skipped) and polled for changes; a change is loaded once
//! two polls in a row read the same content (a file being written is not
//! loaded half-written); one that loads replaces the configuration in
//! force, one that fails is logged and counted and the previous
//! configuration stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::Config;
use crate::metrics::Metrics;

/// The directory's files as `(config.<stem>, text)`, the names the peer
/// gives them in its errors.
pub fn read_dir(dir: &Path) -> std::io::Result<Files> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let hidden = p
                .file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| n.starts_with('.'));
            let yaml = matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml") | Some("yml")
            );
            !hidden && yaml && p.is_file()
        })
        .collect();
    paths.sort();
    let mut files = Vec::with_capacity(paths.len());
    for p in paths {
        let stem = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        files.push((format!("config.{stem}"), std::fs::read_to_string(&p)?));
    }
    Ok(files)
}

/// The directory's files as `(name, text)`.
pub type Files = Vec<(String, String)>;

/// What the polls saw: the content loaded (or refused) last, and a change
/// seen once, waiting to be seen again unchanged.
pub struct Settle {
    last: Files,
    pending: Option<Files>,
}

impl Settle {
    /// Starts from `loaded`, the content in force.
    pub fn new(loaded: Files) -> Settle {
        Settle {
            last: loaded,
            pending: None,
        }
    }

    /// One poll's content: `Some` when it is a change that the previous
    /// poll saw too (to load now).
    pub fn poll(&mut self, files: Files) -> Option<Files> {
        if files == self.last {
            self.pending = None;
            return None;
        }
        if self.pending.as_ref() == Some(&files) {
            self.pending = None;
            self.last = files.clone();
            return Some(files);
        }
        self.pending = Some(files);
        None
    }
}

/// Polls `dir` every `every`; `last` is what is loaded now.
pub async fn watch(
    dir: PathBuf,
    last: Files,
    config: Arc<RwLock<Arc<Config>>>,
    metrics: Arc<Metrics>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    let mut settle = Settle::new(last);
    loop {
        tick.tick().await;
        let files = match read_dir(&dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot read the configuration");
                continue;
            }
        };
        let Some(files) = settle.poll(files) else {
            continue;
        };
        match Config::load(&files) {
            Ok(c) => {
                if let Ok(mut slot) = config.write() {
                    *slot = Arc::new(c);
                }
                metrics.config_load_success.inc();
                tracing::info!(files = files.len(), "configuration reloaded");
            }
            Err(e) => {
                metrics.config_load_error.inc();
                tracing::error!(error = %e, "configuration not reloaded; the previous one stays");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example directory loads.
    #[test]
    fn examples_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        for dir in ["config", "designs"] {
            let files = read_dir(&root.join(dir)).expect("readable");
            assert!(!files.is_empty(), "{dir}");
            if let Err(e) = Config::load(&files) {
                panic!("examples/{dir}: {e}");
            }
        }
    }

    fn files(text: &str) -> Files {
        vec![("config.rl".to_string(), text.to_string())]
    }

    /// A file being written (its content changing between polls) is loaded
    /// only once two polls in a row read it the same.
    #[test]
    fn loads_only_settled_content() {
        let mut s = Settle::new(files("full"));
        assert_eq!(s.poll(files("full")), None);
        assert_eq!(s.poll(files("ha")), None, "half-written: not yet");
        assert_eq!(s.poll(files("half")), None, "still changing");
        assert_eq!(s.poll(files("half-full")), None);
        assert_eq!(s.poll(files("half-full")), Some(files("half-full")));
        assert_eq!(s.poll(files("half-full")), None, "loaded once");
        // a change undone before it settled loads nothing
        assert_eq!(s.poll(files("x")), None);
        assert_eq!(s.poll(files("half-full")), None);
        assert_eq!(s.poll(files("x")), None);
    }
}
