//! An OCI registry (Debian `docker-registry`, the CNCF distribution server) on
//! 127.0.0.1 with filesystem storage in a temporary directory, queried through
//! the registry's own HTTP API (`/v2/…`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{ChildGuard, free_port, http_client};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

pub struct Registry {
    _child: ChildGuard,
    dir: tempfile::TempDir,
    /// `127.0.0.1:<port>`.
    pub host: String,
}

impl Registry {
    /// Start a registry and wait until `/v2/` answers.
    pub async fn start() -> Result<Registry> {
        let dir = tempfile::tempdir()?;
        let host = format!("127.0.0.1:{}", free_port());
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
                dir.path().join("storage").display()
            ),
        )?;
        let log = std::fs::File::create(dir.path().join("registry.log"))?;
        // `BANLIEUE_DOCKER_REGISTRY` names another build of the same server.
        let binary = std::env::var("BANLIEUE_DOCKER_REGISTRY").unwrap_or_else(|_| "docker-registry".into());
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {binary} (apt-get install -y docker-registry; scripts/install-deps.sh installs what the tests need)"))?;
        let mut child = ChildGuard(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.0.try_wait()? {
                bail!("docker-registry exited with {status}: {}", std::fs::read_to_string(dir.path().join("registry.log")).unwrap_or_default());
            }
            if let Ok(r) = http_client().get(format!("http://{host}/v2/")).send().await
                && r.status().is_success()
            {
                break;
            }
            if Instant::now() > deadline {
                bail!("docker-registry on {host} not ready after 15 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Registry { _child: child, dir, host })
    }

    /// The OCI manifest of `repository:reference`, and its digest.
    pub async fn manifest(&self, repository: &str, reference: &str) -> Result<(Value, String)> {
        let r = http_client()
            .get(format!("http://{}/v2/{repository}/manifests/{reference}", self.host))
            .header("accept", OCI_MANIFEST)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("manifest {repository}:{reference}: HTTP {}", r.status());
        }
        let digest = r.headers().get("docker-content-digest").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        Ok((r.json().await?, digest))
    }

    /// The bytes of blob `digest` in `repository`.
    pub async fn blob(&self, repository: &str, digest: &str) -> Result<Vec<u8>> {
        let r = http_client().get(format!("http://{}/v2/{repository}/blobs/{digest}", self.host)).send().await?;
        if !r.status().is_success() {
            bail!("blob {digest}: HTTP {}", r.status());
        }
        Ok(r.bytes().await?.to_vec())
    }

    /// Push `bytes` as a one-layer OCI artifact to `repository:tag` through the distribution
    /// API (blob upload as POST then PUT, which docker-registry 2.8 needs; an empty config);
    /// the manifest digest. What `oras push` does, for tests that play an exporter.
    pub async fn push_artifact(&self, repository: &str, tag: &str, artifact_type: &str, layer_type: &str, bytes: Vec<u8>) -> Result<String> {
        use sha2::Digest as _;
        let digest_of = |b: &[u8]| format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)));
        let client = http_client();
        let base = format!("http://{}/v2/{repository}", self.host);
        let config = b"{}".to_vec();
        for blob in [&bytes, &config] {
            let r = client.post(format!("{base}/blobs/uploads/")).send().await?;
            let location = r.headers().get("location").and_then(|v| v.to_str().ok()).context("upload has no Location")?.to_string();
            let location = if location.starts_with('/') { format!("http://{}{location}", self.host) } else { location };
            let sep = if location.contains('?') { '&' } else { '?' };
            let r = client.put(format!("{location}{sep}digest={}", digest_of(blob))).body(blob.clone()).send().await?;
            if !r.status().is_success() {
                bail!("blob upload: HTTP {}: {}", r.status(), r.text().await.unwrap_or_default());
            }
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": digest_of(&config), "size": config.len()},
            "layers": [{"mediaType": layer_type, "digest": digest_of(&bytes), "size": bytes.len()}],
        });
        let body = serde_json::to_vec(&manifest)?;
        let r = client.put(format!("{base}/manifests/{tag}")).header("content-type", OCI_MANIFEST).body(body.clone()).send().await?;
        if !r.status().is_success() {
            bail!("manifest push: HTTP {}: {}", r.status(), r.text().await.unwrap_or_default());
        }
        Ok(digest_of(&body))
    }

    /// A directory that lives as long as the registry.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// What the registry logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Where the registry keeps the bytes of `digest` (distribution's filesystem layout),
    /// for tests that tamper with them.
    pub fn blob_file(&self, digest: &str) -> std::path::PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir.path().join("storage/docker/registry/v2/blobs/sha256").join(&hex[..2.min(hex.len())]).join(hex).join("data")
    }
}
