//! What the provider contract asks of a driver, run against its live backend. Each behaviour
//! is one outcome; the machines it makes are deleted before the run ends, and a behaviour
//! that cannot run because an earlier one failed says so.
//!
//! Checked through the driver's own answers (`describe`, `list-machines`) and through the
//! host's view of the calls ([`Observer`]): how many backend calls changed something, what a
//! choke point refused, how many sessions were stored.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_runtime::capability::observer::Observer;
use banlieue_runtime::capability::session::SessionStore;
use banlieue_runtime::capability::Grants;
use banlieue_runtime::provider::{
    ConsoleKind, Disk, Firmware, ImageSource, Machine, MachineRef, MachineStatus, Nic, PowerOff, PowerOffMode, PowerState, ProviderConfig, ProviderDriver, SnapshotRequest, UserDataFormat,
};
use banlieue_runtime::{CallError, Feature, GuestError, Limits, Runtime};

use crate::manifest::{Backend, Credentials, Imports};
use crate::report::{Outcome, Report, Status};

/// Every behaviour: its name, whether the contract requires it, and why it matters.
pub const BEHAVIOURS: &[(&str, bool, &str)] = &[
    ("probe", true, "the Provider's failure domains and capacity come from it; placement decides on nothing else"),
    ("create", true, "a machine is made with the spec it was given and reported running, with an ID the host keeps"),
    ("describe", true, "the host learns what the backend holds only through describe; it must find what create made"),
    ("create-idempotent", true, "the host retries create whenever it is unsure; a second create with one UID must return the same machine, never a second one"),
    ("power-off-hard", true, "powerOffMode Hard pulls the plug at once"),
    ("power-off-soft", true, "powerOffMode Soft asks the guest and never forces it; the host retries while the guest takes its time"),
    ("power-off-try-soft", true, "powerOffMode TrySoft asks, then forces: the machine is off either way"),
    ("power-on", true, "a stopped machine comes back with the same identity"),
    ("restart", true, "a restart is a power-off then a power-on of the same machine"),
    ("delete", true, "deleting the Machine must remove the backend machine, or it leaks"),
    ("delete-again", true, "the host retries delete after a crash; deleting what is gone must succeed"),
    ("describe-after-delete", true, "not-found is how the host knows a machine is gone (and may make it again); anything else keeps it waiting"),
    ("create-after-crash", true, "the host can die between the backend's answer and writing it down; create again with the UID must adopt what was half made, never duplicate it"),
    ("invalid-spec", true, "a spec the backend can never satisfy must be refused as invalid-spec (not retried forever, not half made)"),
    ("wrong-credentials", true, "refused credentials must be denied, so the Provider says so instead of retrying as if the backend were down"),
    ("backend-down", true, "a backend that does not answer must be unavailable, quickly: the host retries it and never hangs"),
    ("session-reuse", true, "a driver logs in once and reuses the session the host keeps; logging in on every call overloads a vCenter"),
    ("within-limits", true, "every answer within the host's limits (sizes, counts, CPU, memory), or the host refuses it"),
    ("within-grant", true, "a driver reaches only its Provider's endpoint, URI and keys; the host refuses the rest"),
    ("snapshots", false, "snapshot-create, -list and -delete on a machine, when the driver offers snapshots"),
    ("console", false, "where the serial console is, when the driver offers it"),
    ("vnc", false, "where the graphical display is, when the driver offers it"),
    ("list-machines", false, "what the backend holds, for adoption, when the driver offers it"),
    ("disk-export", false, "a machine's disks carried away, when the driver offers it (not exercised here)"),
    ("disk-import", false, "a machine made from carried disks, when the driver offers it (not exercised here)"),
];

/// How the run makes its machines.
#[derive(Clone, Debug)]
pub struct Options {
    /// The boot image.
    pub image: ImageSource,
    /// Where (default: the first failure domain the probe reports).
    pub failure_domain: Option<String>,
    /// Which of the Provider's storage and network classes (default: the first of each).
    pub storage_class: Option<String>,
    pub network_class: Option<String>,
    pub disk_gib: u64,
    /// How long one driver call may take.
    pub call_timeout: Duration,
    /// How long a guest is given to honour a soft power-off (asked again as the host would).
    pub soft_off_timeout: Duration,
    /// At most this many crash points (each makes and deletes a machine).
    pub crash_points: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            image: ImageSource::Template(String::new()),
            failure_domain: None,
            storage_class: None,
            network_class: None,
            disk_gib: 4,
            call_timeout: Duration::from_secs(120),
            soft_off_timeout: Duration::from_secs(120),
            crash_points: 3,
        }
    }
}

/// `template:NAME`, `backing-file:PATH`.
pub fn image(s: &str) -> Result<ImageSource, String> {
    match s.split_once(':') {
        Some(("template", name)) if !name.is_empty() => Ok(ImageSource::Template(name.into())),
        Some(("backing-file", path)) if !path.is_empty() => Ok(ImageSource::BackingFile(path.into())),
        _ => Err(format!("{s:?}: an image is template:NAME or backing-file:PATH")),
    }
}

/// How long a backend that does not answer may take to be said so.
const DOWN_WITHIN: Duration = Duration::from_secs(30);
/// The host's default limits for one call.
fn limits() -> Limits {
    Limits::default()
}

/// Run every behaviour of `driver` against `backend`.
pub async fn run(rt: &Runtime, driver: &ProviderDriver, backend: &Backend, opts: &Options) -> Report {
    let started = Instant::now();
    let imports = Imports::of(&rt.imports(&driver.component));
    let mut run = Run {
        driver,
        backend,
        imports,
        config: backend.config(),
        grants: Grants::default(),
        observer: Observer::new(),
        sessions: SessionStore::new(),
        libvirt: banlieue_libvirt::Connections::new(),
        opts,
        outcomes: Vec::new(),
        beyond_limits: Vec::new(),
    };
    run.all().await;
    Report {
        driver: String::new(),
        digest: driver.component.digest.clone(),
        contract: driver.component.contract_version.to_string(),
        endpoint: backend.provider.spec.connection.endpoint.clone(),
        outcomes: run.outcomes,
        seconds: started.elapsed().as_secs_f64(),
    }
}

struct Run<'a> {
    driver: &'a ProviderDriver,
    backend: &'a Backend,
    imports: Imports,
    config: ProviderConfig,
    grants: Grants,
    observer: Arc<Observer>,
    sessions: Arc<SessionStore>,
    libvirt: banlieue_libvirt::Connections,
    opts: &'a Options,
    outcomes: Vec<Outcome>,
    /// Answers the host refused and limits calls hit, over the whole run.
    beyond_limits: Vec<String>,
}

/// A behaviour's verdict: passed (what was seen) or failed (what was seen instead).
type Verdict = Result<String, String>;

impl Run<'_> {
    async fn all(&mut self) {
        match self.backend.grants(self.imports, None, Credentials::AsWritten, &self.sessions, &self.observer, &self.libvirt).await {
            Ok(g) => self.grants = g,
            Err(e) => return self.record("probe", Instant::now(), Err(format!("the host could not grant the backend: {e}; nothing else was run"))),
        }
        let t = Instant::now();
        let domain = match self.probe().await {
            Ok((domain, seen)) => {
                self.record("probe", t, Ok(seen));
                domain
            }
            Err(e) => return self.record("probe", t, Err(format!("{e}; nothing else was run"))),
        };
        let features = self.features().await;
        let changes_before = self.observer.changes();
        let m = self.machine(&domain);
        let t = Instant::now();
        let created = self.create(&m).await;
        let changes_of_create = self.observer.changes() - changes_before;
        match created {
            Ok(st) => {
                self.record("create", t, Ok(format!("{} running, {changes_of_create} changing backend calls", st.provider_id)));
                let r = machine_ref(&m, Some(st.provider_id.clone()));
                self.lifecycle(&m, &r, &st, &features).await;
            }
            Err(e) => {
                self.record("create", t, Err(e));
                for b in ["describe", "create-idempotent", "power-off-hard", "power-off-soft", "power-off-try-soft", "power-on", "restart", "delete", "delete-again", "describe-after-delete"] {
                    self.record(b, Instant::now(), Err("not run: create failed".into()));
                }
            }
        }
        self.crash_points(&domain, changes_of_create, &features).await;
        self.invalid_spec(&domain).await;
        self.wrong_credentials().await;
        self.backend_down().await;
        self.optional_listed(&features);
        self.record_session_reuse();
        let t = Instant::now();
        let beyond = std::mem::take(&mut self.beyond_limits);
        self.record("within-limits", t, if beyond.is_empty() { Ok("every answer within the host's limits".into()) } else { Err(beyond.join("; ")) });
        let refused = self.observer.refusals();
        self.record("within-grant", t, if refused.is_empty() { Ok(format!("{} backend calls, none refused", self.observer.calls())) } else { Err(format!("the host refused: {}", refused.join("; "))) });
    }

    /// create → describe → create again → the power modes → restart → optional calls →
    /// delete, delete again, describe after.
    async fn lifecycle(&mut self, m: &Machine, r: &MachineRef, created: &MachineStatus, features: &[Feature]) {
        let t = Instant::now();
        let v = match self.describe(r).await {
            Ok(st) if st.provider_id != created.provider_id => Err(format!("describe says {:?}; create said {:?}", st.provider_id, created.provider_id)),
            Ok(st) if st.power_state != PowerState::PoweredOn => Err(format!("made powered on, described {:?}", st.power_state)),
            Ok(st) => Ok(format!("{} {:?}", st.provider_id, st.power_state)),
            Err(e) => Err(e),
        };
        self.record("describe", t, v);

        let t = Instant::now();
        let v = match self.create(m).await {
            Ok(st) if st.provider_id != created.provider_id => Err(format!("a second create made {:?} beside {:?}", st.provider_id, created.provider_id)),
            Ok(_) => self.exactly_one(m, features).await,
            Err(e) => Err(format!("a second create with one UID failed: {e}")),
        };
        self.record("create-idempotent", t, v);

        self.power_off("power-off-hard", r, PowerOffMode::Hard).await;
        self.power_on("power-on", r).await;
        self.power_off("power-off-try-soft", r, PowerOffMode::TrySoft).await;
        self.power_on("power-on", r).await;
        self.power_off("power-off-soft", r, PowerOffMode::Soft).await;
        let t = Instant::now();
        let v = match self.set_power(r, PowerState::PoweredOff, PowerOffMode::TrySoft).await {
            Ok(_) => self.set_power(r, PowerState::PoweredOn, PowerOffMode::TrySoft).await.and_then(|st| on(&st)),
            Err(e) => Err(format!("the power-off of the restart: {e}")),
        };
        self.record("restart", t, v);

        self.snapshots(r, features).await;
        self.console(r, features, Feature::Console, "console", ConsoleKind::Serial).await;
        self.console(r, features, Feature::Vnc, "vnc", ConsoleKind::Vnc).await;

        let t = Instant::now();
        let v = self.delete(r).await.map(|()| "deleted".to_string());
        self.record("delete", t, v);
        let t = Instant::now();
        let v = self.delete(r).await.map(|()| "deleting what is gone succeeded".to_string()).map_err(|e| format!("want ok, got {e}"));
        self.record("delete-again", t, v);
        let t = Instant::now();
        let v = self.gone(r).await;
        self.record("describe-after-delete", t, v);
    }

    async fn probe(&mut self) -> Result<(String, String), String> {
        let inv = timed(self.opts.call_timeout, self.driver.probe(&self.config, limits(), self.grants.clone())).await;
        let inv = self.seen(inv)?;
        let names: Vec<&str> = inv.failure_domains.iter().map(|d| d.name.as_str()).collect();
        if names.is_empty() {
            return Err("no failure domain: nothing could be placed on this Provider".into());
        }
        if let Some(d) = inv.failure_domains.iter().find(|d| d.capacity.cpus == 0 || d.capacity.memory_mib == 0) {
            return Err(format!("failure domain {:?} reports no CPUs or no memory", d.name));
        }
        let domain = match &self.opts.failure_domain {
            Some(want) if names.contains(&want.as_str()) => want.clone(),
            Some(want) => return Err(format!("--failure-domain {want:?} is not one the probe reports ({})", names.join(", "))),
            None => names[0].to_string(),
        };
        Ok((domain, format!("{} failure domain(s): {}; backend {}", names.len(), names.join(", "), inv.backend_version.as_deref().unwrap_or("version not said"))))
    }

    async fn features(&mut self) -> Vec<Feature> {
        let r = timed(self.opts.call_timeout, self.driver.features(limits(), self.grants.clone())).await;
        self.seen(r).unwrap_or_default()
    }

    /// Exactly one backend machine for `m`'s UID: through `list-machines` when offered, else
    /// `describe` finds it.
    async fn exactly_one(&mut self, m: &Machine, features: &[Feature]) -> Verdict {
        if !features.contains(&Feature::Adopt) {
            return self.describe(&machine_ref(m, None)).await.map(|st| format!("the same machine ({}); list-machines not offered, so counted by describe", st.provider_id));
        }
        let mut page = None;
        let mut found = 0;
        loop {
            let r = timed(self.opts.call_timeout, self.driver.list_machines(&self.config, page.as_deref(), limits(), self.grants.clone())).await;
            let p = self.seen(r)?;
            found += p.machines.iter().filter(|f| f.owner.as_ref().is_some_and(|o| o.machine_uid == m.uid)).count();
            match p.next {
                Some(next) => page = Some(next),
                None => break,
            }
        }
        match found {
            1 => Ok("the same machine; list-machines shows one for the UID".into()),
            n => Err(format!("list-machines shows {n} machines for UID {}", m.uid)),
        }
    }

    async fn power_off(&mut self, behaviour: &'static str, r: &MachineRef, mode: PowerOffMode) {
        let t = Instant::now();
        let v = match mode {
            // Soft is never forced: `unavailable` means "not yet", asked again as the host does.
            PowerOffMode::Soft => {
                let deadline = Instant::now() + self.opts.soft_off_timeout;
                loop {
                    match self.set_power(r, PowerState::PoweredOff, mode).await {
                        // A driver that says so at once is asked again after a pause, not hammered.
                        Err(e) if e.starts_with("unavailable") && Instant::now() < deadline => tokio::time::sleep(Duration::from_secs(1)).await,
                        Err(e) if e.starts_with("unavailable") => break Err(format!("not off within {:?} of asking: {e} (a guest without an ACPI handler or guest tools never is)", self.opts.soft_off_timeout)),
                        other => break other.and_then(|st| off(&st)),
                    }
                }
            }
            _ => self.set_power(r, PowerState::PoweredOff, mode).await.and_then(|st| off(&st)),
        };
        let v = match v {
            Ok(seen) => self.describe(r).await.and_then(|st| off(&st)).map(|_| seen),
            e => e,
        };
        self.record(behaviour, t, v);
    }

    async fn power_on(&mut self, behaviour: &'static str, r: &MachineRef) {
        let t = Instant::now();
        let v = self.set_power(r, PowerState::PoweredOn, PowerOffMode::Hard).await.and_then(|st| on(&st));
        let v = match v {
            Ok(seen) => self.describe(r).await.and_then(|st| on(&st)).map(|_| seen),
            e => e,
        };
        self.record(behaviour, t, v);
    }

    async fn snapshots(&mut self, r: &MachineRef, features: &[Feature]) {
        let t = Instant::now();
        if !features.contains(&Feature::Snapshots) {
            return self.optional("snapshots", t, None);
        }
        let request = SnapshotRequest { name: "conformance".into(), description: "banlieue provider conformance".into(), memory: false, quiesce: false };
        let made = timed(self.opts.call_timeout, self.driver.snapshot_create(&self.config, r, &request, limits(), self.grants.clone())).await;
        let v = match self.seen(made) {
            Ok(s) => {
                let listed = timed(self.opts.call_timeout, self.driver.snapshot_list(&self.config, r, limits(), self.grants.clone())).await;
                let listed = self.seen(listed);
                let deleted = timed(self.opts.call_timeout, self.driver.snapshot_delete(&self.config, r, &s.id, limits(), self.grants.clone())).await;
                match (listed, self.seen(deleted)) {
                    (Ok(l), Ok(())) if l.iter().any(|x| x.id == s.id) => Ok(format!("snapshot {} made, listed, deleted", s.id)),
                    (Ok(_), Ok(())) => Err(format!("snapshot {} was made but snapshot-list does not show it", s.id)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        self.optional("snapshots", t, Some(v));
    }

    async fn console(&mut self, r: &MachineRef, features: &[Feature], feature: Feature, behaviour: &'static str, kind: ConsoleKind) {
        let t = Instant::now();
        if !features.contains(&feature) {
            return self.optional(behaviour, t, None);
        }
        let access = timed(self.opts.call_timeout, self.driver.console(&self.config, r, kind, limits(), self.grants.clone())).await;
        let v = self.seen(access).map(|a| format!("{}", describe_access(&a)));
        self.optional(behaviour, t, Some(v));
    }

    /// Abandon create at its 1st, middle and last changing backend call (as if the host
    /// died as the backend answered), then create again: one machine, described, deleted.
    async fn crash_points(&mut self, domain: &str, changes: usize, features: &[Feature]) {
        let t = Instant::now();
        if changes == 0 {
            return self.record("create-after-crash", t, Err("create made no changing backend call to crash after (did it create anything?)".into()));
        }
        let mut points = vec![1, changes.div_ceil(2), changes];
        points.dedup();
        points.truncate(self.opts.crash_points.max(1));
        let mut seen = Vec::new();
        for k in points {
            let m = self.machine(domain);
            self.observer.arm_crash(k);
            let crashed = tokio::select! {
                r = timed(self.opts.call_timeout, self.driver.create(&self.config, &m, limits(), self.grants.clone())) => { r.ok(); false }
                () = self.observer.crashed() => true,
            };
            self.observer.disarm();
            let again = self.create(&m).await;
            let v = match again {
                Ok(st) => match self.exactly_one(&m, features).await {
                    Ok(_) => Ok(st),
                    Err(e) => Err(e),
                },
                Err(e) => Err(format!("create after a crash at changing call {k} of {changes} failed: {e}")),
            };
            let cleaned = self.delete(&machine_ref(&m, v.as_ref().ok().map(|st| st.provider_id.clone()))).await;
            match (v, cleaned) {
                (Ok(_), Ok(())) => seen.push(format!("{k}{}", if crashed { "" } else { " (create finished first)" })),
                (Err(e), _) => return self.record("create-after-crash", t, Err(e)),
                (_, Err(e)) => return self.record("create-after-crash", t, Err(format!("deleting the machine made after a crash at call {k}: {e}"))),
            }
        }
        self.record("create-after-crash", t, Ok(format!("crashed after changing call {} of {changes}; one machine each time", seen.join(", "))));
    }

    /// Two specs no backend can satisfy: no CPU at all, and a disk on storage that is not there.
    async fn invalid_spec(&mut self, domain: &str) {
        let t = Instant::now();
        let mut no_cpu = self.machine(domain);
        no_cpu.cpus = 0;
        let mut nowhere = self.machine(domain);
        nowhere.disks[0].target = "banlieue-conformance-no-such-storage".into();
        let mut seen = Vec::new();
        for (what, m) in [("0 CPUs", no_cpu), ("a disk on storage that does not exist", nowhere)] {
            match self.create(&m).await {
                Err(e) if e.starts_with("invalid-spec") => seen.push(format!("{what}: {e}")),
                Err(e) => return self.record("invalid-spec", t, Err(format!("{what}: want invalid-spec, got {e}"))),
                Ok(st) => {
                    let _ = self.delete(&machine_ref(&m, Some(st.provider_id.clone()))).await;
                    return self.record("invalid-spec", t, Err(format!("{what}: accepted (made {})", st.provider_id)));
                }
            }
        }
        self.record("invalid-spec", t, Ok(seen.join("; ")));
    }

    async fn wrong_credentials(&mut self) {
        let t = Instant::now();
        if !self.imports.secrets || self.backend.credentials.is_empty() {
            return self.not_applicable("wrong-credentials", t, "the driver reads no credentials (or the Provider names none)");
        }
        let (sessions, observer) = (SessionStore::new(), Observer::new());
        let v = match self.backend.grants(self.imports, None, Credentials::Wrong, &sessions, &observer, &self.libvirt).await {
            Err(e) => Err(format!("the host could not grant the backend: {e}")),
            Ok(g) => match timed(self.opts.call_timeout, self.driver.probe(&self.config, limits(), g)).await {
                Err(CallError::Guest(GuestError::Denied(m))) => Ok(format!("denied: {m}")),
                Err(e) => Err(format!("want denied, got {}", kind(&e))),
                Ok(_) => Err("probe succeeded with every credential wrong".into()),
            },
        };
        self.record("wrong-credentials", t, v);
    }

    /// The Provider's endpoint on a port nothing listens on.
    async fn backend_down(&mut self) {
        let t = Instant::now();
        if !self.imports.http {
            return self.not_applicable("backend-down", t, "the driver speaks no HTTP; the host opens libvirt connections itself and a URI that does not answer is refused before the driver runs");
        }
        let endpoint = match dead_endpoint(&self.backend.provider.spec.connection.endpoint) {
            Ok(e) => e,
            Err(e) => return self.record("backend-down", t, Err(e)),
        };
        let (sessions, observer) = (SessionStore::new(), Observer::new());
        let v = match self.backend.grants(self.imports, Some(&endpoint), Credentials::AsWritten, &sessions, &observer, &self.libvirt).await {
            Err(e) => Err(format!("the host could not grant {endpoint}: {e}")),
            Ok(g) => match tokio::time::timeout(DOWN_WITHIN, self.driver.probe(&ProviderConfig { endpoint: endpoint.clone(), ..self.config.clone() }, limits(), g)).await {
                Err(_) => Err(format!("no answer within {DOWN_WITHIN:?}: a hang")),
                Ok(Err(CallError::Guest(GuestError::Unavailable(m)))) => Ok(format!("unavailable in {:.2}s: {m}", t.elapsed().as_secs_f64())),
                Ok(Err(e)) => Err(format!("want unavailable, got {}", kind(&e))),
                Ok(Ok(_)) => Err(format!("probe succeeded against {endpoint}, where nothing listens")),
            },
        };
        self.record("backend-down", t, v);
    }

    fn record_session_reuse(&mut self) {
        let t = Instant::now();
        if !self.imports.session {
            return self.not_applicable("session-reuse", t, "the driver keeps no backend session");
        }
        let (logins, calls) = (self.observer.logins(), self.observer.calls());
        let v = match logins {
            0 => Err(format!("no session stored over {calls} backend calls: the driver imports session but never uses it")),
            1 => Ok(format!("1 login over {calls} backend calls")),
            n => Err(format!("{n} logins over {calls} backend calls (one, reused, is expected)")),
        };
        self.record("session-reuse", t, v);
    }

    /// Optional features only listed (not exercised here).
    fn optional_listed(&mut self, features: &[Feature]) {
        for (feature, name) in [(Feature::Adopt, "list-machines"), (Feature::DiskExport, "disk-export"), (Feature::DiskImport, "disk-import")] {
            let t = Instant::now();
            let v = features.contains(&feature).then(|| Ok("offered".to_string()));
            self.optional(name, t, v);
        }
    }

    // — one driver call each, bounded, with what the host refused noted —

    async fn create(&mut self, m: &Machine) -> Result<MachineStatus, String> {
        let r = timed(self.opts.call_timeout, self.driver.create(&self.config, m, limits(), self.grants.clone())).await;
        self.seen(r)
    }

    async fn describe(&mut self, r: &MachineRef) -> Result<MachineStatus, String> {
        let st = timed(self.opts.call_timeout, self.driver.describe(&self.config, r, limits(), self.grants.clone())).await;
        self.seen(st)
    }

    async fn set_power(&mut self, r: &MachineRef, state: PowerState, mode: PowerOffMode) -> Result<MachineStatus, String> {
        let timeout_ms = if mode == PowerOffMode::Soft { 10_000 } else { 30_000 };
        let off = PowerOff { mode, timeout_ms };
        let st = timed(self.opts.call_timeout, self.driver.set_power(&self.config, r, state, off, limits(), self.grants.clone())).await;
        self.seen(st)
    }

    async fn delete(&mut self, r: &MachineRef) -> Result<(), String> {
        let off = PowerOff { mode: PowerOffMode::Hard, timeout_ms: 30_000 };
        let d = timed(self.opts.call_timeout, self.driver.delete(&self.config, r, off, limits(), self.grants.clone())).await;
        self.seen(d)
    }

    async fn gone(&mut self, r: &MachineRef) -> Verdict {
        match timed(self.opts.call_timeout, self.driver.describe(&self.config, r, limits(), self.grants.clone())).await {
            Err(CallError::Guest(GuestError::NotFound(m))) => Ok(format!("not-found: {m}")),
            Ok(st) => Err(format!("want not-found, got a machine ({}, {:?})", st.provider_id, st.power_state)),
            Err(e) => Err(format!("want not-found, got {}", kind(&e))),
        }
    }

    /// A call's result as a verdict's words; results and limits the host refused are kept.
    fn seen<T>(&mut self, r: Result<T, CallError>) -> Result<T, String> {
        r.map_err(|e| {
            if matches!(e, CallError::InvalidResult(_) | CallError::CpuBudget(_) | CallError::Memory(_) | CallError::Trap(_)) {
                self.beyond_limits.push(e.to_string());
            }
            kind(&e)
        })
    }

    fn machine(&self, domain: &str) -> Machine {
        let first = |pairs: &[(String, String)], want: &Option<String>| {
            pairs.iter().find(|(class, _)| want.as_ref().is_none_or(|w| w == class)).map(|(_, target)| target.clone()).unwrap_or_default()
        };
        let uid = uid();
        Machine {
            name: format!("conformance-{}", &uid[..8]),
            uid,
            namespace: "conformance".into(),
            cpus: 1,
            memory_mib: 512,
            firmware: Firmware::Bios,
            disks: vec![Disk { name: "root".into(), size_gib: self.opts.disk_gib, target: first(&self.config.storage_classes, &self.opts.storage_class) }],
            nics: vec![Nic { name: "eth0".into(), network: first(&self.config.network_classes, &self.opts.network_class), ip: None }],
            image: self.opts.image.clone(),
            user_data: Some("#cloud-config\n".into()),
            user_data_format: UserDataFormat::CloudConfig,
            failure_domain: domain.into(),
            power_state: PowerState::PoweredOn,
            labels: vec![],
        }
    }

    fn record(&mut self, behaviour: &'static str, started: Instant, v: Verdict) {
        let status = if v.is_ok() { Status::Passed } else { Status::Failed };
        self.push(behaviour, started, status, v.unwrap_or_else(|e| e));
    }

    fn not_applicable(&mut self, behaviour: &'static str, started: Instant, why: &str) {
        self.push(behaviour, started, Status::NotApplicable, why.into());
    }

    /// An optional behaviour: `None` when not offered; a failure of one offered is a failure.
    fn optional(&mut self, behaviour: &'static str, started: Instant, v: Option<Verdict>) {
        match v {
            None => self.push(behaviour, started, Status::Unsupported, "not offered".into()),
            Some(Ok(seen)) => self.push(behaviour, started, Status::Supported, seen),
            Some(Err(e)) => self.push(behaviour, started, Status::Failed, format!("offered, but: {e}")),
        }
    }

    fn push(&mut self, behaviour: &'static str, started: Instant, status: Status, detail: String) {
        let (_, required, why) = BEHAVIOURS.iter().find(|(b, ..)| *b == behaviour).copied().unwrap_or((behaviour, true, ""));
        // A behaviour run twice (power-on) keeps one outcome: the worst.
        if let Some(o) = self.outcomes.iter_mut().find(|o| o.behaviour == behaviour) {
            o.seconds += started.elapsed().as_secs_f64();
            if o.status != Status::Failed && status == Status::Failed {
                o.status = status;
                o.detail = detail;
            }
            return;
        }
        self.outcomes.push(Outcome { behaviour, required, status, detail, why, seconds: started.elapsed().as_secs_f64() });
    }
}

/// A call bounded by `timeout`: a driver or backend that hangs is `unavailable`, said so.
async fn timed<T>(timeout: Duration, call: impl Future<Output = Result<T, CallError>>) -> Result<T, CallError> {
    tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| Err(CallError::Guest(GuestError::Unavailable(format!("no answer within {timeout:?}")))))
}

/// An error as the contract names it, with its words.
fn kind(e: &CallError) -> String {
    match e {
        CallError::Guest(GuestError::NotFound(m)) => format!("not-found: {m}"),
        CallError::Guest(GuestError::InvalidSpec(m)) => format!("invalid-spec: {m}"),
        CallError::Guest(GuestError::Unavailable(m)) => format!("unavailable: {m}"),
        CallError::Guest(GuestError::Denied(m)) => format!("denied: {m}"),
        CallError::Guest(GuestError::Internal(m)) => format!("internal: {m}"),
        other => format!("refused by the host: {other}"),
    }
}

fn off(st: &MachineStatus) -> Verdict {
    match st.power_state {
        PowerState::PoweredOff => Ok("off".into()),
        other => Err(format!("want powered off, the driver says {other:?}")),
    }
}

fn on(st: &MachineStatus) -> Verdict {
    match st.power_state {
        PowerState::PoweredOn => Ok("on".into()),
        other => Err(format!("want powered on, the driver says {other:?}")),
    }
}

fn machine_ref(m: &Machine, provider_id: Option<String>) -> MachineRef {
    MachineRef { uid: m.uid.clone(), name: m.name.clone(), namespace: m.namespace.clone(), provider_id, failure_domain: m.failure_domain.clone(), backend_id: None }
}

fn describe_access(a: &banlieue_runtime::provider::ConsoleAccess) -> String {
    use banlieue_runtime::provider::ConsoleAccess as A;
    match a {
        A::LibvirtDomain(d) => format!("libvirt domain {d}"),
        A::Websocket(w) => format!("websocket {}", w.url.split('?').next().unwrap_or_default()),
    }
}

/// A UID as Kubernetes makes them (random, version 4).
fn uid() -> String {
    let b: [u8; 16] = rand::random();
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("{}-{}-4{}-8{}-{}", h(0..4), h(4..6), &h(6..8)[1..], &h(8..10)[1..], h(10..16))
}

/// `endpoint` with its port moved to one nothing listens on (bound, then let go).
fn dead_endpoint(endpoint: &str) -> Result<String, String> {
    let mut url = url::Url::parse(endpoint).map_err(|e| format!("the endpoint {endpoint:?} is not a URL: {e}"))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| format!("finding a free port: {e}"))?.port();
    url.set_port(Some(port)).map_err(|()| format!("the endpoint {endpoint:?} takes no port"))?;
    Ok(url.to_string().trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_look_like_kubernetes_ones() {
        let u = uid();
        assert_eq!(u.len(), 36, "{u}");
        assert_eq!(u.split('-').map(str::len).collect::<Vec<_>>(), vec![8, 4, 4, 4, 12], "{u}");
        assert_ne!(uid(), u);
    }

    #[test]
    fn images_are_named_by_kind() {
        assert!(matches!(image("template:debian-12"), Ok(ImageSource::Template(t)) if t == "debian-12"));
        assert!(matches!(image("backing-file:/var/lib/x.qcow2"), Ok(ImageSource::BackingFile(p)) if p == "/var/lib/x.qcow2"));
        assert!(image("debian-12").is_err());
        assert!(image("template:").is_err());
    }

    #[test]
    fn a_dead_endpoint_keeps_scheme_and_host() {
        let d = dead_endpoint("https://127.0.0.1:8006").unwrap();
        assert!(d.starts_with("https://127.0.0.1:") && d != "https://127.0.0.1:8006", "{d}");
        assert!(dead_endpoint("not a url").is_err());
    }

    /// The authors' guide explains every behaviour.
    #[test]
    fn every_behaviour_is_in_the_provider_authors_guide() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/provider-authors.md")).unwrap();
        for (b, ..) in BEHAVIOURS {
            assert!(doc.contains(&format!("`{b}`")), "docs/provider-authors.md does not explain `{b}`");
        }
    }
}
