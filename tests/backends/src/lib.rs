//! Real backends for tests and benchmarks, started on 127.0.0.1 by the test
//! that needs them and stopped (by PID) when dropped: [`vcsim`] speaks vim25
//! SOAP like vCenter, [`fakepve`] the Proxmox VE REST API. Each module also
//! queries its backend through the backend's own API, so a test checks what
//! the backend holds, never only what banlieue reports.

pub mod fakepve;
pub mod fault_proxy;
pub mod libvirtd;
pub mod openbao;
pub mod prometheus;
pub mod registry;
pub mod vcsim;

use std::process::Child;

/// A child process killed (by its PID) and reaped when dropped.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The repository's root (this crate is `tests/backends`).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where `guests/build.sh` puts the built components (the `builtin:` directory of tests).
pub fn guests_dist() -> std::path::PathBuf {
    repo_root().join("guests/dist")
}

/// The bytes of the built component `name` (`guests/dist/<name>.wasm`). A test without it
/// fails, saying how to build it.
pub fn guest_component(name: &str) -> Vec<u8> {
    let path = guests_dist().join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; build the guests first with guests/build.sh (make test does)", path.display()))
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("bind 127.0.0.1:0")
}

/// An HTTP client for talking to a backend directly (plain or self-signed TLS).
pub fn http_client() -> reqwest::Client {
    static PROVIDER: std::sync::Once = std::sync::Once::new();
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .no_proxy()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .expect("http client")
}
