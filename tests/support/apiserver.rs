//! An API server in a process of its own, for tests that SIGKILL it: the embedded one
//! (`banlieue-test-apiserver`), whose objects and credentials live in a data directory, or a
//! real kube-apiserver (with its etcd) started by the `start.sh DIR PORT` of a directory named
//! by `BANLIEUE_TEST_KUBERNETES`. Either way a restart on the same address serves the same
//! objects to the same kubeconfig.

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
    /// A real kube-apiserver: the directory of its `start.sh` and `stop.sh`.
    kubernetes: Option<PathBuf>,
}

impl ApiServerProcess {
    /// Start `binary` (the test's `env!("CARGO_BIN_EXE_banlieue-test-apiserver")`) on a free port.
    pub async fn start(binary: &str) -> anyhow::Result<ApiServerProcess> {
        let addr = SocketAddr::from(([127, 0, 0, 1], banlieue_test_backends::free_port()));
        let mut server = ApiServerProcess { binary: binary.into(), dir: tempfile::tempdir()?, addr, child: None, kubernetes: None };
        server.restart().await?;
        Ok(server)
    }

    /// The directory of a real kube-apiserver's `start.sh`, when the run names one
    /// (`BANLIEUE_TEST_KUBERNETES`; the CI's real-cluster phase does).
    pub fn kubernetes_scripts() -> Option<PathBuf> {
        std::env::var_os("BANLIEUE_TEST_KUBERNETES").map(PathBuf::from).filter(|d| d.join("start.sh").is_file())
    }

    /// Start a real kube-apiserver, etcd and kube-controller-manager of their own (in a new
    /// directory, on free ports) with the scripts in `scripts`.
    pub async fn start_kubernetes(scripts: &Path) -> anyhow::Result<ApiServerProcess> {
        // start.sh puts etcd on PORT+7000..7002 and the controller manager on PORT-6000.
        let port = (0..200)
            .map(|_| banlieue_test_backends::free_port())
            .find(|&p| p > 6000 && p < 58000 && [p + 7000, p + 7001, p + 7002, p - 6000].iter().all(|&q| std::net::TcpListener::bind(("127.0.0.1", q)).is_ok()))
            .context("no free port for a kube-apiserver with its etcd")?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut server = ApiServerProcess { binary: PathBuf::new(), dir: tempfile::tempdir()?, addr, child: None, kubernetes: Some(scripts.to_path_buf()) };
        server.restart().await?;
        Ok(server)
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// Start it again (after [`sigkill`](Self::sigkill)), on the same address and data.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(scripts) = &self.kubernetes {
            // Idempotent: restarts what is not running, keeping etcd's data; ready when it returns.
            let out = tokio::process::Command::new("bash")
                .arg(scripts.join("start.sh"))
                .arg(self.dir.path())
                .arg(self.addr.port().to_string())
                .stdin(Stdio::null())
                .output();
            let out = tokio::time::timeout(Duration::from_secs(120), out).await.context("start.sh did not end within 120 s")??;
            anyhow::ensure!(out.status.success(), "start.sh: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            return Ok(());
        }
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
        if self.kubernetes.is_some() {
            // kube-apiserver only: etcd keeps what it acknowledged, as in a crashed control-plane node.
            let pidfile = self.dir.path().join("apiserver.pid");
            if let Ok(pid) = std::fs::read_to_string(&pidfile) {
                let pid = pid.trim().to_string();
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                // Dead once gone or a zombie (nobody here reaps the orphan): start.sh takes a
                // pid that still answers `kill -0` for a running server, so the file goes too.
                let stat = format!("/proc/{pid}/stat");
                let started = Instant::now();
                while std::fs::read_to_string(&stat).is_ok_and(|s| s.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
                    && started.elapsed() < Duration::from_secs(10)
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                let _ = std::fs::remove_file(&pidfile);
            }
            return;
        }
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
        if let Some(scripts) = &self.kubernetes {
            let _ = Command::new("bash").arg(scripts.join("stop.sh")).arg(self.dir.path()).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
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
