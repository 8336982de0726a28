//! Two banlieue installations on one cluster (a staging install beside production, test
//! runs in parallel): each acts only on the objects labelled for it — its ProviderClasses,
//! PlacementPolicies, VMClasses, VMImages, Providers, VMs and the Machines it makes — and
//! holds Leases of its own; objects of no installation's label belong to the default one.
//! Checked on the objects (status, finalizers, field managers) and on libvirt itself.

use banlieue_api::{Provider, ProviderClass, VMImage, VirtualMachine};
use banlieue_controller::Installation;
use banlieue_tests::control::{apply, wait_for, ControlPlane};
use banlieue_tests::{await_deleted, TestEnv};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use kube::ResourceExt;
use serde_json::{json, Value};

/// libvirt's test driver, whose state every connection of this process shares while one is
/// open: what either installation made is seen from the test's own connection.
const LIBVIRT: &str = "test:///default";

/// One installation's objects: a libvirt ProviderClass, a VMClass, a VMImage, a Provider
/// and VM `vm-<tag>`, all labelled `instance` (none: unlabelled).
fn objects(env: &TestEnv, tag: &str, instance: Option<&str>) -> Vec<Value> {
    let ns = &env.ns;
    let class = format!("{ns}-{tag}");
    let mut objects = vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "ProviderClass", "metadata": {"name": class},
               "spec": {"component": {"source": "builtin:provider-libvirt"}, "infrastructureKind": "Libvirt", "capabilities": {"libvirt": true}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": class},
               "spec": {"cpus": 1, "memoryMiB": 256, "disks": [{"name": "root", "sizeGiB": 1, "storageClass": "standard"}],
                        "nics": [{"name": "eth0", "networkClass": "default"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": class},
               "spec": {"sources": [{"providerClass": class, "backingFile": "/var/lib/images/debian.qcow2"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": format!("p-{tag}"), "namespace": ns},
               "spec": {"providerClassRef": {"name": class}, "connection": {"endpoint": LIBVIRT},
                        "capabilities": {"storageClasses": {"standard": "default-pool"}, "networkClasses": {"default": "default"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": format!("vm-{tag}"), "namespace": ns},
               "spec": {"classRef": {"name": class}, "imageRef": {"name": class}, "placement": {"providerRef": {"name": format!("p-{tag}")}}}}),
    ];
    if let Some(i) = instance {
        for o in &mut objects {
            o["metadata"]["labels"][banlieue_api::INSTANCE_LABEL] = json!(i);
        }
    }
    objects
}

fn ready(vm: Option<&VirtualMachine>) -> bool {
    vm.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Nothing acted on `tag`'s objects: no status, no finalizer, no banlieue field manager.
async fn untouched(env: &TestEnv, tag: &str) -> anyhow::Result<()> {
    let name = format!("{}-{tag}", env.ns);
    let touched_by_banlieue = |meta: &kube::api::ObjectMeta| {
        meta.finalizers.as_ref().is_some_and(|f| !f.is_empty())
            || meta.managed_fields.iter().flatten().any(|m| m.manager.as_deref() == Some(banlieue_controller::FIELD_MANAGER))
    };
    let class = Api::<ProviderClass>::all(env.client.clone()).get(&name).await?;
    assert!(class.status.is_none() && !touched_by_banlieue(&class.metadata), "ProviderClass {name} was acted on: {class:#?}");
    let image = Api::<VMImage>::all(env.client.clone()).get(&name).await?;
    assert!(image.status.is_none() && !touched_by_banlieue(&image.metadata), "VMImage {name} was acted on: {image:#?}");
    let provider = Api::<Provider>::namespaced(env.client.clone(), &env.ns).get(&format!("p-{tag}")).await?;
    assert!(provider.status.is_none() && !touched_by_banlieue(&provider.metadata), "Provider p-{tag} was acted on: {provider:#?}");
    let vm = Api::<VirtualMachine>::namespaced(env.client.clone(), &env.ns).get(&format!("vm-{tag}")).await?;
    assert!(vm.status.is_none() && !touched_by_banlieue(&vm.metadata), "VM vm-{tag} was acted on: {vm:#?}");
    Ok(())
}

#[tokio::test]
async fn two_installations_on_one_cluster_act_only_on_their_own_objects() -> anyhow::Result<()> {
    let env = TestEnv::start("installations").await?;
    env.install_crds().await?;
    env.create_namespace(banlieue_tests::SYSTEM_NAMESPACE).await?;
    let (a, b) = (env.instance.clone(), format!("{}-b", env.instance));
    for o in objects(&env, "a", Some(&a)).into_iter().chain(objects(&env, "b", Some(&b))).chain(objects(&env, "d", None)) {
        apply(&env.client, o).await?;
    }
    // Leader election on, as installed: each installation's Leases are its own.
    let installation = |name: &str| {
        let i = Installation::new(Some(name)).expect("a valid instance name");
        move |o: &mut banlieue_controller::Options| {
            o.installation = i;
            o.leader_election = true;
            o.identity = format!("replica-of-{}", o.installation.instance().unwrap_or_default());
        }
    };

    // The test's own look at libvirt, held open for the whole test.
    let libvirt = banlieue_libvirt::Connections::new().get(LIBVIRT).await?;
    let domains = || {
        let libvirt = libvirt.clone();
        let prefix = format!("{}_", env.ns);
        async move {
            let mut names: Vec<String> = libvirt.domain_list().await?.into_iter().map(|d| d.name).filter(|n| n.starts_with(&prefix)).collect();
            names.sort();
            anyhow::Ok(names)
        }
    };
    let domain = |tag: &str| format!("{}_vm-{tag}", env.ns);

    // Installation a alone: its VM becomes Ready; b's and the unlabelled objects are left
    // as they were written, and nothing is made for them.
    let cp_a = ControlPlane::start_with(&env, installation(&a))?;
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for(&vms, "vm-a", 90, "Ready", ready).await?;
    assert_eq!(domains().await?, vec![domain("a")]);
    untouched(&env, "b").await?;
    untouched(&env, "d").await?;

    // Installation b beside it: its own VM becomes Ready on its own node; the unlabelled
    // objects still belong to nobody running here.
    let cp_b = ControlPlane::start_with(&env, installation(&b))?;
    wait_for(&vms, "vm-b", 90, "Ready", ready).await?;
    assert_eq!(domains().await?, vec![domain("a"), domain("b")]);
    untouched(&env, "d").await?;
    // Each installation's Machine carries its label (its provider role selects it by that).
    let gvk = kube::api::GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", "LibvirtMachine");
    let machines: Api<kube::api::DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &kube::api::ApiResource::from_gvk_with_plural(&gvk, "libvirtmachines"));
    for (tag, instance) in [("a", &a), ("b", &b)] {
        let m = machines.get(&format!("vm-{tag}")).await?;
        assert_eq!(m.labels().get(banlieue_api::INSTANCE_LABEL), Some(instance), "Machine vm-{tag}");
    }
    // Leases: each installation leads its roles under names of its own.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), banlieue_tests::SYSTEM_NAMESPACE);
    for instance in [&a, &b] {
        for role in ["controller", "provider", "operator", "imagebuilder"] {
            let name = format!("banlieue-{instance}-{role}");
            let lease = wait_for(&leases, &name, 30, "held", |l: Option<&Lease>| l.and_then(|l| l.spec.as_ref()?.holder_identity.as_ref()).is_some()).await?;
            assert_eq!(lease.spec.and_then(|s| s.holder_identity), Some(format!("replica-of-{instance}")), "{name}");
        }
    }

    // Deleting a's VM is a's to do; b's VM stays, on its node.
    vms.delete("vm-a", &DeleteParams::default()).await?;
    banlieue_tests::within(60, await_deleted(&vms, "vm-a")).await??;
    assert!(ready(vms.get("vm-b").await.ok().as_ref()), "b's VM is still Ready");
    assert_eq!(domains().await?, vec![domain("b")], "a deleted its domain, b's stays");
    vms.delete("vm-b", &DeleteParams::default()).await?;
    banlieue_tests::within(60, await_deleted(&vms, "vm-b")).await??;
    assert!(domains().await?.is_empty());
    drop((cp_a, cp_b));

    // b's cluster-scoped objects carry a label of the test's own making: remove them here
    // (the test's own installation's are removed when the environment ends).
    if TestEnv::external() {
        let label = format!("{}={b}", banlieue_api::INSTANCE_LABEL);
        env.kubectl(&["delete", "providerclasses,vmclasses,vmimages", "-l", &label, "--wait=false"]).await?;
        let unlabelled = format!("{}-d", env.ns);
        env.kubectl(&["delete", &format!("providerclass/{unlabelled}"), &format!("vmclass/{unlabelled}"), &format!("vmimage/{unlabelled}"), "--wait=false"]).await?;
    }
    Ok(())
}

#[test]
fn an_instance_name_that_cannot_be_a_label_or_lease_name_is_refused_by_the_binary() -> anyhow::Result<()> {
    let out = std::process::Command::new(banlieue_tests::bootstrap::banlieue()?)
        .args(["run", "--instance", "Prod_1", "--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", "/nonexistent")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--instance") && stderr.contains("Prod_1"), "{stderr}");
    Ok(())
}

/// A VM one installation adopted carries that installation's mark: another installation's VM
/// naming it is refused, the message naming the installation that holds it, and the VM is
/// left alone.
#[tokio::test]
async fn a_vm_one_installation_adopted_is_refused_to_another_naming_the_holder() -> anyhow::Result<()> {
    let env = TestEnv::start("installations-adopt").await?;
    env.install_crds().await?;
    let (a, b) = (format!("{}-a", env.instance), format!("{}-b", env.instance));
    for (tag, instance) in [("a", &a), ("b", &b)] {
        // Their classes and Providers, not their VMs (each adopts instead).
        for o in objects(&env, tag, Some(instance)).into_iter().filter(|o| o["kind"] != "VirtualMachine") {
            apply(&env.client, o).await?;
        }
    }
    let installation = |name: &str| {
        let i = Installation::new(Some(name)).expect("a valid instance name");
        move |o: &mut banlieue_controller::Options| o.installation = i
    };
    let libvirt = banlieue_libvirt::Connections::new().get(LIBVIRT).await?;
    let domain = libvirt.domain_list().await?.into_iter().find(|d| d.name == "test").ok_or_else(|| anyhow::anyhow!("test:///default has no domain `test`"))?;
    let _cp_a = ControlPlane::start_with(&env, installation(&a))?;
    let _cp_b = ControlPlane::start_with(&env, installation(&b))?;
    let adopting = |tag: &str, instance: &str| {
        let class = format!("{}-{tag}", env.ns);
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
               "metadata": {"name": format!("adopt-{tag}"), "namespace": env.ns, "labels": {banlieue_api::INSTANCE_LABEL: instance}},
               "spec": {"classRef": {"name": class}, "placement": {"providerRef": {"name": format!("p-{tag}")}},
                        "adopt": {"backendId": domain.uuid}, "deletionPolicy": "Orphan"}})
    };
    let vms: Api<VirtualMachine> = Api::namespaced(env.client.clone(), &env.ns);
    apply(&env.client, adopting("a", &a)).await?;
    wait_for(&vms, "adopt-a", 90, "Ready, adopted by installation a", ready).await?;
    apply(&env.client, adopting("b", &b)).await?;
    let refused = wait_for(&vms, "adopt-b", 90, "AlreadyManaged", |v: Option<&VirtualMachine>| {
        v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "AlreadyManaged"))
    })
    .await?;
    let message = refused.status.unwrap_or_default().conditions.into_iter().find(|c| c.type_ == "Ready").map(|c| c.message).unwrap_or_default();
    assert!(message.contains("another banlieue installation") && message.contains(&format!("/{a})")), "{message}");
    let xml = libvirt.domain_xml("test").await?;
    assert_eq!(xml.matches("machine-uid=").count(), 1, "one mark, installation a's: {xml}");
    assert!(xml.contains(&format!("/{a}\"")), "{xml}");
    for name in ["adopt-b", "adopt-a"] {
        vms.delete(name, &DeleteParams::default()).await?;
        await_deleted(&vms, name).await?;
    }
    let xml = libvirt.domain_xml("test").await?;
    assert!(!xml.contains("machine-uid="), "released: {xml}");
    Ok(())
}
