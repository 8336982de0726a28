//! `banlieue provider conformance` as a driver author runs it: the binary, a Provider manifest
//! and its Secret, against each built-in driver on its real backend (the libvirt test driver,
//! libvirtd + qemu, vcsim, fakepve) — every required behaviour passes, and each backend's own
//! API shows nothing left behind and one login — and against the minimal example, whose
//! failures are the ones the authors' guide lists. No Kubernetes is involved.

use banlieue_test_backends::fakepve::FakePve;
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::conformance::{conformance, driver, manifests, provider, secret, CREDENTIALS};
use serde_json::{json, Value};

/// The outcomes by behaviour: (status, detail).
fn outcomes(report: &Value) -> Vec<(String, String, bool)> {
    report["outcomes"]
        .as_array()
        .map(|v| v.iter().map(|o| (o["behaviour"].as_str().unwrap_or_default().to_string(), o["status"].as_str().unwrap_or_default().to_string(), o["required"].as_bool().unwrap_or(true))).collect())
        .unwrap_or_default()
}

/// Every required behaviour passed or does not apply, and the ones named ran and passed.
fn assert_conforms(code: i32, report: &Value, stderr: &str, must_pass: &[&str]) {
    let all = outcomes(report);
    let failed: Vec<_> = all.iter().filter(|(_, s, required)| *required && s == "failed").collect();
    assert!(code == 0 && failed.is_empty(), "exit {code}, failed {failed:?}\n{report:#}\n{stderr}");
    for b in must_pass {
        assert!(all.iter().any(|(n, s, _)| n == b && s == "passed"), "{b} did not run and pass: {all:?}");
    }
}

const LIFECYCLE: &[&str] = &[
    "probe", "create", "describe", "create-idempotent", "power-off-hard", "power-off-soft", "power-off-try-soft", "power-on", "restart", "delete", "delete-again",
    "describe-after-delete", "create-after-crash", "invalid-spec", "within-limits", "within-grant",
];

#[tokio::test]
async fn the_libvirt_driver_conforms_on_libvirts_test_driver_and_says_so_in_junit() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let files = manifests(dir.path(), &[provider("test:///default", json!({}), ("standard", "default-pool"), ("default", "default"))])?;
    let junit = dir.path().join("junit.xml");
    let (code, report, stderr) = conformance(&[
        "--driver", &driver("provider-libvirt"), "-f", &files.display().to_string(), "--image", "backing-file:/var/lib/banlieue/images/base.qcow2",
        "--junit", &junit.display().to_string(),
    ])
    .await?;
    assert_conforms(code, &report, &stderr, LIFECYCLE);
    // Without HTTP or credentials these do not apply, and say why.
    let all = outcomes(&report);
    for b in ["wrong-credentials", "backend-down", "session-reuse"] {
        assert!(all.iter().any(|(n, s, _)| n == b && s == "not-applicable"), "{b}: {all:?}");
    }
    let xml = std::fs::read_to_string(&junit)?;
    assert!(xml.contains("failures=\"0\"") && xml.contains("<testcase classname=\"required\" name=\"create-after-crash\""), "{xml}");
    Ok(())
}

#[tokio::test]
async fn the_vsphere_driver_conforms_on_vcsim_with_one_login_and_nothing_left() -> anyhow::Result<()> {
    let vc = Vcsim::start().await?;
    let dir = tempfile::tempdir()?;
    let files = manifests(
        dir.path(),
        &[
            provider(&vc.url, serde_json::from_str(CREDENTIALS)?, ("standard", "LocalDS_0"), ("default", "VM Network")),
            secret(&[("username", vcsim::USERNAME), ("password", vcsim::PASSWORD)]),
        ],
    )?;
    let (code, report, stderr) = conformance(&["--driver", &driver("provider-vsphere"), "-f", &files.display().to_string(), "--image", &format!("template:{}", vcsim::TEMPLATE)]).await?;
    let mut must = LIFECYCLE.to_vec();
    must.extend(["wrong-credentials", "backend-down", "session-reuse"]);
    assert_conforms(code, &report, &stderr, &must);
    // On vcsim itself: no machine left, and one session for the whole run (the refused
    // credentials made none).
    let left: Vec<String> = vc.vm_names().await?.into_iter().filter(|n| n.starts_with("conformance-")).collect();
    assert!(left.is_empty(), "left on vcsim: {left:?}");
    assert_eq!(vc.login_count().await?, 1, "sessions on vcsim after the run");
    Ok(())
}

#[tokio::test]
async fn the_proxmox_driver_conforms_on_fakepve_with_one_login_and_nothing_left() -> anyhow::Result<()> {
    let pve = FakePve::start().await?;
    let dir = tempfile::tempdir()?;
    let files = manifests(
        dir.path(),
        &[
            provider(&pve.proxy_url, serde_json::from_str(CREDENTIALS)?, ("standard", "local-lvm"), ("default", "vmbr0")),
            secret(&[("username", &pve.username), ("password", &pve.password)]),
        ],
    )?;
    let (code, report, stderr) = conformance(&[
        "--driver", &driver("provider-proxmox"), "-f", &files.display().to_string(), "--image", &format!("template:{}", banlieue_test_backends::fakepve::TEMPLATE_VMID),
        "--failure-domain", "pve1",
    ])
    .await?;
    let mut must = LIFECYCLE.to_vec();
    must.extend(["wrong-credentials", "backend-down", "session-reuse"]);
    assert_conforms(code, &report, &stderr, &must);
    let left: Vec<String> = pve.vms().await?.into_iter().map(|v| v.name).filter(|n| n.starts_with("conformance-")).collect();
    assert!(left.is_empty(), "left on fakepve: {left:?}");
    // The proxy counts ticket logins: the good credentials logged in once; the wrong ones tried once.
    assert_eq!(pve.logins(), 2, "ticket requests seen by fakepve's proxy");
    Ok(())
}

#[tokio::test]
async fn the_libvirt_driver_conforms_on_libvirtd_with_a_guest_that_boots() -> anyhow::Result<()> {
    let lv = Libvirtd::shared()?;
    let dir = tempfile::tempdir()?;
    let files = manifests(dir.path(), &[provider(&lv.uri, json!({}), ("standard", &lv.pool), ("default", &lv.network))])?;
    let (code, report, stderr) = conformance(&["--driver", &driver("provider-libvirt"), "-f", &files.display().to_string(), "--image", &format!("backing-file:{}", lv.guest_disk()), "--disk-gib", "1"]).await?;
    let left = lv.domains("conformance_")?;
    assert_conforms(code, &report, &stderr, LIFECYCLE);
    assert!(left.is_empty(), "domains left on libvirtd: {left:?}");
    // The guest boots: its console and display are where the driver says.
    let all = outcomes(&report);
    assert!(all.iter().any(|(n, s, _)| n == "console" && s == "supported"), "{all:?}");
    Ok(())
}

/// The skeleton a new author starts from: what it fails is what they must write (listed in
/// docs/provider-authors.md), and the run says so with exit code 1.
#[tokio::test]
async fn the_minimal_example_fails_exactly_what_a_stateless_skeleton_cannot_do() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let files = manifests(dir.path(), &[provider("https://minimal.invalid", json!({}), ("standard", "any"), ("default", "any"))])?;
    let (code, report, stderr) = conformance(&["--driver", &driver("minimal-provider"), "-f", &files.display().to_string(), "--image", "template:any"]).await?;
    assert_eq!(code, 1, "{report:#}\n{stderr}");
    let mut failed: Vec<String> = outcomes(&report).into_iter().filter(|(_, s, r)| *r && s == "failed").map(|(n, ..)| n).collect();
    failed.sort();
    assert_eq!(failed, ["create-after-crash", "describe-after-delete", "invalid-spec", "power-off-hard", "power-off-soft", "power-off-try-soft"], "{report:#}");
    Ok(())
}

/// Refused before any behaviour runs, with exit code 2: a component of another contract (or
/// version, naming both), manifests that name no backend. A backend that does not answer
/// fails the probe quickly, and nothing else runs.
#[tokio::test]
async fn what_cannot_be_checked_is_refused_clearly_and_quickly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let files = manifests(dir.path(), &[provider("test:///default", json!({}), ("standard", "default-pool"), ("default", "default"))])?;
    let files = files.display().to_string();

    let (code, _, stderr) = conformance(&["--driver", &driver("placement-spread"), "-f", &files, "--image", "template:x"]).await?;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("IncompatibleContract") && stderr.contains("is it a provider component?"), "{stderr}");

    let old = dir.path().join("driver-0.1.wasm");
    std::fs::write(&old, wat::parse_str(banlieue_tests::DRIVER_0_1)?)?;
    let (code, _, stderr) = conformance(&["--driver", &old.display().to_string(), "-f", &files, "--image", "template:x"]).await?;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("IncompatibleContract") && stderr.contains("@0.1.0") && stderr.contains(banlieue_runtime::PROVIDER_VERSION), "names both versions: {stderr}");

    let nowhere = manifests(dir.path(), &[provider("", json!({}), ("standard", "x"), ("default", "x"))])?;
    let (code, _, stderr) = conformance(&["--driver", &driver("provider-libvirt"), "-f", &nowhere.display().to_string(), "--image", "template:x"]).await?;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("names no backend"), "{stderr}");

    // vSphere on a port nothing listens on: unavailable, at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let down = manifests(
        dir.path(),
        &[provider(&format!("https://127.0.0.1:{port}"), serde_json::from_str(CREDENTIALS)?, ("standard", "x"), ("default", "x")), secret(&[("username", "u"), ("password", "p")])],
    )?;
    let started = std::time::Instant::now();
    let (code, report, stderr) = conformance(&["--driver", &driver("provider-vsphere"), "-f", &down.display().to_string(), "--image", "template:x"]).await?;
    assert_eq!(code, 1, "{stderr}");
    let all = report["outcomes"].as_array().cloned().unwrap_or_default();
    assert_eq!(all.len(), 1, "nothing but the probe runs: {report:#}");
    let detail = all[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("unavailable") && detail.ends_with("nothing else was run"), "{detail}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60), "took {:?}", started.elapsed());
    Ok(())
}
