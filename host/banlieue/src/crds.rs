//! Generating and installing banlieue's CRDs.

use std::path::Path;

use anyhow::{bail, Context};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};

/// Field manager of everything banlieue applies.
pub const FIELD_MANAGER: &str = "banlieue.io/controller";

/// Write `deploy/crds/` from the API types, or check that it matches them.
pub fn crdgen(out: &Path, check: bool) -> anyhow::Result<()> {
    let files = banlieue_api::crdgen::rendered_files();
    if check {
        let mut stale = Vec::new();
        for (name, content) in &files {
            let on_disk = std::fs::read_to_string(out.join(name)).unwrap_or_default();
            if &on_disk != content {
                stale.push(name.clone());
            }
        }
        let expected: Vec<&String> = files.iter().map(|(n, _)| n).collect();
        for entry in std::fs::read_dir(out).with_context(|| format!("reading {}", out.display()))? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if name.ends_with(".yaml") && !expected.contains(&&name) {
                stale.push(format!("{name} (not generated)"));
            }
        }
        if !stale.is_empty() {
            bail!("{} is out of date ({}); run `banlieue crdgen`", out.display(), stale.join(", "));
        }
        return Ok(());
    }
    std::fs::create_dir_all(out)?;
    for (name, content) in files {
        std::fs::write(out.join(&name), content)?;
    }
    println!("wrote {}", out.display());
    Ok(())
}

/// Server-side-apply every CRD and wait until each is established.
pub async fn install(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let crds = banlieue_api::crdgen::all_crds();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(crd)).await.with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        tokio::time::timeout(std::time::Duration::from_secs(30), await_condition(api.clone(), &name, conditions::is_crd_established()))
            .await
            .with_context(|| format!("CRD {name} not established within 30s"))??;
    }
    Ok(())
}
