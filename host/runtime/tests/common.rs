//! Shared test helpers: the built guest components.

use std::path::PathBuf;

/// Bytes of `guests/dist/<name>.wasm` (built by `guests/build.sh`, which `make test` runs first).
pub fn guest(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guests/dist").join(format!("{name}.wasm"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; build the guests first with guests/build.sh", path.display()))
}
