//! The image builder role: VMImages whose sources name a `url` and a `checksum`.
//!
//! Each such image is downloaded once into the host-side image cache
//! ([`banlieue_imagebuilder::ImageCache`]: content-addressed, verified against the
//! declared sha256 before anything uses it, resumed after a cut, bounded), then
//! inspected with `qemu-img`: what is not a disk image is refused. The VMImage's
//! `Fetched` condition says where each download stands, naming the source and the
//! problem when there is one.
//!
//! Importing the cached image into every Provider (and `kairos-operator` builds) comes
//! next; until then a `url` source is still handed to the driver as it is.

use std::collections::BTreeSet;
use std::sync::Arc;

use banlieue_api::VMImage;
use banlieue_imagebuilder::{ConvertError, Digest, FetchError, ImageCache};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::conditions;
use crate::reasons::Reason;
use crate::reconciler::{Frame, Outcome};
use crate::{status, Context, Error};

/// The condition saying whether every `url` source is in the image cache, verified.
pub const FETCHED: &str = "Fetched";

struct Images {
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
    let images = Controller::new(Api::<VMImage>::all(ctx.client.clone()), watcher::Config::default());
    let images_frame = Frame::new(ctx.clone(), "vmimage", images.store(), ());
    let images_state = Arc::new(Images { ctx: ctx.clone(), cache, frame: images_frame });
    images
        .graceful_shutdown_on(stop)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.options.concurrency))
        .run(
            |image, s| async move { s.frame.reconcile(&image, reconcile(&image, &s)).await },
            |image, err, s| s.frame.error_policy(&image, err),
            images_state,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
    Ok(())
}

/// One `url` source with its checksum, as written in the VMImage.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Download {
    url: String,
    checksum: String,
}

async fn reconcile(image: &VMImage, s: &Images) -> Result<Outcome, Error> {
    let ctx = &s.ctx;
    let api: Api<VMImage> = Api::all(ctx.client.clone());
    let old = image.status.clone().unwrap_or_default();
    let mut st = old.clone();
    let generation = image.metadata.generation;
    // The same download serves every provider class that names it.
    let downloads: BTreeSet<Download> = image
        .spec
        .sources
        .iter()
        .filter_map(|src| Some(Download { url: src.url.clone()?, checksum: src.checksum.clone().unwrap_or_default() }))
        .collect();
    if downloads.is_empty() {
        conditions::remove(&mut st.conditions, FETCHED);
        status::write(&api, &image.name_any(), Some(&old), &st).await?;
        return Ok(Outcome::AwaitChange);
    }
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
            Outcome::AwaitChange
        }
        Some((reason, message, retry)) => {
            let changed = conditions::get(&old.conditions, FETCHED).is_none_or(|c| c.reason != reason.as_str() || c.message != message);
            conditions::set(&mut st.conditions, FETCHED, false, reason, message.clone(), generation);
            if changed {
                ctx.event(&image.object_ref(&()), true, reason, "Fetch", message).await;
            }
            if retry { Outcome::Retry } else { Outcome::AwaitChange }
        }
    };
    status::write(&api, &image.name_any(), Some(&old), &st).await?;
    Ok(outcome)
}

/// Download, verify and inspect one source; what it is, or why not.
async fn fetch(cache: &ImageCache, d: &Download) -> Result<String, crate::reasons::Failure> {
    let fetch_failure = |e: FetchError| {
        let reason = match &e {
            FetchError::InvalidChecksum(_) | FetchError::InvalidUrl(_) => Reason::InvalidSpec,
            FetchError::SchemeNotAllowed { .. } => Reason::URLNotAllowed,
            FetchError::ChecksumMismatch { .. } => Reason::ChecksumMismatch,
            FetchError::TooLarge { .. } => Reason::ImageTooLarge,
            FetchError::Http { .. } | FetchError::Unavailable { .. } | FetchError::Io(_) => Reason::FetchFailed,
        };
        let retry = e.is_retryable();
        (reason, format!("{}: {e}", d.url), retry)
    };
    if d.checksum.is_empty() {
        return Err((Reason::InvalidSpec, format!("{}: a url source needs a checksum (sha256:<hex>) to be verified against", d.url), false));
    }
    let digest = Digest::parse(&d.checksum).map_err(fetch_failure)?;
    let entry = cache.fetch(&d.url, &digest).await.map_err(fetch_failure)?;
    let info = cache.inspect(&entry).await.map_err(|e| match e {
        ConvertError::NotADiskImage(why) => (Reason::NotADiskImage, format!("{}: {why}", d.url), false),
        ConvertError::QemuImg(why) => (Reason::NotADiskImage, format!("{}: qemu-img cannot read it: {why}", d.url), false),
        ConvertError::Io(e) => (Reason::FetchFailed, format!("{}: image cache: {e}", d.url), true),
    })?;
    Ok(format!("{} ({digest}): {}, {} bytes, virtual size {} bytes", d.url, info.format, entry.size, info.virtual_size))
}
