//! libvirtd with qemu (TCG) on this machine: `qemu:///system`, storage pool and
//! isolated DHCP network `banlieue`, and a test guest that boots in seconds.
//!
//! Unlike vcsim and fakepve it is not started per test: a root libvirtd is one
//! per machine and slow to set up, so every test of a run shares it.
//! `scripts/test.sh` starts it before the suites and stops it after; a test run
//! on its own starts it through [`Libvirtd::shared`] (the same idempotent
//! `tests/backends/libvirtd/start.sh`) and leaves it running
//! (`tests/backends/libvirtd/stop.sh` stops it). A test that cannot start it fails.
//!
//! Every query here goes through `virsh` or libvirt's own files, never banlieue.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// The libvirtd every test of this process uses.
#[derive(Debug)]
pub struct Libvirtd {
    pub uri: String,
    /// The dir storage pool the tests' volumes go to.
    pub pool: String,
    /// The isolated network with DHCP (192.168.123.0/24).
    pub network: String,
    /// Where `build-guest.sh` put the test guest.
    pub guest_dir: PathBuf,
}

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("libvirtd")
}

fn run_script(name: &str) -> Result<String> {
    let out = Command::new("bash")
        .arg(scripts().join(name))
        .output()
        .with_context(|| format!("running tests/backends/libvirtd/{name}"))?;
    if !out.status.success() {
        bail!(
            "tests/backends/libvirtd/{name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Libvirtd {
    /// Start libvirtd (or find it running) and build the test guest, once per process.
    pub fn shared() -> Result<&'static Libvirtd> {
        static SHARED: OnceLock<std::result::Result<Libvirtd, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| {
                let start = || -> Result<Libvirtd> {
                    let uri = run_script("start.sh")?.lines().next().unwrap_or_default().to_string();
                    let guest_dir = PathBuf::from(run_script("build-guest.sh")?.lines().last().unwrap_or_default());
                    if !guest_dir.join("disk.qcow2").is_file() {
                        bail!("build-guest.sh left no disk.qcow2 in {}", guest_dir.display());
                    }
                    Ok(Libvirtd { uri, pool: "banlieue".into(), network: "banlieue".into(), guest_dir })
                };
                start().map_err(|e| format!("{e:#}"))
            })
            .as_ref()
            .map_err(|e| anyhow::anyhow!("libvirtd for tests: {e}"))
    }

    /// The test guest's bootable disk (SYSLINUX + busybox initramfs), a qcow2 backing file.
    /// Its `/init` runs busybox `acpid` unless the user-data has `#banlieue-acpid: off`, and
    /// prints `banlieue-guest: marker=<text>` for each user-data line `#banlieue-marker: <text>`.
    pub fn guest_disk(&self) -> String {
        self.guest_dir.join("disk.qcow2").display().to_string()
    }

    /// `virsh -c <uri> args…`, bounded; its stdout.
    pub fn virsh(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("timeout")
            .args(["60", "virsh", "-q", "-c", &self.uri])
            .args(args)
            .output()
            .context("running virsh")?;
        if !out.status.success() {
            bail!("virsh {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The names of every domain, running or not, whose name starts with `prefix`.
    pub fn domains(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.virsh(&["list", "--all", "--name"])?.lines().map(str::trim).filter(|n| !n.is_empty() && n.starts_with(prefix)).map(String::from).collect())
    }

    /// `virsh domstate` (`running`, `shut off`, …).
    pub fn state(&self, domain: &str) -> Result<String> {
        Ok(self.virsh(&["domstate", domain])?.trim().to_string())
    }

    /// `virsh domuuid`.
    pub fn uuid(&self, domain: &str) -> Result<String> {
        Ok(self.virsh(&["domuuid", domain])?.trim().to_string())
    }

    /// The volumes in the test pool whose name starts with `prefix` (as libvirt lists them: every
    /// volume banlieue makes goes through libvirt, so no refresh is needed — and a refresh fails
    /// while another test uploads into the pool).
    pub fn volumes(&self, prefix: &str) -> Result<Vec<String>> {
        let list = self.virsh(&["vol-list", &self.pool])?;
        let mut names: Vec<String> = list.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.starts_with(prefix)).map(String::from).collect();
        names.sort();
        Ok(names)
    }

    /// The IPv4 addresses the network's DHCP server leased to `mac` (`virsh net-dhcp-leases`).
    pub fn leases(&self, mac: &str) -> Result<Vec<String>> {
        let out = self.virsh(&["net-dhcp-leases", &self.network, "--mac", mac])?;
        // Expiry-date  expiry-time  MAC  Protocol  IP/prefix  Hostname  Client-ID
        Ok(out
            .lines()
            .filter_map(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                (cols.len() >= 5 && cols[2].eq_ignore_ascii_case(mac)).then(|| cols[4].split('/').next().unwrap_or("").to_string())
            })
            .collect())
    }

    /// The MAC address of the domain's first interface (`virsh domiflist`).
    pub fn mac(&self, domain: &str) -> Result<String> {
        let out = self.virsh(&["domiflist", domain])?;
        out.lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .find(|m| m.contains(':'))
            .map(String::from)
            .with_context(|| format!("no interface in virsh domiflist {domain}: {out}"))
    }

    /// What the guest printed on its serial console so far (libvirt's log of it).
    /// Wait (polling its serial log, bounded) until domain `domain` printed `text`; the log
    /// in the error when it did not.
    pub async fn await_serial(&self, domain: &str, text: &str, secs: u64) -> Result<()> {
        wait_for(&format!("{domain} printing {text:?}"), Duration::from_secs(secs), || Ok(self.serial_log(domain).contains(text).then_some(())))
            .await
            .map_err(|e| anyhow::anyhow!("{e}; its serial log:\n{}", self.serial_log(domain)))
    }

    pub fn serial_log(&self, domain: &str) -> String {
        std::fs::read(format!("/var/log/libvirt/qemu/{domain}.serial.log"))
            .map(|b| String::from_utf8_lossy(&b).replace('\r', ""))
            .unwrap_or_default()
    }

    /// A file of the domain's NoCloud seed (the FAT volume `<domain>_cidata.img` in the test
    /// pool), read back from libvirt: downloaded with `virsh vol-download`, read with mtools.
    pub fn seed_file(&self, domain: &str, file: &str) -> Result<String> {
        let dir = tempfile::tempdir()?;
        let image = dir.path().join("seed.img");
        let image_path = image.display().to_string();
        self.virsh(&["vol-download", "--pool", &self.pool, &format!("{domain}_cidata.img"), &image_path])?;
        let out = Command::new("timeout").args(["60", "mcopy", "-n", "-i", &image_path, &format!("::{file}"), "-"]).output().context("running mcopy (Debian mtools)")?;
        if !out.status.success() {
            bail!("mcopy ::{file} from the seed of {domain}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The domain's snapshots (`virsh snapshot-list --name`), and the current one.
    pub fn snapshots(&self, domain: &str) -> Result<(Vec<String>, Option<String>)> {
        let list = self.virsh(&["snapshot-list", domain, "--name"])?;
        let mut names: Vec<String> = list.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
        names.sort();
        let current = self.virsh(&["snapshot-current", domain, "--name"]).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
        Ok((names, current))
    }

    /// `len` bytes at `offset` of the domain's volume `volume` as its guest sees them (the
    /// qcow2's present state, not its snapshots), read with `qemu-img dd` from the volume's
    /// path; `-U`: also while the domain runs.
    pub fn read_volume(&self, volume: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        self.read_volume_in(&self.pool, volume, offset, len)
    }

    /// [`read_volume`](Self::read_volume) of a volume of `pool`.
    pub fn read_volume_in(&self, pool: &str, volume: &str, offset: u64, len: usize) -> Result<Vec<u8>> {
        let path = self.virsh(&["vol-path", "--pool", pool, volume])?.trim().to_string();
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("slice.raw");
        let block = 4096u64;
        // qemu-img dd's `count` is where the input ends (in blocks), not how many it copies.
        let (skip, count) = (offset / block, (offset + len as u64).div_ceil(block));
        let run = Command::new("timeout")
            .args(["60", "qemu-img", "dd", "-U", "-f", "qcow2", "-O", "raw", &format!("bs={block}"), &format!("skip={skip}"), &format!("count={count}")])
            .arg(format!("if={path}"))
            .arg(format!("of={}", out.display()))
            .output()
            .context("running qemu-img dd")?;
        // qemu-img dd may say what went wrong and still exit 0.
        if !run.status.success() || !run.stderr.is_empty() {
            bail!("qemu-img dd of {path}: {}", String::from_utf8_lossy(&run.stderr).trim());
        }
        let bytes = std::fs::read(&out)?;
        let start = (offset % block) as usize;
        Ok(bytes.get(start..start + len).unwrap_or_default().to_vec())
    }

    /// A second dir storage pool `name` (a move's other end), removed with its volumes when
    /// the guard drops.
    pub fn add_pool(&'static self, name: &str) -> Result<ExtraPool> {
        let dir = std::env::temp_dir().join(format!("banlieue-pool-{name}"));
        std::fs::create_dir_all(&dir)?;
        let _ = self.virsh(&["pool-destroy", name]);
        let _ = self.virsh(&["pool-undefine", name]);
        self.virsh(&["pool-define-as", name, "dir", "--target", &dir.display().to_string()])?;
        self.virsh(&["pool-start", name])?;
        Ok(ExtraPool { lv: self, name: name.to_string(), dir })
    }

    /// The volumes of `pool` whose name starts with `prefix`.
    pub fn volumes_in(&self, pool: &str, prefix: &str) -> Result<Vec<String>> {
        let list = self.virsh(&["vol-list", pool])?;
        let mut names: Vec<String> = list.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.starts_with(prefix)).map(String::from).collect();
        names.sort();
        Ok(names)
    }

    /// Remove a domain and the pool's volumes starting with `prefix` (cleanup after a failed test).
    pub fn remove(&self, domain: &str, prefix: &str) {
        let _ = self.virsh(&["destroy", domain]);
        let _ = self.virsh(&["undefine", domain, "--nvram"]);
        for v in self.volumes(prefix).unwrap_or_default() {
            let _ = self.virsh(&["vol-delete", "--pool", &self.pool, &v]);
        }
        let _ = std::fs::remove_file(format!("/var/log/libvirt/qemu/{domain}.serial.log"));
    }
}

/// Removes a test's domains whose names start with `prefix` (with their volumes), and its
/// volumes starting with each of `volumes`, from libvirtd when dropped: a test that fails
/// half-way leaves nothing on the libvirtd every test of the run shares.
pub struct Leftovers {
    pub lv: &'static Libvirtd,
    pub prefix: String,
    pub volumes: Vec<String>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for d in self.lv.domains(&self.prefix).unwrap_or_default() {
            self.lv.remove(&d, &format!("{d}_"));
        }
        for prefix in &self.volumes {
            for v in self.lv.volumes(prefix).unwrap_or_default() {
                let _ = self.lv.virsh(&["vol-delete", "--pool", &self.lv.pool, &v]);
            }
        }
    }
}

/// Poll `check` (a query of the backend) every 250 ms until it returns `Some`, for at most `timeout`.
pub async fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    wait_for_async(what, timeout, || std::future::ready(check())).await
}

/// [`wait_for`] with an asynchronous check.
pub async fn wait_for_async<T, F>(what: &str, timeout: Duration, mut check: impl FnMut() -> F) -> Result<T>
where
    F: std::future::Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_error = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if start.elapsed() > timeout {
            bail!("{what}: not within {timeout:?}{}", last_error.map(|e| format!(" (last error: {e:#})")).unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// libvirtd's own account of domain lifecycle events (`virsh event --all --loop
/// --timestamp`), subscribed for as long as this lives.
pub struct EventLog {
    rx: tokio::sync::mpsc::UnboundedReceiver<String>,
    _virsh: tokio::process::Child,
    /// Per domain: when libvirtd reported it Defined and Started (first of each).
    seen: std::collections::BTreeMap<String, (Option<String>, Option<String>)>,
    /// Per domain: how many times libvirtd reported it Defined (a redefinition counts).
    defined: std::collections::BTreeMap<String, usize>,
    flushes: usize,
}

/// One domain's create as libvirtd saw it: from Defined to Started.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct CreateSpan {
    pub defined: String,
    pub started: String,
    pub domain: String,
}

impl EventLog {
    /// Subscribe, and return once the subscription is live: a sentinel domain (named with
    /// `scratch`'s file name) is defined and undefined until its event comes through.
    pub async fn subscribe(lv: &Libvirtd, scratch: &Path, sentinel: &str) -> Result<EventLog> {
        let mut virsh = tokio::process::Command::new("virsh")
            .args(["-c", &lv.uri, "event", "--all", "--loop", "--timestamp"])
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("running virsh event")?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let stdout = virsh.stdout.take().context("virsh stdout")?;
        tokio::spawn(async move {
            use tokio::io::AsyncBufReadExt;
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(line);
            }
        });
        let mut log = EventLog { rx, _virsh: virsh, seen: Default::default(), defined: Default::default(), flushes: 0 };
        log.flush(lv, scratch, sentinel).await?;
        Ok(log)
    }

    /// Read every event libvirtd has sent so far: a sentinel domain (named `sentinel`, its
    /// XML in `scratch`) is defined and undefined until its own event comes through.
    pub async fn flush(&mut self, lv: &Libvirtd, scratch: &Path, sentinel: &str) -> Result<()> {
        // A new name each time: a late event of an earlier flush's sentinel must not end this one.
        self.flushes += 1;
        let sentinel = &format!("{sentinel}-{}", self.flushes);
        let xml = scratch.join(format!("{sentinel}.xml"));
        std::fs::write(&xml, format!("<domain type='qemu'><name>{sentinel}</name><memory unit='MiB'>16</memory><os><type arch='x86_64'>hvm</type></os></domain>"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let _ = lv.virsh(&["define", &xml.to_string_lossy()]);
            let _ = lv.virsh(&["undefine", sentinel]);
            // One round trip later the event is there, or the subscription was not live yet.
            while let Ok(Some(line)) = tokio::time::timeout(Duration::from_secs(2), self.rx.recv()).await {
                if line.contains(&format!("'{sentinel}'")) {
                    return Ok(());
                }
                self.record(&line);
            }
            if Instant::now() > deadline {
                bail!("virsh event showed nothing of the sentinel domain {sentinel} within 30s");
            }
        }
    }

    /// How many times each domain named `prefix…` was reported Defined (read up to the last
    /// [`flush`](Self::flush) or [`creates`](Self::creates)).
    pub fn defines(&self, prefix: &str) -> std::collections::BTreeMap<String, usize> {
        self.defined.iter().filter(|(d, _)| d.starts_with(prefix)).map(|(d, n)| (d.clone(), *n)).collect()
    }

    fn record(&mut self, line: &str) {
        // "<date> <time>+0000: event 'lifecycle' for domain '<name>': Started Booted"
        let (Some((ts, rest)), Some(domain)) = (line.split_once(": event"), line.split("for domain '").nth(1).and_then(|r| r.split('\'').next())) else {
            return;
        };
        let entry = self.seen.entry(domain.to_string()).or_default();
        let what = rest.rsplit("': ").next().unwrap_or_default();
        if what.starts_with("Defined") {
            *self.defined.entry(domain.to_string()).or_default() += 1;
            if entry.0.is_none() {
                entry.0 = Some(ts.to_string());
            }
        } else if what.starts_with("Started") && entry.1.is_none() {
            entry.1 = Some(ts.to_string());
        }
    }

    /// Wait (at most `timeout`) until `count` domains named `prefix…` were seen defined and
    /// started; their spans, earliest first.
    pub async fn creates(&mut self, prefix: &str, count: usize, timeout: Duration) -> Result<Vec<CreateSpan>> {
        let done = |seen: &std::collections::BTreeMap<String, (Option<String>, Option<String>)>| {
            seen.iter().filter(|(d, (def, st))| d.starts_with(prefix) && def.is_some() && st.is_some()).count() >= count
        };
        let deadline = tokio::time::Instant::now() + timeout;
        while !done(&self.seen) {
            let line = match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(line)) => line,
                _ => bail!("libvirtd reported {} of {count} creates of {prefix}… within {timeout:?}: {:?}", self.seen.len(), self.seen),
            };
            self.record(&line);
        }
        // (Timestamps of one format and zone sort as text.)
        let mut spans: Vec<CreateSpan> = self
            .seen
            .iter()
            .filter(|(d, _)| d.starts_with(prefix))
            .filter_map(|(d, (def, st))| Some(CreateSpan { defined: def.clone()?, started: st.clone()?, domain: d.clone() }))
            .collect();
        spans.sort();
        Ok(spans)
    }
}

/// The most creates libvirtd had under way at once (spans overlapping in time).
pub fn peak_concurrent(spans: &[CreateSpan]) -> usize {
    let mut edges: Vec<(&str, i32)> = spans.iter().flat_map(|s| [(s.defined.as_str(), 1), (s.started.as_str(), -1)]).collect();
    // At one instant, an end before a start: back-to-back creates do not overlap.
    edges.sort_by(|a, b| a.0.cmp(b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, delta) in edges {
        now += delta;
        peak = peak.max(now);
    }
    peak as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(d: &str, defined: &str, started: &str) -> CreateSpan {
        CreateSpan { defined: defined.into(), started: started.into(), domain: d.into() }
    }

    #[test]
    fn back_to_back_creates_do_not_overlap_and_interleaved_ones_do() {
        let serial = [span("a", "12:00:00.100", "12:00:00.300"), span("b", "12:00:00.300", "12:00:00.500")];
        assert_eq!(peak_concurrent(&serial), 1);
        let two = [span("a", "12:00:00.100", "12:00:00.400"), span("b", "12:00:00.200", "12:00:00.500"), span("c", "12:00:00.450", "12:00:00.600")];
        assert_eq!(peak_concurrent(&two), 2);
        assert_eq!(peak_concurrent(&[]), 0);
    }
}

/// A storage pool a test added ([`Libvirtd::add_pool`]): gone, volumes and directory, on drop.
pub struct ExtraPool {
    lv: &'static Libvirtd,
    pub name: String,
    dir: PathBuf,
}

impl Drop for ExtraPool {
    fn drop(&mut self) {
        for v in self.lv.volumes_in(&self.name, "").unwrap_or_default() {
            let _ = self.lv.virsh(&["vol-delete", "--pool", &self.name, &v]);
        }
        let _ = self.lv.virsh(&["pool-destroy", &self.name]);
        let _ = self.lv.virsh(&["pool-undefine", &self.name]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
