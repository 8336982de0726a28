//! A real registry for tests: Debian's `docker-registry` (distribution 2.8) on 127.0.0.1,
//! on a free port, storing into a temp dir; killed by PID when the guard drops.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A test that needs a tool it cannot find fails, saying how to install it
/// (`scripts/install-deps.sh` installs them all).
pub fn missing(what: &str) -> ! {
    panic!("{what}; scripts/install-deps.sh installs what the tests need")
}

pub struct TestRegistry {
    child: Child,
    dir: tempfile::TempDir,
    pub host: String,
}

fn registry_binary() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("BANLIEUE_DOCKER_REGISTRY") {
        return Some(path.into());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("docker-registry"))
        .find(|p| p.is_file())
}

impl TestRegistry {
    /// Start a registry; fails when `docker-registry` is not installed.
    pub fn start() -> TestRegistry {
        let Some(binary) = registry_binary() else {
            missing("docker-registry not found (apt-get install -y docker-registry)");
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
                dir.path().join("storage").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut registry = TestRegistry { child, dir, host };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("docker-registry exited with {status}:\n{}", self.log());
            }
            if let Some(status) = http_status(&self.host, "GET", "/v2/")
                && status == 200
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "docker-registry on {} not ready after 15s:\n{}",
            self.host,
            self.log()
        );
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Where the registry keeps the bytes of `digest` (distribution's filesystem layout).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        self.storage().join(format!(
            "docker/registry/v2/blobs/sha256/{}/{hex}/data",
            &hex[..2]
        ))
    }

    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    pub fn temp_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status code of a plain HTTP/1.0 request, or `None` if nothing answered.
fn http_status(host: &str, method: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "{method} {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
