//! `banlieue bootstrap`, the real binary, on libvirtd with qemu: its temporary control plane
//! makes the management VMs, then moves banlieue's objects into "the new cluster" — a
//! second embedded API server with banlieue running on it (as it would once installed
//! there). Checked on libvirt: each VM exists once, before and after the move, and the new
//! cluster's banlieue owns them (Ready, Machines adopted by their backend UID). A rerun does
//! nothing; a bootstrap killed mid-create or mid-move and run again ends the same, with no
//! second VM.
//! `deploy/bootstrap/k0s/bootstrap.sh` does the same from Vault (OpenBao): its VMs carry the
//! k0s cloud-init with the join material read there (checked in the seed volumes on libvirt).
//! (No k0s binary can be fetched here, and the test guest does not run cloud-init: the test
//! goes up to rendered cloud-init, VMs running and the move.)

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use banlieue_api::VirtualMachine;
use banlieue_controller::Installation;
use banlieue_test_backends::libvirtd::{Leftovers, Libvirtd};
use banlieue_test_backends::openbao::OpenBao;
use banlieue_tests::bootstrap::{banlieue, config};
use banlieue_tests::control::{guests_dist, repo_root, wait_for, ControlPlane};
use banlieue_tests::TestEnv;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::ResourceExt;

/// One bootstrap at a time: each runs a whole control plane of its own, beside the new
/// cluster's, and boots VMs on the two cores there are.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Run `banlieue bootstrap` to its end (bounded); its stdout.
async fn bootstrap(config: &Path, data_dir: &Path, target: Option<&Path>) -> anyhow::Result<String> {
    bootstrap_with(config, data_dir, target, &[]).await
}

/// The banlieue installation of bootstrap tests' objects and control planes: the one of
/// [`Stage`]'s new cluster, so tests sharing a cluster act only on their own objects.
const INSTANCE: &str = "bootstrap-tests";

async fn bootstrap_with(config: &Path, data_dir: &Path, target: Option<&Path>, env: &[(&str, &str)]) -> anyhow::Result<String> {
    let mut cmd = tokio::process::Command::new(banlieue()?);
    cmd.env("BANLIEUE_INSTANCE", INSTANCE).envs(env.iter().copied());
    cmd.arg("bootstrap").arg("--config").arg(config).arg("--data-dir").arg(data_dir).arg("--builtin-dir").arg(guests_dist()).arg("--metrics-addr").arg("127.0.0.1:0").arg("--timeout").arg("180");
    if let Some(t) = target {
        cmd.arg("--target-kubeconfig").arg(t);
    }
    std::fs::create_dir_all(data_dir)?;
    let log = data_dir.join("bootstrap.log");
    let out_file = data_dir.join("bootstrap.out");
    cmd.stdout(std::fs::File::create(&out_file)?).stderr(std::fs::File::create(&log)?);
    let status = tokio::time::timeout(Duration::from_secs(300), cmd.kill_on_drop(true).status()).await;
    let stdout = std::fs::read_to_string(&out_file).unwrap_or_default();
    let tail = |p: &Path| {
        let text = std::fs::read_to_string(p).unwrap_or_default();
        text.lines().rev().take(400).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    };
    let status = status.map_err(|_| anyhow::anyhow!("banlieue bootstrap did not end within 300s: {stdout}\n{}", tail(&log)))??;
    anyhow::ensure!(status.success(), "banlieue bootstrap failed ({status}): {stdout}\n{}", tail(&log));
    Ok(stdout)
}

fn vm_ready(v: Option<&VirtualMachine>) -> bool {
    v.and_then(|v| v.status.as_ref()).is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The management VMs are Ready in the new cluster, owned there, each on libvirt once.
async fn owned_by_the_new_cluster(target: &TestEnv, lv: &Libvirtd, count: usize, uuids: &[String]) -> anyhow::Result<()> {
    let ns = &target.ns;
    let vms: Api<VirtualMachine> = Api::namespaced(target.client.clone(), ns);
    let gvk = GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", "LibvirtMachine");
    let machines: Api<DynamicObject> = Api::namespaced_with(target.client.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, "libvirtmachines"));
    for i in 0..count {
        let name = format!("mgmt-{i}");
        // Adopted: the new cluster's banlieue mirrored its own Machine into the VM (the status
        // that came with the move names the old cluster's Machine).
        let m = machines.get(&name).await?;
        let uid = m.uid();
        let vm = wait_for(&vms, &name, 120, "Ready in the new cluster, reporting its Machine there", |v: Option<&VirtualMachine>| {
            vm_ready(v) && v.and_then(|v| v.status.as_ref()).and_then(|s| s.infrastructure_ref.as_ref()).is_some_and(|r| r.uid == uid)
        })
        .await?;
        assert!(m.annotations().get("banlieue.io/backend-uid").is_some_and(|u| !u.is_empty() && Some(u) != m.uid().as_ref()), "{name}: adopted by its backend UID");
        assert!(!m.annotations().contains_key("cluster.x-k8s.io/paused"), "{name}: not paused any more");
        assert!(m.owner_references().iter().any(|o| o.kind == "VirtualMachine" && Some(&o.uid) == vm.metadata.uid.as_ref()), "{name}: owned by its VM here");
    }
    let domains = lv.domains(&format!("{ns}_mgmt-"))?;
    assert_eq!(domains.len(), count, "each VM exists once on libvirt: {domains:?}");
    let now: Vec<String> = domains.iter().map(|d| lv.uuid(d)).collect::<anyhow::Result<_>>()?;
    assert_eq!(now, uuids, "the same domains as before the move");
    Ok(())
}

/// A new cluster (its own API server, with banlieue running as if installed there) and a
/// bootstrap config of two management VMs on `lv`, with the data directory to keep.
struct Stage {
    target: TestEnv,
    _cp: ControlPlane,
    _leftovers: Leftovers,
    file: PathBuf,
    data: PathBuf,
}

impl Stage {
    async fn new(test: &str, lv: &'static Libvirtd) -> anyhow::Result<Stage> {
        let target = TestEnv::start(test).await?;
        target.install_crds().await?;
        let _cp = ControlPlane::start_with(&target, |o| o.installation = Installation::new(Some(INSTANCE)).expect("a valid name"))?;
        let _leftovers = Leftovers { lv, prefix: format!("{}_mgmt-", target.ns), volumes: vec![] };
        let file = target.dir().join("bootstrap.yaml");
        std::fs::write(&file, config(&target.ns, Some(INSTANCE), lv, 2))?;
        let data = target.dir().join("bootstrap-data");
        Ok(Stage { target, _cp, _leftovers, file, data })
    }
}

/// Deleting the VMs in the new cluster removes them from libvirt: its banlieue owns them.
async fn deleted_by_the_new_cluster(target: &TestEnv, lv: &Libvirtd, count: usize) -> anyhow::Result<()> {
    let vms: Api<VirtualMachine> = Api::namespaced(target.client.clone(), &target.ns);
    for i in 0..count {
        vms.delete(&format!("mgmt-{i}"), &Default::default()).await?;
    }
    for i in 0..count {
        banlieue_tests::await_deleted(&vms, &format!("mgmt-{i}")).await?;
    }
    let prefix = format!("{}_mgmt-", target.ns);
    assert_eq!(lv.domains(&prefix)?, Vec::<String>::new(), "the new cluster's banlieue deleted the domains");
    assert_eq!(lv.volumes(&prefix)?, Vec::<String>::new(), "and their volumes");
    Ok(())
}

/// The whole bootstrap, then (after) one killed mid-create and run again.
#[tokio::test]
async fn bootstrap_makes_the_vms_then_moves_them_into_the_new_cluster_and_resumes_when_killed() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let lv = Libvirtd::shared()?;
    let Stage { target, _cp, _leftovers, file, data } = Stage::new("bootstrap", lv).await?;
    let ns = target.ns.clone();

    // Without a target, bootstrap stops once the VMs are Ready: two domains on libvirt.
    let out = bootstrap(&file, &data, None).await?;
    assert!(out.contains("phase wait: 2 VirtualMachines Ready"), "{out}");
    let domains = lv.domains(&format!("{ns}_mgmt-"))?;
    assert_eq!(domains.len(), 2, "{domains:?}");
    let uuids: Vec<String> = domains.iter().map(|d| lv.uuid(d)).collect::<anyhow::Result<_>>()?;

    // Run again with the target, and die (abort, as a kill would) mid-move, once the first
    // objects are in the new cluster: whatever of the VMs is there is paused, nothing is
    // made twice on libvirt, and the move is not recorded as done.
    let abort = [("BANLIEUE_BOOTSTRAP_ABORT_AFTER_OBJECTS", "8")];
    let err = bootstrap_with(&file, &data, Some(&target.kubeconfig), &abort).await.unwrap_err().to_string();
    assert!(err.contains("aborting mid-move"), "{err}");
    assert!(!data.join("moved").exists());
    let vms_there: Api<VirtualMachine> = Api::namespaced(target.client.clone(), &ns);
    assert!(vms_there.list(&Default::default()).await?.items.len() < 2, "cut off before every VM moved");
    let machines_there: Api<DynamicObject> = Api::namespaced_with(
        target.client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("infrastructure.banlieue.io", "v1alpha1", "LibvirtMachine"), "libvirtmachines"),
    );
    let moved_machines = machines_there.list(&Default::default()).await?.items;
    assert!(!moved_machines.is_empty() && moved_machines.iter().all(|m| m.annotations().contains_key("cluster.x-k8s.io/paused")), "the Machines moved so far wait, paused");
    assert_eq!(lv.domains(&format!("{ns}_mgmt-"))?.len(), 2);

    // Run again: it resumes (no new VM) and finishes the move.
    let out = bootstrap(&file, &data, Some(&target.kubeconfig)).await?;
    assert!(out.contains("phase move:"), "{out}");
    owned_by_the_new_cluster(&target, &lv, 2, &uuids).await?;

    // Once moved, a rerun does nothing.
    let out = bootstrap(&file, &data, Some(&target.kubeconfig)).await?;
    assert!(out.contains("already moved"), "{out}");
    assert_eq!(lv.domains(&format!("{ns}_mgmt-"))?.len(), 2);
    deleted_by_the_new_cluster(&target, lv, 2).await?;
    drop(_cp);
    killed_mid_create_resumes_to_the_same_end(lv).await
}

async fn killed_mid_create_resumes_to_the_same_end(lv: &'static Libvirtd) -> anyhow::Result<()> {
    let Stage { target, _cp, _leftovers, file, data } = Stage::new("bootstrap-kill", lv).await?;
    let ns = target.ns.clone();

    // Killed (SIGKILL) once its first domain runs, the others still being made. (Killed
    // inside libvirt's own domain start, a domain can stay paused: the driver starts it
    // afresh on the rerun.)
    let mut child = tokio::process::Command::new(banlieue()?)
        .env("BANLIEUE_INSTANCE", INSTANCE)
        .arg("bootstrap")
        .arg("--config")
        .arg(&file)
        .arg("--data-dir")
        .arg(&data)
        .arg("--builtin-dir")
        .arg(guests_dist())
        .arg("--metrics-addr")
        .arg("127.0.0.1:0")
        .arg("--target-kubeconfig")
        .arg(&target.kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let prefix = format!("{ns}_mgmt-");
    banlieue_test_backends::libvirtd::wait_for("a first running domain", Duration::from_secs(120), || {
        let running = lv.domains(&prefix)?.iter().any(|d| lv.state(d).is_ok_and(|s| s.trim() == "running"));
        Ok(running.then_some(()))
    })
    .await?;
    child.kill().await?;
    assert!(!data.join("moved").exists(), "killed before the move");

    // Run again: the same end as an uninterrupted bootstrap, and no VM made twice.
    let out = bootstrap(&file, &data, Some(&target.kubeconfig)).await?;
    assert!(out.contains("phase move:"), "{out}");
    let domains = lv.domains(&prefix)?;
    let uuids: Vec<String> = domains.iter().map(|d| lv.uuid(d)).collect::<anyhow::Result<_>>()?;
    owned_by_the_new_cluster(&target, &lv, 2, &uuids).await?;
    deleted_by_the_new_cluster(&target, lv, 2).await
}

#[tokio::test]
async fn bad_bootstrap_configs_and_targets_are_named_and_move_nothing() -> anyhow::Result<()> {
    let lv = Libvirtd::shared()?;
    let env = TestEnv::start("bootstrap-bad").await?;
    let ns = env.ns.clone();
    let good = config(&ns, Some(INSTANCE), &lv, 1);
    let data = env.dir().join("bootstrap-data");
    for (broken, needle) in [
        (good.replace("imageRef: {name: ", "imageRef: {name: missing-"), "VMImage \"missing-"),
        (good.replace("providerRef: {name: kvm}", "providerRef: {name: nowhere}"), "\"nowhere\""),
    ] {
        let file = env.dir().join("broken.yaml");
        std::fs::write(&file, broken)?;
        let err = bootstrap(&file, &data, None).await.unwrap_err().to_string();
        assert!(err.contains(needle), "names what is missing ({needle}): {err}");
    }
    assert!(lv.domains(&format!("{ns}_mgmt-"))?.is_empty(), "nothing was made");

    // A new cluster that does not answer when the move comes: named, and nothing moved (the
    // VM stays with the temporary control plane, for a rerun once the cluster answers).
    let _one = ONE_AT_A_TIME.lock().await;
    let _leftovers = Leftovers { lv, prefix: format!("{ns}_mgmt-"), volumes: vec![] };
    let (unreachable, _) = banlieue_tests::unreachable_kubeconfig(env.dir(), "unreachable.kubeconfig")?;
    let file = env.dir().join("good.yaml");
    std::fs::write(&file, &good)?;
    let err = bootstrap(&file, &data, Some(&unreachable)).await.unwrap_err().to_string();
    assert!(err.contains("cannot be reached; nothing was moved") && err.contains("unreachable.kubeconfig"), "{err}");
    assert!(!data.join("moved").exists());
    assert_eq!(lv.domains(&format!("{ns}_mgmt-"))?.len(), 1, "the VM was made once, and kept");
    Ok(())
}

/// `deploy/bootstrap/k0s/bootstrap.sh` with `args` and the Vault address and token; its
/// output (stdout and stderr) and whether it succeeded.
async fn k0s_script(args: &[&str], bao: &OpenBao, token: &str) -> anyhow::Result<(bool, String)> {
    let script = repo_root().join("deploy/bootstrap/k0s/bootstrap.sh");
    let run = tokio::process::Command::new("bash")
        .arg(&script)
        .args(args)
        .env("VAULT_ADDR", &bao.address)
        .env("VAULT_TOKEN", token)
        .env_remove("BAO_ADDR")
        .env_remove("BAO_TOKEN")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(420), run).await.map_err(|_| anyhow::anyhow!("{} did not end within 420s", script.display()))??;
    Ok((out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))))
}

/// The k0s bootstrap script, from Vault to the move: the controller's seed carries the CA and
/// the token's Secret, the worker's the join token — as read from OpenBao with a token that
/// may only read them; a dry run makes nothing; a Vault path that is not there is named.
#[tokio::test]
async fn the_k0s_script_reads_vault_renders_cloud_init_makes_the_vms_and_moves_them() -> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
    let lv = Libvirtd::shared()?;
    let bao = OpenBao::start().await?;
    let target = TestEnv::start("k0s").await?;
    target.install_crds().await?;
    // The script's objects carry no installation label, as it writes them: the default
    // installation acts on them (no other test of this suite runs it, one bootstrap at a time).
    let _cp = ControlPlane::start_with(&target, |o| o.installation = Default::default())?;
    let ns = target.ns.clone();
    let _leftovers = Leftovers { lv, prefix: format!("{ns}_mgmt-"), volumes: vec![] };

    // k0s's join material, as `k0s token pre-shared` and a CA would give it (the values are
    // the test's own: nothing here runs k0s).
    let join_token = format!("H4sIAAAAAAAC-join-token-of-{ns}");
    let ca = format!("-----BEGIN CERTIFICATE-----\nMIIC-ca-of-{ns}\n-----END CERTIFICATE-----");
    let token_secret = format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: bootstrap-token-{}\n  namespace: kube-system\ntype: bootstrap.kubernetes.io/token", &ns[ns.len() - 6..]);
    bao.put_kv2("secret", &format!("k0s/{ns}"), &[("ca.crt", &ca), ("ca.key", "-----BEGIN PRIVATE KEY-----\nca-key\n-----END PRIVATE KEY-----"), ("worker-token", &join_token), ("worker-token-secret", &token_secret)]).await?;
    bao.write_policy("k0s-bootstrap", &format!("path \"secret/data/k0s/{ns}\" {{ capabilities = [\"read\"] }}")).await?;
    let reader = bao.create_token(&["k0s-bootstrap"], 900, 900).await?;

    let data = target.dir().join("k0s");
    let settings = |k0s_path: &str| {
        format!(
            "BACKEND=libvirt\nLIBVIRT_URI='{}'\nLIBVIRT_POOL={}\nLIBVIRT_NETWORK={}\nVAULT_K0S_PATH={k0s_path}\nCOUNT=2\nCPUS=1\nMEMORY_MIB=256\nDISK_GIB=2\nPOWER_OFF_TIMEOUT=5\n\
             NAMESPACE={ns}\nPROVIDER_CLASS={ns}-lv\nNODE_CLASS={ns}-node\nIMAGE_BACKING_FILE={}\nK0S_URL=https://k0s.example/k0s\nCONTROLLER_ADDRESS=192.0.2.10\n\
             DATA_DIR={}\nBANLIEUE={}\nBANLIEUE_BUILTIN_DIR={}\nVM_TIMEOUT=180\nAPI_TIMEOUT=30\n",
            lv.uri,
            lv.pool,
            lv.network,
            lv.guest_disk(),
            data.display(),
            banlieue().map(|p| p.display().to_string()).unwrap_or_default(),
            guests_dist().display()
        )
    };
    let file = target.dir().join("settings.env");
    let file_arg = file.display().to_string();
    let kubeconfig = target.kubeconfig.display().to_string();
    let prefix = format!("{ns}_mgmt-");

    let (ok, help) = k0s_script(&["--help"], &bao, &reader).await?;
    assert!(ok && help.contains("Usage:") && help.contains("worker-token"), "{help}");

    // A path Vault does not have: named, nothing made.
    std::fs::write(&file, settings(&format!("k0s/{ns}-missing")))?;
    let (ok, out) = k0s_script(&["--settings", &file_arg, "--target-kubeconfig", &kubeconfig], &bao, &reader).await?;
    assert!(!ok && out.contains(&format!("secret/k0s/{ns}-missing")), "names the Vault path: {out}");

    // A dry run reads Vault and writes the config, and makes nothing.
    std::fs::write(&file, settings(&format!("k0s/{ns}")))?;
    let (ok, out) = k0s_script(&["--settings", &file_arg, "--target-kubeconfig", &kubeconfig, "--dry-run"], &bao, &reader).await?;
    assert!(ok && out.contains("would run:") && out.contains("bootstrap --config"), "{out}");
    assert!(!out.contains(&join_token), "the dry run prints no secret: {out}");
    assert!(lv.domains(&prefix)?.is_empty(), "a dry run makes no VM");

    // The real run: VMs made with their cloud-init, then moved into the new cluster.
    let (ok, out) = k0s_script(&["--settings", &file_arg, "--target-kubeconfig", &kubeconfig], &bao, &reader).await?;
    assert!(ok, "{out}\n{}", std::fs::read_to_string(data.join("control-plane/bootstrap.log")).unwrap_or_default());
    assert!(out.contains("phase move:"), "{out}");
    assert!(!out.contains(&join_token), "the script prints no secret: {out}");

    // libvirt's seed volumes carry what Vault holds: the CA and the token's Secret on the
    // controller, the join token on the worker.
    let controller = lv.seed_file(&format!("{ns}_mgmt-0"), "user-data")?;
    assert!(controller.starts_with("#cloud-config\n"), "{controller}");
    assert!(controller.contains("MIIC-ca-of-") && controller.contains(&format!("name: bootstrap-token-{}", &ns[ns.len() - 6..])), "{controller}");
    assert!(controller.contains("[k0s, install, controller, --enable-worker]") && controller.contains("https://k0s.example/k0s"), "{controller}");
    assert!(!controller.contains(&join_token), "the controller needs no join token: {controller}");
    let worker = lv.seed_file(&format!("{ns}_mgmt-1"), "user-data")?;
    assert!(worker.contains(&join_token) && worker.contains("[k0s, install, worker, --token-file, /etc/k0s/join-token]"), "{worker}");
    assert!(!worker.contains("ca-key"), "a worker gets no CA key: {worker}");

    // The new cluster got deploy/ and owns the VMs, each once on libvirt.
    let deployments = target.kubectl(&["get", "deployments", "-n", "banlieue-system", "-o", "name"]).await?;
    assert!(deployments.contains("deployment.apps/"), "deploy/ installed: {deployments}");
    let uuids: Vec<String> = lv.domains(&prefix)?.iter().map(|d| lv.uuid(d)).collect::<anyhow::Result<_>>()?;
    owned_by_the_new_cluster(&target, lv, 2, &uuids).await?;

    // Run again: nothing new.
    let (ok, out) = k0s_script(&["--settings", &file_arg, "--target-kubeconfig", &kubeconfig], &bao, &reader).await?;
    assert!(ok && out.contains("already moved"), "{out}");
    assert_eq!(lv.domains(&prefix)?.len(), 2);
    deleted_by_the_new_cluster(&target, lv, 2).await
}
