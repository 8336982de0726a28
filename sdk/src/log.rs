//! Logging through the host's `log` capability.
//!
//! Outside wasm (unit tests of guest logic) messages go to stderr, so pure
//! logic can log without a host.

pub use crate::bindings::host::banlieue::host::log::Level;

/// Log one message at `level`.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::host::banlieue::host::log::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("[{level:?}] {message}");
}

pub fn trace(message: &str) {
    log(Level::Trace, message)
}
pub fn debug(message: &str) {
    log(Level::Debug, message)
}
pub fn info(message: &str) {
    log(Level::Info, message)
}
pub fn warn(message: &str) {
    log(Level::Warn, message)
}
pub fn error(message: &str) {
    log(Level::Error, message)
}

/// `banlieue_sdk::info!("created {}", name)`; formats only when called.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::log::info(&::std::format!($($arg)*)) };
}

/// Like [`info!`] at debug level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log::debug(&::std::format!($($arg)*)) };
}

/// Like [`info!`] at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::log::warn(&::std::format!($($arg)*)) };
}
