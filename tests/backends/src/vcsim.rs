//! vcsim: govmomi's vSphere simulator (our `tests/backends/vcsim/main.go`, built
//! by `tests/backends/vcsim/build.sh`), started on 127.0.0.1 and queried over
//! vim25 SOAP with a session of its own.
//!
//! The model is vcsim's default vCenter: datacenter `DC0`, cluster `DC0_C0`
//! (3 hosts), datastore `LocalDS_0`, networks `VM Network` and `DC0_DVPG0`,
//! VMs `DC0_C0_RP0_VM0`…, plus the template [`TEMPLATE`]. Only
//! [`USERNAME`] / [`PASSWORD`] log in. A powered-on VM gets a deterministic
//! guest address (10.x.y.z from its instance UUID) within ~50 ms.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};

use crate::{ChildGuard, free_port, http_client};

pub const USERNAME: &str = "vcsim-user";
pub const PASSWORD: &str = "vcsim-pass";
/// The template main.go creates (a clone of `DC0_C0_RP0_VM0`).
pub const TEMPLATE: &str = "tmpl-debian";

/// A running vcsim, killed when dropped.
pub struct Vcsim {
    /// `http://127.0.0.1:PORT/sdk`.
    pub url: String,
    child: Option<ChildGuard>,
    http: reqwest::Client,
    cookie: String,
    /// vcsim's stderr: its log, where NFC uploads say how many bytes they received.
    log: tempfile::NamedTempFile,
    /// vcsim's TMPDIR, where it makes its datastores (removed with it: disks carried to it
    /// are real files).
    _datastores: tempfile::TempDir,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The vcsim binary: `$BANLIEUE_VCSIM`, else `<repo>/target/backends/vcsim`.
pub fn binary() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("BANLIEUE_VCSIM") {
        Some(p) => PathBuf::from(p),
        None => repo_root().join("target/backends/vcsim"),
    };
    if !path.is_file() {
        bail!(
            "vcsim binary not found at {} (set BANLIEUE_VCSIM or build it with tests/backends/vcsim/build.sh)",
            path.display()
        );
    }
    Ok(path)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn envelope(body: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><soapenv:Envelope xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"><soapenv:Body>{body}</soapenv:Body></soapenv:Envelope>"
    )
}

fn props_request(kind: &str, obj: &str, paths: &[&str]) -> String {
    let paths: String = paths.iter().map(|p| format!("<pathSet>{}</pathSet>", esc(p))).collect();
    format!(
        "<RetrievePropertiesEx xmlns=\"urn:vim25\"><_this type=\"PropertyCollector\">propertyCollector</_this><specSet>\
<propSet><type>{kind}</type><all>false</all>{paths}</propSet><objectSet><obj type=\"{kind}\">{}</obj><skip>false</skip></objectSet>\
</specSet><options></options></RetrievePropertiesEx>",
        esc(obj)
    )
}

/// Text of every descendant element named `name` (local name).
fn texts(xml: &str, name: &str) -> anyhow::Result<Vec<String>> {
    let doc = roxmltree::Document::parse(xml).context("parsing vcsim's answer")?;
    Ok(doc.descendants().filter(|n| n.has_tag_name(name)).map(|n| n.text().unwrap_or("").to_string()).collect())
}

impl Vcsim {
    /// Start vcsim on a free port and log in; fails (never skips) if the binary is missing.
    pub async fn start() -> anyhow::Result<Vcsim> {
        Self::start_with_vms(0).await
    }

    /// [`start`](Self::start) with `per_host` VMs on its standalone host and in its cluster's
    /// resource pool each (0: the model's two), for benchmarks at scale.
    pub async fn start_with_vms(per_host: usize) -> anyhow::Result<Vcsim> {
        let bin = binary()?;
        let port = free_port();
        let log = tempfile::NamedTempFile::new().context("vcsim log file")?;
        let datastores = tempfile::tempdir().context("vcsim datastore directory")?;
        let mut child = Command::new(&bin)
            .env("TMPDIR", datastores.path())
            .args(["-l", &format!("127.0.0.1:{port}"), "-username", USERNAME, "-password", PASSWORD, "-template", TEMPLATE, "-vm", &per_host.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log.reopen().context("vcsim log file")?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let guard = ChildGuard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(60)))
            .await?
            .map_err(|_| anyhow!("vcsim did not report listening within 60 s"))?;
        let url = line
            .trim()
            .strip_prefix("vcsim listening on ")
            .ok_or_else(|| anyhow!("vcsim exited or printed {line:?} instead of its URL"))?
            .to_string();
        let mut vcsim = Vcsim { url, child: Some(guard), http: http_client(), cookie: String::new(), log, _datastores: datastores };
        vcsim.cookie = vcsim.login(USERNAME, PASSWORD).await?;
        Ok(vcsim)
    }

    /// Bytes vcsim's NFC handler received per uploaded file, from its log
    /// (`nfc POST <file>: transferred <n> bytes`): (file name, bytes).
    pub fn nfc_uploads(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let log = std::fs::read_to_string(self.log.path()).context("reading vcsim's log")?;
        Ok(log
            .lines()
            .filter_map(|l| {
                let (_, rest) = l.split_once("nfc POST ").or_else(|| l.split_once("nfc PUT "))?;
                let (file, n) = rest.split_once(": transferred ")?;
                let n = n.strip_suffix(" bytes")?.parse().ok()?;
                Some((file.rsplit('/').next().unwrap_or(file).to_string(), n))
            })
            .collect())
    }

    /// Whether the VM `name` exists and is a template: `None` if there is no such VM.
    pub async fn is_template(&self, name: &str) -> anyhow::Result<Option<bool>> {
        let body = format!(
            "<FindByInventoryPath xmlns=\"urn:vim25\"><_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>DC0/vm/{}</inventoryPath></FindByInventoryPath>",
            esc(name)
        );
        let Some(vm) = texts(&self.call(&body).await?, "returnval")?.into_iter().next() else { return Ok(None) };
        Ok(Some(self.vm_property(&vm, "config.template").await?.as_deref() == Some("true")))
    }

    /// Kill vcsim now (for "backend down"); its port is closed afterwards.
    pub fn stop(&mut self) {
        self.child.take();
    }

    async fn post(&self, cookie: Option<&str>, body: &str) -> anyhow::Result<(u16, String, Option<String>)> {
        let mut req = self.http.post(&self.url).header("content-type", "text/xml; charset=utf-8").body(envelope(body));
        if let Some(c) = cookie {
            req = req.header("cookie", format!("vmware_soap_session={c}"));
        }
        let resp = tokio::time::timeout(Duration::from_secs(30), req.send()).await.context("vcsim timed out")??;
        let status = resp.status().as_u16();
        let set_cookie = resp
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find_map(|v| v.split(';').next()?.trim().strip_prefix("vmware_soap_session=").map(str::to_string));
        Ok((status, resp.text().await?, set_cookie))
    }

    /// Log in; returns the session cookie.
    pub async fn login(&self, user: &str, password: &str) -> anyhow::Result<String> {
        let body = format!(
            "<Login xmlns=\"urn:vim25\"><_this type=\"SessionManager\">SessionManager</_this><userName>{}</userName><password>{}</password></Login>",
            esc(user),
            esc(password)
        );
        let (status, text, cookie) = self.post(None, &body).await?;
        cookie.ok_or_else(|| anyhow!("vcsim login as {user}: HTTP {status}: {text}"))
    }

    /// A method call with the fixture's session; a SOAP fault is an error.
    pub async fn call(&self, body: &str) -> anyhow::Result<String> {
        let (status, text, _) = self.post(Some(&self.cookie), body).await?;
        if status != 200 || text.contains("Fault>") && text.contains("<faultstring>") {
            bail!("vcsim: HTTP {status}: {text}");
        }
        Ok(text)
    }

    /// Keys of every session vcsim holds, other than the fixture's own.
    pub async fn sessions(&self) -> anyhow::Result<Vec<String>> {
        let xml = self.call(&props_request("SessionManager", "SessionManager", &["sessionList", "currentSession"])).await?;
        let doc = roxmltree::Document::parse(&xml)?;
        let mut own = None;
        let mut keys = Vec::new();
        for prop in doc.descendants().filter(|n| n.has_tag_name("propSet")) {
            let name = prop.children().find(|c| c.has_tag_name("name")).and_then(|c| c.text()).unwrap_or("");
            let Some(val) = prop.children().find(|c| c.has_tag_name("val")) else { continue };
            let key_of = |n: roxmltree::Node| n.children().find(|c| c.has_tag_name("key")).and_then(|c| c.text()).map(str::to_string);
            match name {
                "currentSession" => own = key_of(val),
                "sessionList" => keys.extend(val.children().filter(|c| c.is_element()).filter_map(key_of)),
                _ => {}
            }
        }
        keys.retain(|k| Some(k) != own.as_ref());
        Ok(keys)
    }

    /// How many logins (sessions) others made: each Login makes one session, kept until Logout.
    pub async fn login_count(&self) -> anyhow::Result<usize> {
        Ok(self.sessions().await?.len())
    }

    /// The VM (moref value) with this instance UUID.
    pub async fn find_vm(&self, instance_uuid: &str) -> anyhow::Result<Option<String>> {
        let body = format!(
            "<FindByUuid xmlns=\"urn:vim25\"><_this type=\"SearchIndex\">SearchIndex</_this><uuid>{}</uuid><vmSearch>true</vmSearch><instanceUuid>true</instanceUuid></FindByUuid>",
            esc(instance_uuid)
        );
        Ok(texts(&self.call(&body).await?, "returnval")?.into_iter().next())
    }

    /// The text of a VM property (`runtime.powerState`, `name`, `config.instanceUuid`, …).
    pub async fn vm_property(&self, vm: &str, path: &str) -> anyhow::Result<Option<String>> {
        let xml = self.call(&props_request("VirtualMachine", vm, &[path])).await?;
        Ok(texts(&xml, "val")?.into_iter().next())
    }

    pub async fn power_state(&self, vm: &str) -> anyhow::Result<String> {
        self.vm_property(vm, "runtime.powerState").await?.ok_or_else(|| anyhow!("{vm} has no power state"))
    }

    pub async fn name(&self, vm: &str) -> anyhow::Result<String> {
        self.vm_property(vm, "name").await?.ok_or_else(|| anyhow!("{vm} has no name"))
    }

    /// A VM's `config.extraConfig` value for `key` (the last one: vcsim appends an entry for each
    /// change of a key, where vCenter keeps one; an empty value is vSphere's removal).
    pub async fn extra_config(&self, vm: &str, key: &str) -> anyhow::Result<Option<String>> {
        let xml = self.call(&props_request("VirtualMachine", vm, &["config.extraConfig"])).await?;
        let doc = roxmltree::Document::parse(&xml)?;
        let child_text = |n: roxmltree::Node, name: &str| {
            n.children().find(|c| c.has_tag_name(name)).and_then(|c| c.text()).map(str::to_string)
        };
        Ok(doc
            .descendants()
            .filter(|n| n.has_tag_name("OptionValue"))
            .filter(|n| child_text(*n, "key").as_deref() == Some(key))
            .last()
            .and_then(|n| child_text(n, "value")))
    }

    /// A VM's snapshots as vSphere holds them (`snapshot.rootSnapshotList`, depth first):
    /// (snapshot moref value, name), and the moref of `snapshot.currentSnapshot`.
    pub async fn snapshots(&self, vm: &str) -> anyhow::Result<(Vec<(String, String)>, Option<String>)> {
        let xml = self.call(&props_request("VirtualMachine", vm, &["snapshot"])).await?;
        let doc = roxmltree::Document::parse(&xml)?;
        let child = |n: roxmltree::Node, name: &str| n.children().find(|c| c.has_tag_name(name)).and_then(|c| c.text()).map(str::to_string);
        let tree = doc
            .descendants()
            .filter(|n| n.has_tag_name("rootSnapshotList") || n.has_tag_name("childSnapshotList"))
            .filter_map(|n| Some((child(n, "snapshot")?, child(n, "name")?)))
            .collect();
        let current = doc.descendants().find(|n| n.has_tag_name("currentSnapshot")).and_then(|n| n.text()).map(str::to_string).filter(|c| !c.is_empty());
        Ok((tree, current))
    }

    /// Remove a snapshot outside banlieue (`RemoveSnapshot_Task`), as an operator would by hand.
    pub async fn remove_snapshot_outside(&self, snapshot: &str) -> anyhow::Result<()> {
        self.task_on("VirtualMachineSnapshot", snapshot, "RemoveSnapshot_Task", "<removeChildren>false</removeChildren>").await
    }

    /// Take a snapshot outside banlieue (`CreateSnapshot_Task`, waited for), as by hand.
    pub async fn create_snapshot_outside(&self, vm: &str, name: &str) -> anyhow::Result<()> {
        self.task_with("CreateSnapshot_Task", vm, &format!("<name>{}</name><memory>false</memory><quiesce>false</quiesce>", esc(name))).await
    }

    /// Revert to a snapshot outside banlieue (`RevertToSnapshot_Task`, waited for).
    pub async fn revert_snapshot_outside(&self, snapshot: &str) -> anyhow::Result<()> {
        self.task_on("VirtualMachineSnapshot", snapshot, "RevertToSnapshot_Task", "<suppressPowerOn>true</suppressPowerOn>").await
    }

    /// What vcsim logged (a fault it hit says why).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// A VM's virtual disks as vcsim reports them (`config.hardware.device`): capacity in
    /// KiB and backing file, in controller and unit order.
    pub async fn virtual_disks(&self, vm: &str) -> anyhow::Result<Vec<(u64, String)>> {
        let xml = self.call(&props_request("VirtualMachine", vm, &["config.hardware.device"])).await?;
        let doc = roxmltree::Document::parse(&xml)?;
        let text = |n: roxmltree::Node, path: &[&str]| {
            let mut n = n;
            for p in path {
                n = n.children().find(|c| c.has_tag_name(*p))?;
            }
            n.text().map(str::to_string)
        };
        let mut disks: Vec<(i64, i64, u64, String)> = doc
            .descendants()
            .filter(|n| n.has_tag_name("VirtualDevice") && n.attributes().any(|a| a.name() == "type" && a.value() == "VirtualDisk"))
            .filter_map(|n| {
                Some((
                    text(n, &["controllerKey"])?.parse().ok()?,
                    text(n, &["unitNumber"])?.parse().ok()?,
                    text(n, &["capacityInKB"])?.parse().ok()?,
                    text(n, &["backing", "fileName"]).unwrap_or_default(),
                ))
            })
            .collect();
        disks.sort();
        Ok(disks.into_iter().map(|(_, _, kib, file)| (kib, file)).collect())
    }

    /// `len` bytes at `offset` of a file on the datastore (`[LocalDS_0] dir/file`), read over
    /// vcsim's datastore HTTP access (`/folder/…`), and the file's whole size.
    pub async fn datastore_read(&self, path: &str, offset: u64, len: u64) -> anyhow::Result<(u64, Vec<u8>)> {
        let (ds, file) = path.strip_prefix('[').and_then(|p| p.split_once("] ")).with_context(|| format!("{path} is not a datastore path"))?;
        let url = format!("{}/folder/{file}?dcPath=DC0&dsName={ds}", self.url.trim_end_matches("/sdk"));
        let cookie = format!("vmware_soap_session={}", self.cookie);
        let head = self.http.head(&url).header("Cookie", &cookie).send().await?.error_for_status()?;
        let size = head.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).context("no Content-Length")?;
        let range = format!("bytes={offset}-{}", offset + len - 1);
        let body = self.http.get(&url).header("Cookie", &cookie).header("Range", range).send().await?.error_for_status()?.bytes().await?;
        Ok((size, body.to_vec()))
    }

    /// Upload `file` to the datastore (`[LocalDS_0] dir/file`) by hand, as a user would with
    /// curl (`PUT /folder/…` with a session cookie); the HTTP status.
    pub async fn datastore_put_with_curl(&self, path: &str, file: &std::path::Path) -> anyhow::Result<String> {
        let (ds, name) = path.strip_prefix('[').and_then(|p| p.split_once("] ")).with_context(|| format!("{path} is not a datastore path"))?;
        let url = format!("{}/folder/{name}?dcPath=DC0&dsName={ds}", self.url.trim_end_matches("/sdk"));
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "--max-time", "3600", "-o", "/dev/null", "-w", "%{http_code}", "-H"])
            .arg(format!("Cookie: vmware_soap_session={}", self.cookie))
            .arg("-T")
            .arg(file)
            .arg(&url)
            .output()
            .await?;
        anyhow::ensure!(out.status.success(), "curl PUT {url}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// The MAC addresses of a VM's ethernet cards, in device order.
    pub async fn nic_macs(&self, vm: &str) -> anyhow::Result<Vec<String>> {
        let xml = self.call(&props_request("VirtualMachine", vm, &["config.hardware.device"])).await?;
        texts(&xml, "macAddress")
    }

    /// The guest IP addresses vcsim reports for a VM (`guest.net[].ipAddress`).
    pub async fn guest_ips(&self, vm: &str) -> anyhow::Result<Vec<String>> {
        let xml = self.call(&props_request("VirtualMachine", vm, &["guest.net"])).await?;
        texts(&xml, "ipAddress")
    }

    /// The names of every VM and template.
    pub async fn vm_names(&self) -> anyhow::Result<Vec<String>> {
        let body = "<RetrievePropertiesEx xmlns=\"urn:vim25\"><_this type=\"PropertyCollector\">propertyCollector</_this><specSet>\
<propSet><type>VirtualMachine</type><all>false</all><pathSet>name</pathSet></propSet>\
<objectSet><obj type=\"Folder\">group-d1</obj><skip>true</skip>\
<selectSet xsi:type=\"TraversalSpec\"><name>f</name><type>Folder</type><path>childEntity</path><skip>false</skip><selectSet><name>f</name></selectSet><selectSet><name>dc</name></selectSet></selectSet>\
<selectSet xsi:type=\"TraversalSpec\"><name>dc</name><type>Datacenter</type><path>vmFolder</path><skip>false</skip><selectSet><name>f</name></selectSet></selectSet>\
</objectSet></specSet><options></options></RetrievePropertiesEx>";
        let mut names = texts(&self.call(body).await?, "val")?;
        names.sort();
        Ok(names)
    }

    async fn task(&self, method: &str, vm: &str) -> anyhow::Result<()> {
        self.task_with(method, vm, "").await
    }

    /// A task method on a VM with `args` (XML, after `_this`), waited for.
    async fn task_with(&self, method: &str, vm: &str, args: &str) -> anyhow::Result<()> {
        self.task_on("VirtualMachine", vm, method, args).await
    }

    /// A task method on object `obj` of type `kind`, waited for.
    async fn task_on(&self, kind: &str, obj: &str, method: &str, args: &str) -> anyhow::Result<()> {
        let body = format!("<{method} xmlns=\"urn:vim25\"><_this type=\"{kind}\">{}</_this>{args}</{method}>", esc(obj));
        let task = texts(&self.call(&body).await?, "returnval")?.into_iter().next().ok_or_else(|| anyhow!("no task"))?;
        for _ in 0..300 {
            let xml = self.call(&props_request("Task", &task, &["info.state"])).await?;
            match texts(&xml, "val")?.first().map(String::as_str) {
                Some("success") => return Ok(()),
                Some("error") => bail!("{method} {obj} failed: {xml}"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        bail!("{method} {obj} did not finish")
    }

    /// Take every virtual disk off a VM (their files stay): what a clone that failed
    /// half-way leaves.
    pub async fn remove_disks(&self, vm: &str) -> anyhow::Result<()> {
        let xml = self.call(&props_request("VirtualMachine", vm, &["config.hardware.device"])).await?;
        let doc = roxmltree::Document::parse(&xml)?;
        let keys: Vec<String> = doc
            .descendants()
            .filter(|n| n.has_tag_name("VirtualDevice") && n.attributes().any(|a| a.name() == "type" && a.value() == "VirtualDisk"))
            .filter_map(|n| n.children().find(|c| c.has_tag_name("key"))?.text().map(str::to_string))
            .collect();
        let changes: String = keys
            .iter()
            .map(|k| format!("<deviceChange><operation>remove</operation><device xsi:type=\"VirtualDisk\"><key>{k}</key><capacityInKB>0</capacityInKB></device></deviceChange>"))
            .collect();
        self.task_with("ReconfigVM_Task", vm, &format!("<spec>{changes}</spec>")).await
    }

    /// The VM (moref value) at inventory path `path` (`DC0/vm/<name>`), if any.
    pub async fn vm_at(&self, path: &str) -> anyhow::Result<Option<String>> {
        let body = format!(
            "<FindByInventoryPath xmlns=\"urn:vim25\"><_this type=\"SearchIndex\">SearchIndex</_this><inventoryPath>{}</inventoryPath></FindByInventoryPath>",
            esc(path)
        );
        Ok(texts(&self.call(&body).await?, "returnval")?.into_iter().next())
    }

    /// Make VM `name` behind banlieue's back: a powered-on clone of vcsim's own `DC0_C0_RP0_VM0`
    /// in its folder, as an administrator would over vim25. Its moref value.
    pub async fn clone_outside(&self, name: &str) -> anyhow::Result<String> {
        let source = self.vm_at("DC0/vm/DC0_C0_RP0_VM0").await?.ok_or_else(|| anyhow!("vcsim has no DC0/vm/DC0_C0_RP0_VM0"))?;
        let folder = self.vm_property(&source, "parent").await?.ok_or_else(|| anyhow!("{source} has no parent folder"))?;
        let args = format!(
            "<folder type=\"Folder\">{}</folder><name>{}</name><spec><location></location><template>false</template><powerOn>true</powerOn></spec>",
            esc(&folder),
            esc(name)
        );
        self.task_with("CloneVM_Task", &source, &args).await?;
        self.vm_at(&format!("DC0/vm/{name}")).await?.ok_or_else(|| anyhow!("the clone {name} is not at DC0/vm/{name}"))
    }

    /// Power a VM off behind banlieue's back.
    pub async fn power_off_outside(&self, vm: &str) -> anyhow::Result<()> {
        self.task("PowerOffVM_Task", vm).await
    }

    /// Power a VM on behind banlieue's back.
    pub async fn power_on_outside(&self, vm: &str) -> anyhow::Result<()> {
        self.task("PowerOnVM_Task", vm).await
    }
}
