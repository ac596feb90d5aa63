//! The configuration directory: read (`*.yaml` / `*.yml`, sorted by name,
//! hidden files skipped) and polled for changes; a change that loads
//! replaces the configuration in force, one that fails is logged and counted
//! and the previous configuration stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::config::Config;
use crate::metrics::Metrics;

/// The directory's files as `(config.<stem>, text)`, the names the peer
/// gives them in its errors.
pub fn read_dir(dir: &Path) -> std::io::Result<Vec<(String, String)>> {
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

/// Polls `dir` every `every`; `last` is what is loaded now.
pub async fn watch(
    dir: PathBuf,
    mut last: Vec<(String, String)>,
    config: Arc<RwLock<Arc<Config>>>,
    metrics: Arc<Metrics>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let files = match read_dir(&dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot read the configuration");
                continue;
            }
        };
        if files == last {
            continue;
        }
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
        last = files;
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
}
