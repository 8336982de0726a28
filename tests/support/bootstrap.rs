//! What the `banlieue bootstrap` tests and bench share: the binary and a config.

use std::path::{Path, PathBuf};

use banlieue_test_backends::libvirtd::Libvirtd;
use base64::Engine as _;

use crate::control::path_with_workspace_binaries;

/// The `banlieue` binary of this workspace (built by `cargo build --workspace`).
pub fn banlieue() -> anyhow::Result<PathBuf> {
    let path = path_with_workspace_binaries().split(':').next().map(|d| Path::new(d).join("banlieue")).unwrap_or_default();
    anyhow::ensure!(path.is_file(), "{} not built: cargo build -p banlieue", path.display());
    Ok(path)
}

/// A `banlieue bootstrap` config: the libvirt class and Provider `kvm`, a class, the test guest as
/// image, and `count` management VMs `mgmt-<i>` with their user-data (powered off hard: the
/// test guest may not have booted far enough to answer ACPI when a test deletes it).
/// Every object is labelled for banlieue installation `instance` when one is given.
pub fn config(ns: &str, instance: Option<&str>, lv: &Libvirtd, count: usize) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut docs = vec![format!(
        "apiVersion: banlieue.io/v1alpha1\nkind: ProviderClass\nmetadata: {{name: {ns}-lv}}\nspec:\n  component: {{source: builtin:provider-libvirt}}\n  infrastructureKind: Libvirt\n  capabilities: {{libvirt: true}}\n\
---\napiVersion: banlieue.io/v1alpha1\nkind: Provider\nmetadata: {{name: kvm, namespace: {ns}}}\nspec:\n  providerClassRef: {{name: {ns}-lv}}\n  connection: {{endpoint: \"{}\"}}\n  capabilities:\n    storageClasses: {{standard: {}}}\n    networkClasses: {{default: {}}}\n\
---\napiVersion: banlieue.io/v1alpha1\nkind: VMClass\nmetadata: {{name: {ns}-small}}\nspec:\n  cpus: 1\n  memoryMiB: 256\n  disks: [{{name: root, sizeGiB: 2, storageClass: standard}}]\n  nics: [{{name: eth0, networkClass: default}}]\n\
---\napiVersion: banlieue.io/v1alpha1\nkind: VMImage\nmetadata: {{name: {ns}-guest}}\nspec:\n  sources: [{{providerClass: {ns}-lv, backingFile: \"{}\"}}]\n",
        lv.uri,
        lv.pool,
        lv.network,
        lv.guest_disk()
    )];
    for i in 0..count {
        let user_data = b64(&format!("#cloud-config\n#banlieue-marker: mgmt-{i}\n"));
        docs.push(format!(
            "apiVersion: v1\nkind: Secret\nmetadata: {{name: mgmt-{i}-user-data, namespace: {ns}}}\ndata: {{user-data: {user_data}}}\n\
---\napiVersion: banlieue.io/v1alpha1\nkind: VirtualMachine\nmetadata: {{name: mgmt-{i}, namespace: {ns}}}\nspec:\n  classRef: {{name: {ns}-small}}\n  imageRef: {{name: {ns}-guest}}\n  placement: {{providerRef: {{name: kvm}}}}\n  powerOffMode: Hard\n  userData: {{name: mgmt-{i}-user-data, key: user-data}}\n"
        ));
    }
    let config = docs.join("---\n");
    match instance {
        Some(i) => config.replace("metadata: {name: ", &format!("metadata: {{labels: {{{}: {i}}}, name: ", banlieue_api::INSTANCE_LABEL)),
        None => config,
    }
}
