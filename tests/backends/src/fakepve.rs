//! fakepve, a fake Proxmox VE API (PyPI `fakepve`, AGPL, run only as a separate
//! process; install with `tests/backends/fakepve/install.sh`), started on
//! 127.0.0.1 with `tests/backends/fakepve/guests.json`.
//!
//! What the fixture sets up and knows:
//!
//! - fakepve serves **https only**. The fixture makes a certificate with
//!   fakepve's own `fakepve.certs.make_cert` (Python `cryptography`, the
//!   `fakepve[crypto]` extra) for `127.0.0.1`, passes it with `--cert/--key`,
//!   and hands the PEM out as [`FakePve::ca_pem`] for an HTTP grant's CA bundle.
//! - Login: `--user`/`--password` (here `root@pam` / a random password) for
//!   ticket auth. fakepve's CLI cannot configure API tokens (its `apitokens` are
//!   in-process only, and tokens made through its API are not accepted), so a
//!   token is always refused with 401 `authentication failure`.
//! - The guests file holds VMs only (nodes come from their `node`); storages are
//!   added after start through PVE's own `POST /storage`: `shared-dir` (shared,
//!   images, every node) and `pve2-only` (images, node pve2). `local` (no images)
//!   and `local-lvm` (images, not shared) are fakepve's defaults. Bridges are
//!   fakepve's fixed answer: `vmbr0` on every node (its network API stores
//!   nothing).
//! - fakepve cannot count logins over its API (its request log is in-process), so
//!   [`FakePve::proxy_url`] is a small loopback HTTP reverse proxy in front of it
//!   that counts `POST /api2/json/access/ticket` ([`FakePve::logins`]) and
//!   records every request with the kind of credential it carried
//!   ([`FakePve::requests`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{ChildGuard, free_port, http_client};

pub const USER: &str = "root@pam";
/// VMID of the template in guests.json (node pve1, disk on local-lvm, net0 on vmbr0).
pub const TEMPLATE_VMID: u64 = 9000;
pub const TEMPLATE_NAME: &str = "ubuntu-template";
/// A running VM on pve2 whose guest agent answers (192.0.2.10), tagged with [`AGENT_VM_UID`].
pub const AGENT_VM_VMID: u64 = 101;
pub const AGENT_VM_UID: &str = "0a1b2c3d-0000-4000-8000-000000000101";
/// A running VM on pve1 without ACPI (ignores shutdown requests), tagged with [`NO_ACPI_VM_UID`].
pub const NO_ACPI_VM_VMID: u64 = 102;
pub const NO_ACPI_VM_UID: &str = "0a1b2c3d-0000-4000-8000-000000000102";

/// How a test wants fakepve run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Real seconds per PVE second; 0 finishes every task before its request returns.
    pub time_scale: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options { time_scale: 0.0 }
    }
}

/// A VM as fakepve lists it (`/cluster/resources?type=vm`).
#[derive(Clone, Debug, PartialEq)]
pub struct VmInfo {
    pub vmid: u64,
    pub name: String,
    pub node: String,
    pub status: String,
    pub tags: String,
    pub template: bool,
}

/// One request the counting proxy forwarded.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// `token`, `ticket` or `none`.
    pub auth: &'static str,
    /// The query string (without `?`) and the body, as sent.
    pub query: String,
    pub body: String,
}

#[derive(Default)]
struct Stats {
    logins: AtomicUsize,
    requests: Mutex<Vec<Seen>>,
}

/// A running fakepve; stopped (by PID) and its files removed when dropped.
pub struct FakePve {
    /// `https://127.0.0.1:PORT`: fakepve itself.
    pub url: String,
    /// `http://127.0.0.1:PORT`: the counting proxy in front of it.
    pub proxy_url: String,
    /// The certificate fakepve serves (self-signed, for 127.0.0.1), PEM.
    pub ca_pem: String,
    pub username: String,
    pub password: String,
    dir: PathBuf,
    child: Option<ChildGuard>,
    proxy: tokio::task::JoinHandle<()>,
    stats: Arc<Stats>,
    client: reqwest::Client,
}

fn python() -> String {
    std::env::var("FAKEPVE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn fakepve_bin() -> String {
    std::env::var("FAKEPVE").unwrap_or_else(|_| "fakepve".into())
}

fn not_installed(what: &str) -> anyhow::Error {
    anyhow!(
        "{what}: fakepve is not installed (or not on PATH); run tests/backends/fakepve/install.sh \
         (pip install 'fakepve[crypto]==0.5.0'), or set FAKEPVE / FAKEPVE_PYTHON"
    )
}

impl FakePve {
    /// fakepve with `--time-scale 0`.
    pub async fn start() -> Result<FakePve> {
        Self::start_with(Options::default()).await
    }

    pub async fn start_with(opts: Options) -> Result<FakePve> {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!("banlieue-fakepve-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let guests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fakepve/guests.json");
        std::fs::copy(&guests, dir.join("guests.json")).with_context(|| format!("copying {}", guests.display()))?;

        // The certificate, made by fakepve's own helper.
        let out = std::process::Command::new(python())
            .arg("-c")
            .arg("import sys; from fakepve.certs import make_cert; make_cert(sys.argv[1], hosts=('127.0.0.1',))")
            .arg(&dir)
            .output()
            .map_err(|e| not_installed(&format!("running {}: {e}", python())))?;
        if !out.status.success() {
            return Err(not_installed(&format!("making a certificate: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        let ca_pem = std::fs::read_to_string(dir.join("fakepve.crt")).context("reading fakepve.crt")?;

        let password = format!("pw-{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos());
        let port = free_port();
        let log = std::fs::File::create(dir.join("fakepve.log"))?;
        let child = std::process::Command::new(fakepve_bin())
            .arg(dir.join("guests.json"))
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--user", USER, "--password", &password])
            .args(["--time-scale", &opts.time_scale.to_string()])
            .arg("--cert")
            .arg(dir.join("fakepve.crt"))
            .arg("--key")
            .arg(dir.join("fakepve.key"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| not_installed(&format!("starting {}: {e}", fakepve_bin())))?;
        let mut child = ChildGuard(child);
        let url = format!("https://127.0.0.1:{port}");
        let client = http_client();

        // Bounded wait until it answers (any HTTP answer will do: /version needs a login).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.0.try_wait()? {
                let log = std::fs::read_to_string(dir.join("fakepve.log")).unwrap_or_default();
                bail!("fakepve exited ({status}) before answering:\n{log}");
            }
            if client.get(format!("{url}/api2/json/version")).send().await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("fakepve.log")).unwrap_or_default();
                bail!("fakepve did not answer on {url} within 30 s:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // The counting proxy.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let proxy_url = format!("http://{}", listener.local_addr()?);
        let stats = Arc::new(Stats::default());
        let proxy = tokio::spawn(serve_proxy(listener, url.clone(), client.clone(), stats.clone()));

        let pve = FakePve {
            url,
            proxy_url,
            ca_pem,
            username: USER.into(),
            password,
            dir,
            child: Some(child),
            proxy,
            stats,
            client,
        };
        // Storages PVE would have configured: a shared one and one on pve2 only.
        pve.api("POST", "/storage", &[("storage", "shared-dir"), ("type", "dir"), ("path", "/mnt/pve/shared-dir"), ("content", "images"), ("shared", "1")])
            .await
            .context("adding storage shared-dir")?;
        pve.api("POST", "/storage", &[("storage", "pve2-only"), ("type", "dir"), ("path", "/mnt/pve/pve2-only"), ("content", "images"), ("nodes", "pve2")])
            .await
            .context("adding storage pve2-only")?;
        // `local` also takes `import` content (PVE 8.4+), where images are downloaded to.
        pve.api("PUT", "/storage/local", &[("content", "iso,vztmpl,backup,import")]).await.context("letting storage local hold import content")?;
        Ok(pve)
    }

    /// Stop fakepve (for "backend down"); the proxy keeps listening and answers 502.
    pub fn stop(&mut self) {
        self.child.take();
    }

    /// `POST /access/ticket` requests that went through the proxy.
    pub fn logins(&self) -> usize {
        self.stats.logins.load(Ordering::SeqCst)
    }

    /// Every request that went through the proxy, oldest first.
    pub fn requests(&self) -> Vec<Seen> {
        self.stats.requests.lock().unwrap().clone()
    }

    /// A ticket and CSRF token of the fixture's own (straight to fakepve, not counted).
    async fn ticket(&self) -> Result<(String, String)> {
        let resp = self
            .client
            .post(format!("{}/api2/json/access/ticket", self.url))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("username", self.username.as_str()), ("password", self.password.as_str())]))
            .send()
            .await?;
        let status = resp.status();
        let v: Value = serde_json::from_slice(&resp.bytes().await?)?;
        let data = &v["data"];
        match (data["ticket"].as_str(), data["CSRFPreventionToken"].as_str()) {
            (Some(t), Some(c)) => Ok((t.into(), c.into())),
            _ => bail!("fakepve login failed: HTTP {status}: {v}"),
        }
    }

    /// One PVE API call of the fixture's own: `data`, or an error with PVE's message.
    pub async fn api(&self, method: &str, path: &str, params: &[(&str, &str)]) -> Result<Value> {
        let (ticket, csrf) = self.ticket().await?;
        let query = matches!(method, "GET" | "DELETE") && !params.is_empty();
        let url = format!("{}/api2/json{path}{}", self.url, if query { format!("?{}", form(params)) } else { String::new() });
        let m = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut req = self.client.request(m, &url).header("cookie", format!("PVEAuthCookie={ticket}")).header("CSRFPreventionToken", csrf);
        if !matches!(method, "GET" | "DELETE") {
            req = req.header("content-type", "application/x-www-form-urlencoded").body(form(params));
        }
        let resp = req.send().await.with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let bytes = resp.bytes().await?;
        let v: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{method} {path}: HTTP {status}: not JSON: {}", String::from_utf8_lossy(&bytes)))?;
        if !status.is_success() {
            bail!("{method} {path}: HTTP {status}: {}", v["message"].as_str().unwrap_or("").trim());
        }
        Ok(v["data"].clone())
    }

    /// Every VM and template.
    pub async fn vms(&self) -> Result<Vec<VmInfo>> {
        let data = self.api("GET", "/cluster/resources", &[("type", "vm")]).await?;
        let mut out: Vec<VmInfo> = data
            .as_array()
            .ok_or_else(|| anyhow!("/cluster/resources: not a list: {data}"))?
            .iter()
            .filter(|v| v["type"] == "qemu")
            .map(|v| VmInfo {
                vmid: v["vmid"].as_u64().unwrap_or(0),
                name: v["name"].as_str().unwrap_or("").into(),
                node: v["node"].as_str().unwrap_or("").into(),
                status: v["status"].as_str().unwrap_or("").into(),
                tags: v["tags"].as_str().unwrap_or("").into(),
                template: v["template"].as_u64().unwrap_or(0) == 1,
            })
            .collect();
        out.sort_by_key(|v| v.vmid);
        Ok(out)
    }

    /// The VMs carrying `banlieue-<uid>` in their tags.
    pub async fn vms_tagged(&self, uid: &str) -> Result<Vec<VmInfo>> {
        let tag = format!("banlieue-{uid}");
        Ok(self.vms().await?.into_iter().filter(|v| v.tags.split([';', ',', ' ']).any(|t| t == tag)).collect())
    }

    /// A VM's config (`GET /nodes/{node}/qemu/{vmid}/config`; description included).
    pub async fn vm_config(&self, node: &str, vmid: u64) -> Result<Value> {
        self.api("GET", &format!("/nodes/{node}/qemu/{vmid}/config"), &[]).await
    }

    /// A VM's snapshots (`GET …/snapshot`), without the `current` pseudo-entry; and the
    /// name of the one the VM's present state descends from (that entry's `parent`).
    pub async fn snapshots(&self, node: &str, vmid: u64) -> Result<(Vec<Value>, Option<String>)> {
        let data = self.api("GET", &format!("/nodes/{node}/qemu/{vmid}/snapshot"), &[]).await?;
        let all = data.as_array().cloned().unwrap_or_default();
        let current = all.iter().find(|s| s["name"] == "current").and_then(|s| s["parent"].as_str()).map(str::to_string);
        Ok((all.into_iter().filter(|s| s["name"] != "current").collect(), current))
    }

    /// Run a task-making call and wait until the task stops; its exit status (`OK` or why not).
    pub async fn run_task(&self, node: &str, method: &str, path: &str, params: &[(&str, &str)]) -> Result<String> {
        let upid = self.api(method, path, params).await?;
        let upid = upid.as_str().ok_or_else(|| anyhow!("{method} {path}: no task: {upid}"))?.to_string();
        for _ in 0..2400 {
            let st = self.api("GET", &format!("/nodes/{node}/tasks/{}/status", enc(&upid)), &[]).await?;
            if st["status"] == "stopped" {
                return Ok(st["exitstatus"].as_str().unwrap_or("").to_string());
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        bail!("task {upid} did not stop within 60 s")
    }

    /// A VM's `status/current`.
    pub async fn vm_status(&self, node: &str, vmid: u64) -> Result<Value> {
        self.api("GET", &format!("/nodes/{node}/qemu/{vmid}/status/current"), &[]).await
    }

    /// What a task logged, one line per entry.
    pub async fn task_log(&self, node: &str, upid: &str) -> Result<Vec<String>> {
        let data = self.api("GET", &format!("/nodes/{node}/tasks/{}/log", enc(upid)), &[("limit", "1000")]).await?;
        Ok(data.as_array().into_iter().flatten().map(|l| l["t"].as_str().unwrap_or("").to_string()).collect())
    }

    /// The volumes of a node's storage (`GET …/storage/{storage}/content`), optionally of one content type.
    pub async fn storage_content(&self, node: &str, storage: &str, content: Option<&str>) -> Result<Vec<Value>> {
        let params: Vec<(&str, &str)> = content.map(|c| vec![("content", c)]).unwrap_or_default();
        let data = self.api("GET", &format!("/nodes/{node}/storage/{storage}/content"), &params).await?;
        Ok(data.as_array().cloned().unwrap_or_default())
    }

    /// Tasks of a node, newest first (type, id, status).
    pub async fn tasks(&self, node: &str) -> Result<Vec<Value>> {
        let data = self.api("GET", &format!("/nodes/{node}/tasks"), &[("limit", "500")]).await?;
        Ok(data.as_array().cloned().unwrap_or_default())
    }
}

/// A form or query string (every byte but unreserved ones percent-encoded).
/// Every byte but unreserved ones percent-encoded.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect()
}

fn form(params: &[(&str, &str)]) -> String {
    params.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

impl Drop for FakePve {
    fn drop(&mut self) {
        self.proxy.abort();
        self.child.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn serve_proxy(listener: tokio::net::TcpListener, upstream: String, client: reqwest::Client, stats: Arc<Stats>) {
    loop {
        let Ok((sock, _)) = listener.accept().await else { continue };
        let (upstream, client, stats) = (upstream.clone(), client.clone(), stats.clone());
        tokio::spawn(async move {
            let _ = proxy_one(sock, &upstream, &client, &stats).await;
        });
    }
}

/// A websocket (a console's `vncwebsocket`): the upgrade sent on to fakepve, its answer
/// passed back, then the bytes both ways until either side closes.
async fn tunnel(mut sock: tokio::net::TcpStream, upstream: &str, target: &str, headers: &[(String, String)]) -> Result<()> {
    let client = reqwest::Client::builder().tls_danger_accept_invalid_certs(true).no_proxy().http1_only().build()?;
    let mut req = client.get(format!("{upstream}{target}"));
    for (k, v) in headers {
        if !["host", "content-length"].iter().any(|h| k.eq_ignore_ascii_case(h)) {
            req = req.header(k.as_str(), v.as_str());
        }
    }
    let resp = tokio::time::timeout(Duration::from_secs(30), req.send()).await??;
    let mut head = format!("HTTP/1.1 {} {}\r\n", resp.status().as_u16(), resp.status().canonical_reason().unwrap_or("Status"));
    for (k, v) in resp.headers() {
        head.push_str(&format!("{k}: {}\r\n", v.to_str().unwrap_or_default()));
    }
    head.push_str("\r\n");
    let switching = resp.status() == reqwest::StatusCode::SWITCHING_PROTOCOLS;
    sock.write_all(head.as_bytes()).await?;
    if !switching {
        sock.write_all(&resp.bytes().await.unwrap_or_default()).await?;
        return Ok(sock.shutdown().await?);
    }
    let mut upgraded = resp.upgrade().await?;
    let _ = tokio::io::copy_bidirectional(&mut sock, &mut upgraded).await;
    Ok(())
}

/// One request per connection (the answer says `Connection: close`).
async fn proxy_one(mut sock: tokio::net::TcpStream, upstream: &str, client: &reqwest::Client, stats: &Stats) -> Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 1 << 20 {
            bail!("request head too large");
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let (method, target) = (first.next().unwrap_or("").to_string(), first.next().unwrap_or("/").to_string());
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let len: usize = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("content-length")).and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    let auth = if headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("authorization") && v.starts_with("PVEAPIToken=")) {
        "token"
    } else if headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("cookie") && v.contains("PVEAuthCookie=")) {
        "ticket"
    } else {
        "none"
    };
    if method == "POST" && path.ends_with("/access/ticket") {
        stats.logins.fetch_add(1, Ordering::SeqCst);
    }
    let query = target.split_once('?').map(|(_, q)| q.to_string()).unwrap_or_default();
    stats.requests.lock().unwrap().push(Seen { method: method.clone(), path, auth, query, body: String::from_utf8_lossy(&body).into_owned() });
    let upgrade = headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("upgrade") && v.eq_ignore_ascii_case("websocket"));
    if upgrade {
        return tunnel(sock, upstream, &target, &headers).await;
    }

    let mut req = client.request(reqwest::Method::from_bytes(method.as_bytes())?, format!("{upstream}{target}"));
    for (k, v) in &headers {
        if !["host", "connection", "content-length", "transfer-encoding"].iter().any(|h| k.eq_ignore_ascii_case(h)) {
            req = req.header(k.as_str(), v.as_str());
        }
    }
    let (status, ctype, payload) = match req.body(body).send().await {
        Ok(resp) => {
            let status = resp.status();
            let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("application/json").to_string();
            (status.as_u16(), ctype, resp.bytes().await.map(|b| b.to_vec()).unwrap_or_default())
        }
        Err(e) => (502, "text/plain".to_string(), format!("fakepve proxy: {e}").into_bytes()),
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        reqwest::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Status"),
        payload.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(&payload).await?;
    sock.shutdown().await?;
    Ok(())
}
