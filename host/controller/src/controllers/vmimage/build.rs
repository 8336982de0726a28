//! VMImage builds: kairos-operator's `OSArtifact` (`build.kairos.io/v1alpha2`) makes the
//! disk, banlieue's exporter pushes it to a registry, and the image builder then treats
//! the pushed layer like any `url` source.
//!
//! Per `spec.build` generation the role applies one OSArtifact in banlieue's namespace,
//! named `<vmimage>-<generation>`, owned by the VMImage and labelled with its UID: the
//! VMImage's `osArtifact` spec plus `exporters` — one Job that pushes the built `.raw`
//! (or `.iso`) with `oras` to `<registry>:<vmimage>-<generation>`. It follows the
//! OSArtifact's `status.phase` (Pending, Building, Exporting, Ready, Error) by watch into
//! the `Built` condition. Once Ready, the pushed manifest is resolved: its one layer's
//! digest is the disk's checksum and the registry's blob URL its source, recorded in
//! `status.build`; [`VMImage::source_for`] gives them to the sources that name no location.
//!
//! Why a registry: the disk leaves the cluster's build PVC through a protocol the platform
//! already runs and secures (a registry, its credentials, its retention), content-addressed,
//! so the checksum comes from the registry rather than from the exporter's word, and
//! Proxmox VE can download the same blob URL itself.

use banlieue_api::class::BuildStatus;
use banlieue_api::VMImage;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::framework::reconciler::Outcome;
use crate::status::conditions;
use crate::status::reasons::Reason;
use crate::{Context, Error, ImageBuildOptions, SYSTEM_NAMESPACE};

/// The condition saying whether the build produced a disk.
pub const BUILT: &str = "Built";
/// Label with the owning VMImage's UID, on every OSArtifact made for it.
pub const VMIMAGE_UID: &str = "banlieue.io/vmimage-uid";
const FIELD_MANAGER: &str = "banlieue.io/imagebuilder";

/// kairos-operator's OSArtifact.
pub fn os_artifacts(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("build.kairos.io", "v1alpha2", "OSArtifact");
    Api::namespaced_with(client.clone(), SYSTEM_NAMESPACE, &ApiResource::from_gvk_with_plural(&gvk, "osartifacts"))
}

/// The OSArtifact for this generation of the VMImage's build.
pub fn artifact_name(image: &VMImage) -> String {
    format!("{}-{}", image.name_any(), image.metadata.generation.unwrap_or(0))
}

/// Where the exporter pushes this generation's disk.
pub fn push_reference(opts: &ImageBuildOptions, image: &VMImage) -> String {
    format!("{}:{}", opts.registry.trim_end_matches('/'), artifact_name(image))
}

/// The exporter Job spec: push the built disk (the operator mounts its artifacts volume at
/// `/artifacts`) as a one-layer OCI artifact.
fn exporter(opts: &ImageBuildOptions, image: &VMImage) -> serde_json::Value {
    let reference = push_reference(opts, image);
    let script = "set -eu\n\
for f in /artifacts/*.raw /artifacts/*.iso; do [ -f \"$f\" ] && break; done\n\
[ -f \"$f\" ] || { echo 'no .raw or .iso artifact to export' >&2; exit 1; }\n\
cd /artifacts\n\
oras push \"$BANLIEUE_IMAGE_REF\" --artifact-type application/vnd.banlieue.disk.v1 \"$(basename \"$f\"):application/vnd.banlieue.disk.layer.v1\"\n";
    json!({
        "backoffLimit": 3,
        "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "push-to-registry",
                "image": opts.exporter_image,
                "command": ["sh", "-c", script],
                "env": [{"name": "BANLIEUE_IMAGE_REF", "value": reference}],
                "volumeMounts": [{"name": "artifacts", "mountPath": "/artifacts"}],
            }],
        }},
    })
}

/// Bring the build to where it can be imported: `Ok(None)` when `status.build` has a
/// disk for this generation, else the outcome to end the reconcile with (the `Built`
/// condition says why).
pub async fn ensure_built(ctx: &Context, image: &VMImage, st: &mut banlieue_api::class::VMImageStatus) -> Result<Option<Outcome>, Error> {
    let generation = image.metadata.generation;
    let Some(build) = &image.spec.build else {
        st.build = None;
        conditions::remove(&mut st.conditions, BUILT);
        return Ok(None);
    };
    if st.build.as_ref().is_some_and(|b| b.observed_generation == generation && b.url.is_some()) {
        return Ok(None);
    }
    let Some(opts) = &ctx.options.image_build else {
        let message = "this VMImage has a build, but the imagebuilder has no --image-build-registry to export it to".to_string();
        conditions::set(&mut st.conditions, BUILT, false, Reason::BuildNotConfigured, message, generation);
        return Ok(Some(Outcome::AwaitChange));
    };
    let api = os_artifacts(&ctx.client);
    let name = artifact_name(image);
    let mut spec = serde_json::Value::Object(build.os_artifact.clone().into_iter().collect());
    spec["exporters"] = json!([exporter(opts, image)]);
    let owner = image.controller_owner_ref(&()).map(|o| json!([o])).unwrap_or(json!([]));
    let object = json!({
        "apiVersion": "build.kairos.io/v1alpha2", "kind": "OSArtifact",
        "metadata": {"name": name, "namespace": SYSTEM_NAMESPACE, "ownerReferences": owner,
                     "labels": {VMIMAGE_UID: image.uid().unwrap_or_default()}},
        "spec": spec,
    });
    let applied = match api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object)).await {
        Ok(o) => o,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let message = "OSArtifact (build.kairos.io/v1alpha2) is not served by this cluster: install kairos-operator".to_string();
            conditions::set(&mut st.conditions, BUILT, false, Reason::BuildFailed, message, generation);
            return Ok(Some(Outcome::Retry));
        }
        Err(e) => return Err(e.into()),
    };
    let phase = applied.data["status"]["phase"].as_str().unwrap_or("Pending").to_string();
    let message = applied.data["status"]["message"].as_str().unwrap_or("").to_string();
    let mut status = BuildStatus { os_artifact: format!("{SYSTEM_NAMESPACE}/{name}"), phase: phase.clone(), observed_generation: generation, ..Default::default() };
    let outcome = match phase.as_str() {
        "Ready" => {
            let reference = format!("oci://{}", push_reference(opts, image));
            let resolved = match reference.parse::<banlieue_oci::Reference>() {
                Ok(r) => banlieue_oci::resolve_disk(&r, &banlieue_oci::Auth::Anonymous).await,
                Err(e) => Err(e),
            };
            match resolved {
                Ok(disk) => {
                    status.artifact = Some(disk.pinned.to_string());
                    status.url = Some(disk.blob_url);
                    status.checksum = Some(disk.digest.clone());
                    let message = format!("OSArtifact {name} is Ready; the exporter pushed {} ({}, {} bytes)", disk.pinned, disk.digest, disk.size);
                    conditions::set(&mut st.conditions, BUILT, true, Reason::Built, message, generation);
                    None
                }
                Err(e) => {
                    let message = format!("OSArtifact {name} is Ready, but its export {reference} cannot be read: {e}");
                    conditions::set(&mut st.conditions, BUILT, false, Reason::BuildFailed, message, generation);
                    Some(Outcome::Retry)
                }
            }
        }
        "Error" => {
            let message = format!("OSArtifact {name} failed: {message}");
            if conditions::set(&mut st.conditions, BUILT, false, Reason::BuildFailed, message.clone(), generation) {
                ctx.event(&image.object_ref(&()), true, Reason::BuildFailed, "Build", message).await;
            }
            Some(Outcome::AwaitChange)
        }
        // Pending, Building, Exporting: the OSArtifact watch wakes the VMImage.
        other => {
            let message = if message.is_empty() { format!("OSArtifact {name} is {other}") } else { format!("OSArtifact {name} is {other}: {message}") };
            conditions::set(&mut st.conditions, BUILT, false, Reason::Building, message, generation);
            Some(Outcome::AwaitChange)
        }
    };
    st.build = Some(status);
    if outcome.is_none() {
        remove_older(ctx, image, &name).await?;
    }
    Ok(outcome)
}

/// Delete the VMImage's other OSArtifacts (older generations, or all with `keep` empty);
/// a cluster without the OSArtifact kind has none.
pub async fn remove_older(ctx: &Context, image: &VMImage, keep: &str) -> Result<(), Error> {
    let api = os_artifacts(&ctx.client);
    let selector = format!("{VMIMAGE_UID}={}", image.uid().unwrap_or_default());
    let list = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(l) => l,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for old in list.items.iter().filter(|o| o.name_any() != keep) {
        match api.delete(&old.name_any(), &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
