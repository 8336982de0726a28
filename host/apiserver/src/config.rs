//! How to run the embedded server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How long an event stays resumable by default: kube-apiserver compacts etcd every 5 minutes.
pub const DEFAULT_HISTORY_AGE: Duration = Duration::from_secs(300);

/// Largest request body accepted (the real server's limit).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// How to run the server.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen; port 0 picks a free one.
    pub addr: SocketAddr,
    /// Persist objects and credentials here; in memory when `None`.
    pub data_dir: Option<PathBuf>,
    /// Watch events kept for resuming watches; older resourceVersions get `410 Gone`.
    pub watch_history: usize,
    /// How long an event stays resumable (kube-apiserver: etcd's 5-minute compaction).
    pub watch_window: Duration,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: None,
            watch_history: 10_000,
            watch_window: DEFAULT_HISTORY_AGE,
            bookmark_interval: Duration::from_secs(30),
        }
    }
}
