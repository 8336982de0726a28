//! The image builder role: VMImages whose sources name a `url` and a `checksum`.
//!
//! Each such image is downloaded once into the host-side image cache
//! ([`banlieue_imagebuilder::ImageCache`]: content-addressed, verified against the
//! declared sha256 before anything uses it, resumed after a cut, bounded), then
//! inspected with `qemu-img`: what is not a disk image is refused. The VMImage's
//! `Fetched` condition says where each download stands, naming the source and the
//! problem when there is one.
//!
//! Once fetched, the image is imported into every Provider whose class the source is for:
//! converted to the class's `imageFormat`, then the Provider's driver is called with `import-image` and a
//! transfer grant for the cached file, so the host streams the bytes to the target the
//! driver names (a volume) and the driver never holds them. `status.providers[]` says
//! where each import stands; `Ready` is true once every one is.
//!
//! Deleting the VMImage is refused (`Ready=False/InUse`) while VirtualMachines use it;
//! then each Provider's driver removes what it imported (`delete-image`) before the
//! finalizer goes.
//!
//! A VMImage with `build` is built first ([`build`]): the sources that name no location
//! then take the built disk's URL and checksum and go the same way.

pub mod build;

use std::collections::BTreeSet;
use std::sync::Arc;

use banlieue_api::class::{ImageImport, ImageSource, ImportPhase, VMImageStatus};
use banlieue_api::provider::ImageFormat;
use banlieue_api::{Provider, VMImage, VirtualMachine};
use banlieue_imagebuilder::{ConvertError, Digest, DiskFormat, FetchError, ImageCache};
use banlieue_runtime::provider::{ImagePhase, ImageRequest, UrlSource};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};

use crate::failure::{Cause, Failure};
use crate::framework::reconciler::{Frame, Outcome, Retried};
use crate::status::conditions::{self, READY};
use crate::status::reasons::Reason;
use crate::status::{self, finalizer};
use crate::{Context, Error};

/// The condition saying whether every `url` source is in the image cache, verified.
pub const FETCHED: &str = "Fetched";
/// Held on VMImages with `url` sources until what they imported is removed.
pub const FINALIZER: &str = "banlieue.io/imagebuilder";

/// What every reconcile of this controller shares.
struct Shared {
    ctx: Arc<Context>,
    cache: Arc<ImageCache>,
    frame: Frame<VMImage>,
}

/// Reconcile every VMImage until `stop`.
pub async fn run(ctx: Arc<Context>, stop: impl Future<Output = ()> + Send + Sync + 'static) -> Result<(), Error> {
    let Some(cache) = ctx.images.clone() else {
        // Embedded uses (benchmarks, library callers) may run every role without one.
        tracing::error!("the imagebuilder role has no image cache (--image-cache-dir): VMImage url sources are not fetched");
        stop.await;
        return Ok(());
    };
    let (store, changes) = crate::framework::reconciler::cached(Api::<VMImage>::all(ctx.client.clone()), ctx.scope());
    let images = Controller::for_stream(changes, store).trigger_backoff(crate::framework::reconciler::PerWatch);
    let images_frame = Frame::new(ctx.clone(), "vmimage", images.store(), ());
    ctx.metrics.fleet.images(images.store());
    // A Provider created or changed (not merely probed) may need the images.
    let store = images.store();
    let providers = watcher(ctx.watched::<Provider>(), ctx.scope())
        .retried()
        .touched_objects()
        .predicate_filter(kube::runtime::predicates::generation, Default::default());
    let images = images.watches_stream(providers, move |_| store.state().into_iter().map(|i| ObjectRef::from_obj(&*i)).collect::<Vec<_>>());
    // A VM going away (or moving) may release an image being deleted, or an earlier import.
    let deleting = images.store();
    let vms = crate::framework::reconciler::changes(ctx.watched::<VirtualMachine>(), ctx.scope());
    let images = images.watches_stream(vms, move |vm: VirtualMachine| {
        deleting
            .get(&ObjectRef::new(&vm.spec.image_ref.name))
            .filter(|i| i.metadata.deletion_timestamp.is_some() || i.status.as_ref().is_some_and(|s| !s.retired.is_empty()))
            .map(|i| ObjectRef::from_obj(&*i))
    });
    // An OSArtifact moving on wakes the VMImage that owns it (none are served without
    // kairos-operator's CRD: the watch then only retries, with backoff).
    let artifacts = watcher(build::os_artifacts(&ctx.client), watcher::Config::default())
        .retried()
        .touched_objects()
        .filter_map(|r| {
            let owner = r.ok().and_then(|a| a.owner_references().iter().find(|o| o.kind == "VMImage").map(|o| ObjectRef::<VMImage>::new(&o.name)));
            futures::future::ready(owner)
        });
    let images = images.reconcile_on(artifacts);
    let images_state = Arc::new(Shared { ctx: ctx.clone(), cache, frame: images_frame });
    images
        .graceful_shutdown_on(stop)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.options.concurrency))
        .run(
            |image, s| async move { s.frame.reconcile(&image, reconcile(&image, &s)).await },
            |image, err, s| s.frame.error_policy(&image, err),
            images_state,
        )
        .for_each(crate::framework::reconciler::log_run("vmimage"))
        .await;
    Ok(())
}

/// One `url` source with its checksum, as written in the VMImage.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Download {
    url: String,
    checksum: String,
}

async fn reconcile(cached: &VMImage, s: &Shared) -> Result<Outcome, Error> {
    let ctx = &s.ctx;
    let api: Api<VMImage> = Api::all(ctx.client.clone());
    // An import replaces what the backend holds under the image's name, so it must not run
    // twice. The watch cache can lag this controller's own last status write (a loaded
    // kube-apiserver delivers it after the next reconcile has started), and acting on that
    // stale status imported again over a volume a VM was already made from. So each
    // reconcile acts on the object as the API server holds it now (a quorum read).
    let Some(image) = api.get_opt(&cached.name_any()).await? else {
        return Ok(Outcome::AwaitChange);
    };
    let image = &image;
    let old = image.status.clone().unwrap_or_default();
    let mut st = old.clone();
    let generation = image.metadata.generation;
    if image.metadata.deletion_timestamp.is_some() {
        return remove_imports(image, s, &api, &old).await;
    }
    if image.spec.build.is_none() && image.spec.sources.iter().all(|src| src.url.is_none()) {
        conditions::remove(&mut st.conditions, FETCHED);
        conditions::remove(&mut st.conditions, READY);
        conditions::remove(&mut st.conditions, build::BUILT);
        st.providers.clear();
        st.build = None;
        status::write(&api, &image.name_any(), Some(&old), &st).await?;
        return Ok(Outcome::AwaitChange);
    }
    // What it builds and imports is removed with it.
    if !finalizer::has(image, FINALIZER) {
        finalizer::add(&api, image, FINALIZER).await?;
        return Ok(Outcome::AwaitChange);
    }
    if let Some(waiting) = build::ensure_built(ctx, image, &mut st).await? {
        status::write(&api, &image.name_any(), Some(&old), &st).await?;
        return Ok(waiting);
    }
    let sources = effective_sources(image, &st);
    // The same download serves every provider class that names it.
    let downloads: BTreeSet<Download> = sources
        .iter()
        .filter_map(|src| Some(Download { url: src.url.clone()?, checksum: src.checksum.clone().unwrap_or_default() }))
        .collect();
    let mut fetched = Vec::new();
    let mut failure = None;
    for d in &downloads {
        match fetch(&s.cache, d).await {
            Ok(what) => fetched.push(what),
            Err(f) => {
                failure = Some(f);
                break;
            }
        }
    }
    let outcome = match failure {
        None => {
            conditions::set(&mut st.conditions, FETCHED, true, Reason::Fetched, fetched.join("; "), generation);
            import_everywhere(image, &sources, s, &api, &old, &mut st).await?
        }
        Some(Failure { reason, message, retry }) => {
            if conditions::set(&mut st.conditions, FETCHED, false, reason, message.clone(), generation) {
                ctx.event(&image.object_ref(&()), true, reason, "Fetch", message).await;
            }
            if retry { Outcome::Retry } else { Outcome::AwaitChange }
        }
    };
    status::write(&api, &image.name_any(), Some(&old), &st).await?;
    Ok(outcome)
}

/// Each source as imports see it: a built one with the build's URL and checksum.
fn effective_sources(image: &VMImage, st: &VMImageStatus) -> Vec<ImageSource> {
    let mut view = image.clone();
    view.status = Some(st.clone());
    image.spec.sources.iter().filter_map(|src| view.source_for(&src.provider_class)).filter(|src| src.url.is_some()).collect()
}

/// Behind the finalizer: refuse while VMs use the image, then have each Provider's driver
/// remove what it imported and the build's OSArtifacts go, then let the VMImage go.
async fn remove_imports(image: &VMImage, s: &Shared, api: &Api<VMImage>, old: &VMImageStatus) -> Result<Outcome, Error> {
    let ctx = &s.ctx;
    if !finalizer::has(image, FINALIZER) {
        return Ok(Outcome::AwaitChange);
    }
    let mut st = old.clone();
    let generation = image.metadata.generation;
    let users: Vec<String> = ctx
        .watched::<VirtualMachine>()
        .list(&ctx.options.installation.list())
        .await?
        .items
        .iter()
        .filter(|vm| vm.spec.image_ref.name == image.name_any())
        .map(crate::key)
        .collect();
    if !users.is_empty() {
        let message = format!("still used by VirtualMachines {}: delete them (or change their image) first", users.join(", "));
        if conditions::set(&mut st.conditions, READY, false, Reason::InUse, message.clone(), generation) {
            ctx.event(&image.object_ref(&()), true, Reason::InUse, "Delete", message).await;
        }
        status::write(api, &image.name_any(), Some(old), &st).await?;
        return Ok(Outcome::Retry);
    }
    let providers = ctx.watched::<Provider>().list(&ctx.options.installation.list()).await?.items;
    let mut left = Vec::new();
    for import in old.providers.iter().chain(&old.retired) {
        // An import that never reported a reference (cut off, failed) may have left
        // something: the empty reference asks the driver for everything of this image.
        let reference = import.reference.clone().filter(|_| import.phase == ImportPhase::Ready).unwrap_or_default();
        // A Provider deleted since holds nothing banlieue can still reach.
        let Some(provider) = providers.iter().find(|p| crate::key(*p) == import.provider) else { continue };
        let Some(src) = image.source_for(&provider.spec.provider_class_ref.name) else { continue };
        if let Err(Failure { reason, message, .. }) = delete_one(ctx, image, provider, &src, &reference).await {
            left.push(format!("{}: {reason}: {message}", import.provider));
        }
    }
    if !left.is_empty() {
        let message = format!("cannot remove the imports yet: {}", left.join("; "));
        conditions::set(&mut st.conditions, READY, false, Reason::Deleting, message, generation);
        status::write(api, &image.name_any(), Some(old), &st).await?;
        return Ok(Outcome::Retry);
    }
    build::remove_older(ctx, image, "").await?;
    ctx.event(&image.object_ref(&()), false, Reason::Deleted, "Delete", format!("imports removed from {} Providers", old.providers.len())).await;
    finalizer::remove(api, image, FINALIZER).await?;
    Ok(Outcome::AwaitChange)
}

/// What the driver is asked to import (or remove) for `src` on `provider`: into the
/// Provider's first storage target (its classes map to pools or datastores).
fn image_request(image: &VMImage, provider: &Provider, src: &ImageSource) -> ImageRequest {
    ImageRequest {
        name: image.name_any(),
        source: banlieue_runtime::provider::ImageSource::Url(UrlSource { url: src.url.clone().unwrap_or_default(), checksum: src.checksum.clone() }),
        target: provider.spec.capabilities.storage_classes.values().next().cloned(),
    }
}

/// Have `provider`'s driver remove the import at `reference`.
async fn delete_one(ctx: &Context, image: &VMImage, provider: &Provider, src: &ImageSource, reference: &str) -> Result<(), Failure> {
    let b = crate::sandbox::grants::backend(ctx, provider, &image.name_any()).await?;
    let request = image_request(image, provider, src);
    match b.drive(ctx, "delete-image", b.driver.component.delete_image(&b.config, &request, reference, b.driver.limits, b.grants.clone())).await {
        Ok(()) | Err(banlieue_runtime::CallError::Guest(banlieue_runtime::GuestError::NotFound(_))) => Ok(()),
        Err(e) => Err(Failure::from(e)),
    }
}

/// Import the fetched image into every Provider its `url` sources apply to; `Ready` says
/// whether all of them have it.
async fn import_everywhere(image: &VMImage, sources: &[ImageSource], s: &Shared, api: &Api<VMImage>, old: &VMImageStatus, st: &mut VMImageStatus) -> Result<Outcome, Error> {
    let ctx = &s.ctx;
    let generation = image.metadata.generation;
    let providers = ctx.watched::<Provider>().list(&ctx.options.installation.list()).await?.items;
    let mut imports = Vec::new();
    let mut retry = false;
    for p in &providers {
        let Some(src) = sources.iter().find(|src| src.provider_class == p.spec.provider_class_ref.name) else {
            continue;
        };
        let key = crate::key(p);
        let digest = src.checksum.clone().unwrap_or_default();
        let prior = old.providers.iter().find(|i| i.provider == key);
        match import_step(prior, &digest) {
            ImportStep::Keep(done) => {
                imports.push(done.clone());
                continue;
            }
            ImportStep::Import { retire: Some(earlier) } => {
                if !st.retired.iter().any(|r| r.provider == earlier.provider && r.reference == earlier.reference) {
                    st.retired.push(earlier.clone());
                }
            }
            ImportStep::Import { retire: None } => {}
        }
        // Say it is under way before the (possibly long) transfer.
        let importing = ImageImport { provider: key.clone(), phase: ImportPhase::Importing, digest: Some(digest.clone()), ..Default::default() };
        let mut during = st.clone();
        during.providers = imports.iter().cloned().chain([importing]).collect();
        status::write(api, &image.name_any(), Some(old), &during).await?;
        let result = import_one(ctx, &s.cache, image, p, src).await;
        let (phase, reference, message) = match result {
            Ok(done) => done,
            Err(Failure { reason, message, retry: again }) => {
                retry |= again;
                (ImportPhase::Failed, None, format!("{reason}: {message}"))
            }
        };
        if phase == ImportPhase::Failed && prior.is_none_or(|i| i.message.as_deref() != Some(message.as_str())) {
            ctx.event(&image.object_ref(&()), true, Reason::ImportFailed, "Import", format!("{key}: {message}")).await;
        }
        imports.push(ImageImport { provider: key, phase, digest: Some(digest), reference, message: Some(message) });
    }
    st.providers = imports;
    release_retired(image, s, st).await?;
    let failed: Vec<String> = st.providers.iter().filter(|i| i.phase != ImportPhase::Ready).map(|i| format!("{}: {}", i.provider, i.message.clone().unwrap_or_default())).collect();
    let (ready, reason, message) = if st.providers.is_empty() {
        (false, Reason::NoProvider, "no Provider's class has a url source in this image".to_string())
    } else if failed.is_empty() {
        (true, Reason::Imported, format!("on {} Providers", st.providers.len()))
    } else {
        (false, Reason::ImportFailed, failed.join("; "))
    };
    conditions::set(&mut st.conditions, READY, ready, reason, message, generation);
    Ok(if retry { Outcome::Retry } else { Outcome::AwaitChange })
}

/// What one Provider's import needs, from what the status says of it.
#[derive(Debug, PartialEq)]
enum ImportStep<'a> {
    /// Imported, of this digest: nothing to do.
    Keep(&'a ImageImport),
    /// Import (again); an earlier import of another digest, when there is one, is retired:
    /// it stays while VMs made from it exist.
    Import { retire: Option<&'a ImageImport> },
}

fn import_step<'a>(prior: Option<&'a ImageImport>, digest: &str) -> ImportStep<'a> {
    match prior {
        Some(i) if i.phase == ImportPhase::Ready && i.digest.as_deref() == Some(digest) => ImportStep::Keep(i),
        Some(i) if i.phase == ImportPhase::Ready && i.reference.is_some() => ImportStep::Import { retire: Some(i) },
        _ => ImportStep::Import { retire: None },
    }
}

/// Whether a VM still uses retired import `r`: a VM on its Provider made from it — or one
/// that does not say what it was made from (then every import of that Provider is kept).
/// `made_from` is each VM's `namespace/provider` and the import it was made from.
fn still_used(made_from: &[(String, Option<String>)], r: &ImageImport) -> bool {
    made_from.iter().any(|(p, from)| *p == r.provider && from.as_ref().is_none_or(|f| Some(f) == r.reference.as_ref()))
}

/// Remove the retired imports no VirtualMachine of this image was made from any more (a
/// VM on that Provider that does not say what it was made from keeps them all).
async fn release_retired(image: &VMImage, s: &Shared, st: &mut VMImageStatus) -> Result<(), Error> {
    if st.retired.is_empty() {
        return Ok(());
    }
    let ctx = &s.ctx;
    let vms = ctx.watched::<VirtualMachine>().list(&ctx.options.installation.list()).await?.items;
    let made_from: Vec<(String, Option<String>)> = vms
        .iter()
        .filter(|vm| vm.spec.image_ref.name == image.name_any())
        .filter_map(|vm| {
            let scheduled = vm.status.as_ref()?.scheduled.as_ref()?;
            Some((format!("{}/{}", vm.namespace().unwrap_or_default(), scheduled.provider), scheduled.image.clone()))
        })
        .collect();
    let providers = ctx.watched::<Provider>().list(&ctx.options.installation.list()).await?.items;
    let mut kept = Vec::new();
    for r in std::mem::take(&mut st.retired) {
        let used = still_used(&made_from, &r);
        // A Provider deleted since holds nothing banlieue can still reach.
        let provider = providers.iter().find(|p| crate::key(*p) == r.provider);
        let src = provider.and_then(|p| image.source_for(&p.spec.provider_class_ref.name));
        let (Some(provider), Some(src), false) = (provider, src, used) else {
            if used {
                kept.push(r);
            }
            continue;
        };
        match delete_one(ctx, image, provider, &src, r.reference.as_deref().unwrap_or_default()).await {
            Ok(()) => {
                let message = format!("{}: removed the earlier import {} ({}): no VM uses it", r.provider, r.reference.clone().unwrap_or_default(), r.digest.clone().unwrap_or_default());
                ctx.event(&image.object_ref(&()), false, Reason::Deleted, "Release", message).await;
            }
            Err(Failure { reason, message, .. }) => kept.push(ImageImport { message: Some(format!("cannot remove it yet: {reason}: {message}")), ..r }),
        }
    }
    st.retired = kept;
    Ok(())
}

/// Convert the cached image for `provider` and have its driver import it, the host
/// streaming the bytes.
async fn import_one(ctx: &Context, cache: &ImageCache, image: &VMImage, provider: &Provider, src: &ImageSource) -> Result<(ImportPhase, Option<String>, String), Failure> {
    let url = src.url.clone().unwrap_or_default();
    let digest = Digest::parse(src.checksum.as_deref().unwrap_or_default()).map_err(|e| Failure::until_changed(Reason::InvalidSpec, e.to_string()))?;
    let entry = cache.get(&digest).map_err(|e| Failure::transient(Reason::FetchFailed, format!("image cache: {e}")))?.ok_or_else(|| Failure::transient(Reason::FetchFailed, format!("{url} is no longer in the image cache")))?;
    let b = crate::sandbox::grants::backend(ctx, provider, &image.name_any()).await?;
    // The virtual size is the source's: qemu-img reports a stream-optimised VMDK's differently.
    let info = cache.inspect(&entry).await.map_err(|e| Failure::until_changed(Reason::NotADiskImage, format!("{url}: {e}")))?;
    // Converted once per format (the cache keeps it), to what the class's driver takes.
    let format = match b.image_format {
        ImageFormat::Qcow2 => Some(DiskFormat::Qcow2),
        ImageFormat::Raw => Some(DiskFormat::Raw),
        ImageFormat::Vmdk => Some(DiskFormat::StreamOptimizedVmdk),
        ImageFormat::Source => None,
    };
    let (converted, format) = match format {
        Some(f) => (cache.convert(&entry, f).await.map_err(|e| Failure::until_changed(Reason::NotADiskImage, format!("converting {url}: {e}")))?, f.extension().to_string()),
        None => (entry, info.format.clone()),
    };
    let file = cache.open_entry(&converted).map_err(|e| Failure::transient(Reason::FetchFailed, format!("image cache: {e}")))?;
    let size = converted.size;
    let grants = b.with_transfer(file, digest.to_string(), format, converted.size, info.virtual_size);
    let request = image_request(image, provider, src);
    let done = b.drive(ctx, "import-image", b.driver.component.import_image(&b.config, &request, b.driver.limits, grants)).await.map_err(Failure::from)?;
    let phase = match done.phase {
        ImagePhase::Pending => ImportPhase::Pending,
        ImagePhase::Importing => ImportPhase::Importing,
        ImagePhase::Ready => ImportPhase::Ready,
        ImagePhase::Failed => ImportPhase::Failed,
    };
    if phase == ImportPhase::Ready {
        ctx.metrics.image_imported(&b.config.provider, size);
    }
    Ok((phase, done.reference, done.message.unwrap_or_default()))
}

/// Download, verify and inspect one source; what it is, or why not.
async fn fetch(cache: &ImageCache, d: &Download) -> Result<String, Failure> {
    let fetch_failure = |e: FetchError| Failure::from(e).context(&d.url);
    if d.checksum.is_empty() {
        return Err(Failure::until_changed(Reason::InvalidSpec, format!("{}: a url source needs a checksum (sha256:<hex>) to be verified against", d.url)));
    }
    let digest = Digest::parse(&d.checksum).map_err(fetch_failure)?;
    let entry = cache.fetch(&d.url, &digest).await.map_err(fetch_failure)?;
    let info = cache.inspect(&entry).await.map_err(|e| match e {
        ConvertError::NotADiskImage(why) => Failure::until_changed(Reason::NotADiskImage, format!("{}: {why}", d.url)),
        ConvertError::QemuImg(why) => Failure::until_changed(Reason::NotADiskImage, format!("{}: qemu-img cannot read it: {why}", d.url)),
        ConvertError::Io(e) => Failure::transient(Reason::FetchFailed, format!("{}: image cache: {e}", d.url)),
    })?;
    Ok(format!("{} ({digest}): {}, {} bytes, virtual size {} bytes", d.url, info.format, entry.size, info.virtual_size))
}

/// A download's failure: a source written wrong waits for a change, a server that did not
/// answer (or answered an error) is tried again.
impl Cause for FetchError {
    fn reason(&self) -> Reason {
        match self {
            FetchError::InvalidChecksum(_) | FetchError::InvalidUrl(_) => Reason::InvalidSpec,
            FetchError::SchemeNotAllowed { .. } => Reason::URLNotAllowed,
            FetchError::ChecksumMismatch { .. } => Reason::ChecksumMismatch,
            FetchError::TooLarge { .. } => Reason::ImageTooLarge,
            FetchError::Http { .. } | FetchError::Unavailable { .. } | FetchError::Io(_) => Reason::FetchFailed,
        }
    }

    fn retry(&self) -> bool {
        self.is_retryable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn import(phase: ImportPhase, digest: &str, reference: Option<&str>) -> ImageImport {
        ImageImport { provider: "team/kvm".into(), phase, digest: Some(digest.into()), reference: reference.map(String::from), message: None }
    }

    #[test]
    fn an_import_is_kept_redone_or_replaced_with_the_earlier_one_retired() {
        let done = import(ImportPhase::Ready, "sha256:a", Some("/pool/image@os@a"));
        assert_eq!(import_step(Some(&done), "sha256:a"), ImportStep::Keep(&done), "imported, same digest");
        assert_eq!(import_step(Some(&done), "sha256:b"), ImportStep::Import { retire: Some(&done) }, "a new source: the old one is retired");
        let cut = import(ImportPhase::Importing, "sha256:a", None);
        assert_eq!(import_step(Some(&cut), "sha256:a"), ImportStep::Import { retire: None }, "an import cut off is done again");
        let failed = import(ImportPhase::Failed, "sha256:a", None);
        assert_eq!(import_step(Some(&failed), "sha256:b"), ImportStep::Import { retire: None }, "nothing was imported to retire");
        assert_eq!(import_step(None, "sha256:a"), ImportStep::Import { retire: None });
    }

    #[test]
    fn a_retired_import_stays_while_a_vm_on_its_provider_was_made_from_it_or_does_not_say() {
        let old = import(ImportPhase::Ready, "sha256:a", Some("/pool/image@os@a"));
        let vm = |provider: &str, from: Option<&str>| (provider.to_string(), from.map(String::from));
        assert!(still_used(&[vm("team/kvm", Some("/pool/image@os@a"))], &old));
        assert!(still_used(&[vm("team/kvm", None)], &old), "a VM that does not say keeps every import of its Provider");
        assert!(!still_used(&[vm("team/kvm", Some("/pool/image@os@b"))], &old), "made from the new import");
        assert!(!still_used(&[vm("team/other", Some("/pool/image@os@a"))], &old), "on another Provider");
        assert!(!still_used(&[], &old));
    }
}
