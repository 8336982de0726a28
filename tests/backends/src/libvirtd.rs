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
