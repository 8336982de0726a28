//! Making a machine from another machine's disks (`spec.vm.carry`: its VM moves and keeps its
//! data). The bytes go through this process's image cache, never through a component:
//!
//! 1. **Exporting**: the source Provider's driver (`disk-export`, the source machine powered
//!    off by the VM controller) names each disk, and the host streams it into
//!    `carry/<this machine's UID>/` of the cache, hashed as it comes;
//! 2. **Converting**: each disk to the format the target takes ([`carried_format`], `qemu-img`);
//! 3. **Importing**: the target driver's `disk-import` makes the machine from them, the host
//!    streaming each where the driver says;
//! 4. then the machine is realised as any other (`create`, power).
//!
//! Each step's end is recorded in `status.carry`; a reconcile cut off resumes from the last
//! one whose files the cache still holds (another replica, or a wiped cache, exports again).
//! A failure that retrying cannot mend marks the carry `Failed` (the VM controller then gives
//! the move up and the VM stays on its source); the cache's copies are removed when the carry
//! ends either way.

use std::sync::Arc;
use std::time::Duration;

use banlieue_api::infra::{CarryStatus, InfraMachineStatus, MachineCarry};
use banlieue_api::provider::ImageFormat;
use banlieue_api::vm::{MovePhase, MovedDisk};
use banlieue_api::Provider;
use banlieue_imagebuilder::{DiskFormat, ImageCache};
use banlieue_runtime::capability::transfer::{CarriedGrant, ExportGrant, HandOut, TransferGrant};
use banlieue_runtime::provider::{self as wit, MachineRef, MachineStatus};
use banlieue_runtime::Feature;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::ResourceExt;

use super::{backend_uid, call};
use crate::Context;
use crate::failure::{api_failure, Failure};
use crate::sandbox::grants::Backend;
use crate::status::reasons::Reason;

/// How often the bytes of a disk coming in are written to `status.carry`.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// Make the machine from the disks of `from`; what the target driver's `disk-import` answered.
pub(super) async fn carry(ctx: &Context, m: &DynamicObject, resource: &ApiResource, st: &mut InfraMachineStatus, target: &Backend, from: &MachineCarry, machine: &wit::Machine) -> Result<MachineStatus, Failure> {
    if let Some(CarryStatus { phase: MovePhase::Failed, message, reason, .. }) = &st.carry {
        let reason = reason.as_deref().and_then(Reason::parse).unwrap_or(Reason::MoveFailed);
        return Err(Failure::until_changed(reason, message.clone().unwrap_or_default()));
    }
    let cache = ctx.images.clone().ok_or_else(|| {
        Failure::until_changed(Reason::CannotCarryDisks, "this banlieue process keeps no image cache to carry disks through: run the provider role with the imagebuilder role (`banlieue run`)")
    })?;
    let key = backend_uid(m);
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &m.namespace().unwrap_or_default(), resource);
    let steps = Steps { ctx, m, api: &api, cache: &cache, key: &key };
    let result = steps.run(st, target, from, machine).await;
    match &result {
        Ok(_) => steps.forget(),
        Err(f) if !f.retry => {
            steps.forget();
            st.carry = Some(CarryStatus { phase: MovePhase::Failed, disks: vec![], message: Some(f.message.clone()), reason: Some(f.reason.to_string()) });
        }
        // Retried: what the cache holds is used again.
        Err(_) => {}
    }
    result
}

struct Steps<'a> {
    ctx: &'a Context,
    m: &'a DynamicObject,
    api: &'a Api<DynamicObject>,
    cache: &'a Arc<ImageCache>,
    key: &'a str,
}

impl Steps<'_> {
    async fn run(&self, st: &mut InfraMachineStatus, target: &Backend, from: &MachineCarry, machine: &wit::Machine) -> Result<MachineStatus, Failure> {
        let ns = self.m.namespace().unwrap_or_default();
        let provider = Api::<Provider>::namespaced(self.ctx.client.clone(), &ns)
            .get_opt(&from.provider)
            .await
            .map_err(|e| api_failure(&e))?
            .ok_or_else(|| Failure::until_changed(Reason::ProviderNotFound, format!("Provider {:?} (the machine's disks come from there) not found", from.provider)))?;
        let source = crate::sandbox::grants::backend(self.ctx, &provider, &crate::key(self.m)).await?;
        let limits = |b: &Backend| b.driver.limits;
        // Both ends say they can before anything is touched.
        call(self.ctx, &source, "features", source.driver.component.offers(Feature::DiskExport, limits(&source), source.grants.clone()))
            .await
            .map_err(|f| f.context(format_args!("Provider {} cannot export disks", from.provider)))?;
        let target_name = target.config.provider.clone();
        call(self.ctx, target, "features", target.driver.component.offers(Feature::DiskImport, limits(target), target.grants.clone()))
            .await
            .map_err(|f| f.context(format_args!("Provider {target_name} cannot import disks")))?;

        let held = match &st.carry {
            Some(c) if matches!(c.phase, MovePhase::Converting | MovePhase::Importing) && self.holds(&c.disks) => c.disks.clone(),
            _ => self.export(st, &source, from).await?,
        };
        self.report(st, MovePhase::Converting, held.clone()).await;
        let format = carried_format(target.image_format);
        let mut carried = CarriedGrant::default();
        for d in &held {
            let file = self
                .cache
                .carry_convert(self.key, &d.name, format)
                .await
                .map_err(|e| Failure::until_changed(Reason::NotADiskImage, format!("converting carried disk {} to {}: {e}", d.name, format.extension())))?;
            let grant = TransferGrant {
                file: Arc::new(file.file),
                digest: String::new(),
                format: format.extension().to_string(),
                size: file.size,
                virtual_size: file.virtual_size,
            };
            carried.disks.push((d.name.clone(), grant));
        }
        let sizes: Vec<MovedDisk> = carried.disks.iter().map(|(name, g)| MovedDisk { name: name.clone(), bytes_done: 0, bytes_total: Some(g.size) }).collect();
        self.report(st, MovePhase::Importing, held.clone()).await;
        carried.urls = self.ctx.handouts.clone().map(|h| Arc::new(Downloads(h)) as Arc<dyn HandOut>);
        let mut grants = target.grants.clone();
        grants.carried = Some(carried);
        let made = call(self.ctx, target, "disk-import", target.driver.component.disk_import(&target.config, machine, limits(target), grants))
            .await
            .map_err(|f| f.context(format_args!("making the machine on Provider {target_name} from the carried disks")))?;
        let done = sizes.into_iter().map(|d| MovedDisk { bytes_done: d.bytes_total.unwrap_or_default(), ..d }).collect();
        st.carry = Some(CarryStatus { phase: MovePhase::Starting, disks: done, message: None, reason: None });
        Ok(made)
    }

    /// Step 1: the source driver hands its disks over; what came in, whole.
    async fn export(&self, st: &mut InfraMachineStatus, source: &Backend, from: &MachineCarry) -> Result<Vec<MovedDisk>, Failure> {
        let io = |e: std::io::Error| Failure::transient(Reason::Internal, format!("the image cache: {e}"));
        // What an export cut off left is of no use: the disks are taken again, whole.
        self.cache.carry_remove(self.key).map_err(io)?;
        let dir = self.cache.carry_dir(self.key).map_err(io)?;
        let room = self.cache.carry_room().map_err(io)?;
        let grant = ExportGrant::new(dir, room);
        self.report(st, MovePhase::Exporting, vec![]).await;
        let source_ref = MachineRef {
            uid: from.machine_uid.clone(),
            name: from.machine.clone(),
            namespace: self.m.namespace().unwrap_or_default(),
            provider_id: from.provider_id.clone(),
            failure_domain: from.failure_domain.clone(),
            backend_id: from.backend_id.clone(),
        };
        let mut grants = source.grants.clone();
        grants.export = Some(grant.clone());
        let progress = tokio::spawn(report_progress(self.api.clone(), self.m.name_any(), grant.clone()));
        let exported = call(self.ctx, source, "disk-export", source.driver.component.disk_export(&source.config, &source_ref, source.driver.limits, grants)).await;
        progress.abort();
        exported.map_err(|f| f.context(format_args!("exporting the disks of {} {} from Provider {}", from.kind, from.machine, from.provider)))?;
        let received = grant.received();
        if received.is_empty() {
            return Err(Failure::until_changed(Reason::CannotCarryDisks, format!("the driver of Provider {} exported no disk of {} {}", from.provider, from.kind, from.machine)));
        }
        Ok(received.into_iter().map(|d| MovedDisk { name: d.name, bytes_done: d.size, bytes_total: Some(d.size) }).collect())
    }

    /// Whether the cache still holds every disk of an export recorded as done.
    fn holds(&self, disks: &[MovedDisk]) -> bool {
        let Ok(dir) = self.cache.carry_dir(self.key) else { return false };
        !disks.is_empty() && disks.iter().all(|d| dir.metadata(&d.name).is_ok_and(|m| Some(m.len()) == d.bytes_total))
    }

    /// Record a step in `status.carry` now (the VM shows it while the step runs).
    async fn report(&self, st: &mut InfraMachineStatus, phase: MovePhase, disks: Vec<MovedDisk>) {
        let carry = CarryStatus { phase, disks, message: None, reason: None };
        st.carry = Some(carry.clone());
        let patch = serde_json::json!({ "status": { "carry": carry } });
        if let Err(e) = self.api.patch_status(&self.m.name_any(), &PatchParams::default(), &Patch::Merge(patch)).await {
            // The status written at the end of the reconcile says it too.
            tracing::debug!(machine = %self.m.name_any(), "recording the carry's phase: {e}");
        }
    }

    fn forget(&self) {
        if let Err(e) = self.cache.carry_remove(self.key) {
            tracing::warn!(machine = %self.m.name_any(), "removing the carried disks from the image cache: {e}");
        }
    }
}

/// While an export runs: the disks received and the bytes of the one coming in, every
/// [`PROGRESS_EVERY`].
async fn report_progress(api: Api<DynamicObject>, name: String, grant: ExportGrant) {
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let mut disks: Vec<MovedDisk> = grant.received().into_iter().map(|d| MovedDisk { name: d.name, bytes_done: d.size, bytes_total: Some(d.size) }).collect();
        let (current, bytes) = grant.current();
        if !current.is_empty() && !disks.iter().any(|d| d.name == current) {
            disks.push(MovedDisk { name: current, bytes_done: bytes, bytes_total: None });
        }
        let carry = CarryStatus { phase: MovePhase::Exporting, disks, message: None, reason: None };
        let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(serde_json::json!({ "status": { "carry": carry } }))).await;
    }
}

/// The host's one-time download URLs, as the transfer capability hands them out.
struct Downloads(Arc<banlieue_imagebuilder::Handouts>);

impl HandOut for Downloads {
    fn hand_out(&self, file: Arc<std::fs::File>, size: u64, extension: &str) -> Result<String, String> {
        Ok(self.0.hand_out(file, size, extension))
    }
}

/// What carried disks are converted to for a target whose ProviderClass imports images as
/// `image_format`: that format, except a stream-optimised VMDK (what an import lease takes,
/// not what a VM runs from): a vSphere disk on a datastore is a flat extent, so raw. `source`
/// (a backend that downloads images itself) takes qcow2.
pub fn carried_format(image_format: ImageFormat) -> DiskFormat {
    match image_format {
        ImageFormat::Raw | ImageFormat::Vmdk => DiskFormat::Raw,
        ImageFormat::Qcow2 | ImageFormat::Source => DiskFormat::Qcow2,
    }
}

/// The source of a machine made from carried disks, for its spec.
pub fn source(provider: &str, kind: &str, machine: &DynamicObject, spec: &banlieue_api::infra::InfraMachineSpec) -> MachineCarry {
    MachineCarry {
        provider: provider.to_string(),
        kind: kind.to_string(),
        machine: machine.name_any(),
        machine_uid: backend_uid(machine),
        failure_domain: spec.backend_failure_domain().unwrap_or_default().to_string(),
        provider_id: spec.provider_id.clone(),
        backend_id: spec.vm.adopt.as_ref().map(|a| a.backend_id.clone()),
    }
}
