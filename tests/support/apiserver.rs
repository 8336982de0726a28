//! The embedded API server in a process of its own (`banlieue-test-apiserver`), for tests
//! that SIGKILL it: objects and credentials live in a data directory, so a restart on the
//! same address serves the same objects to the same kubeconfig.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

pub struct ApiServerProcess {
    binary: PathBuf,
    dir: tempfile::TempDir,
    pub addr: SocketAddr,
    child: Option<Child>,
}

impl ApiServerProcess {
    /// Start `binary` (the test's `env!("CARGO_BIN_EXE_banlieue-test-apiserver")`) on a free port.
    pub async fn start(binary: &str) -> anyhow::Result<ApiServerProcess> {
        let addr = SocketAddr::from(([127, 0, 0, 1], banlieue_test_backends::free_port()));
        let mut server = ApiServerProcess { binary: binary.into(), dir: tempfile::tempdir()?, addr, child: None };
        server.restart().await?;
        Ok(server)
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Start it again (after [`sigkill`](Self::sigkill)), on the same address and data.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "the API server is running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.path().join("server.log"))?;
        let child = Command::new(&self.binary)
            .arg(self.dir.path())
            .arg(self.addr.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.binary.display()))?;
        self.child = Some(child);
        let started = Instant::now();
        // Serving when it answers /readyz over its TLS.
        let client = crate::client_for(&self.kubeconfig_when_written().await?).await?;
        loop {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                anyhow::bail!("the API server exited ({status}): {}", self.log());
            }
            if client.apiserver_version().await.is_ok() {
                return Ok(());
            }
            anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "the API server did not answer within 30 s: {}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn kubeconfig_when_written(&self) -> anyhow::Result<PathBuf> {
        let path = self.kubeconfig();
        let started = Instant::now();
        while !path.exists() {
            anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "no kubeconfig within 30 s: {}", self.log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(path)
    }

    /// SIGKILL it and reap it: nothing it had not written survives.
    pub fn sigkill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// End every open watch with `410 Gone` and compact the history (SIGUSR1).
    pub fn expire_watches(&self) -> anyhow::Result<()> {
        let pid = self.child.as_ref().context("the API server is not running")?.id();
        let status = Command::new("kill").args(["-USR1", &pid.to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill -USR1 {pid}: {status}");
        Ok(())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ApiServerProcess {
    fn drop(&mut self) {
        self.sigkill();
        // BANLIEUE_TEST_KEEP_DIRS=1: keep the data and the server's log for a look afterwards.
        if std::env::var_os("BANLIEUE_TEST_KEEP_DIRS").is_some()
            && let Ok(empty) = tempfile::tempdir()
        {
            let kept = std::mem::replace(&mut self.dir, empty).keep();
            eprintln!("API server data and log kept in {}", kept.display());
        }
    }
}
