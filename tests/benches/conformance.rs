//! `banlieue provider conformance` run time per built-in driver and backend: the binary as an
//! author runs it, BENCH_RUNS times each (default 3) on the libvirt test driver, vcsim and
//! fakepve, and BENCH_LIBVIRTD_RUNS times (default 1) on libvirtd + qemu, whose guests boot.
//! Medians of the whole run, with the backend calls it made and its slowest behaviour.
//!
//! `cargo bench --profile dev -p banlieue-tests --bench conformance` (needs root for libvirtd,
//! `guests/build.sh`, vcsim, fakepve and `cargo build -p banlieue`).

use std::time::Instant;

use banlieue_test_backends::fakepve::{self, FakePve};
use banlieue_test_backends::libvirtd::Libvirtd;
use banlieue_test_backends::vcsim::{self, Vcsim};
use banlieue_tests::bench::{env_or, median};
use banlieue_tests::conformance::{conformance, driver, manifests, provider, secret, CREDENTIALS};
use serde_json::{json, Value};

fn main() -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(bench())
}

/// Run one backend's conformance `runs` times; the medians as a table row.
async fn measure(what: &str, runs: usize, args: &[&str]) -> anyhow::Result<()> {
    let (mut secs, mut calls, mut slowest) = (Vec::new(), Vec::new(), String::new());
    for _ in 0..runs {
        let t = Instant::now();
        let (code, report, stderr) = conformance(args).await?;
        secs.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(code == 0, "{what}: exit {code}\n{report:#}\n{stderr}");
        let outcomes = report["outcomes"].as_array().cloned().unwrap_or_default();
        let detail = |b: &str| outcomes.iter().find(|o| o["behaviour"] == b).and_then(|o| o["detail"].as_str()).unwrap_or_default().to_string();
        calls.push(detail("within-grant").split(' ').next().and_then(|n| n.parse::<f64>().ok()).unwrap_or(0.0));
        if let Some(o) = outcomes.iter().max_by(|a, b| a["seconds"].as_f64().unwrap_or(0.0).total_cmp(&b["seconds"].as_f64().unwrap_or(0.0))) {
            slowest = format!("{} {:.2}s", o["behaviour"].as_str().unwrap_or_default(), o["seconds"].as_f64().unwrap_or(0.0));
        }
    }
    println!("{what:<32} {runs:>4} {:>10.2} {:>12.0}  {slowest}", median(secs), median(calls));
    Ok(())
}

async fn bench() -> anyhow::Result<()> {
    let runs = env_or("BENCH_RUNS", 3usize);
    let dir = tempfile::tempdir()?;
    println!("{:<32} {:>4} {:>10} {:>12}  slowest behaviour (last run)", "driver on backend", "runs", "median s", "backend calls");

    let at = |name: &str, objects: &[Value]| -> anyhow::Result<String> {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d)?;
        Ok(manifests(&d, objects)?.display().to_string())
    };

    let files = at("test", &[provider("test:///default", json!({}), ("standard", "default-pool"), ("default", "default"))])?;
    measure("libvirt on test:///default", runs, &["--driver", &driver("provider-libvirt"), "-f", &files, "--image", "backing-file:/var/lib/banlieue/images/base.qcow2"]).await?;

    let vc = Vcsim::start().await?;
    let files = at("vcsim", &[provider(&vc.url, serde_json::from_str(CREDENTIALS)?, ("standard", "LocalDS_0"), ("default", "VM Network")), secret(&[("username", vcsim::USERNAME), ("password", vcsim::PASSWORD)])])?;
    measure("vsphere on vcsim", runs, &["--driver", &driver("provider-vsphere"), "-f", &files, "--image", &format!("template:{}", vcsim::TEMPLATE)]).await?;
    drop(vc);

    let pve = FakePve::start().await?;
    let files = at("pve", &[provider(&pve.proxy_url, serde_json::from_str(CREDENTIALS)?, ("standard", "local-lvm"), ("default", "vmbr0")), secret(&[("username", &pve.username), ("password", &pve.password)])])?;
    let template = format!("template:{}", fakepve::TEMPLATE_VMID);
    measure("proxmox on fakepve", runs, &["--driver", &driver("provider-proxmox"), "-f", &files, "--image", &template, "--failure-domain", "pve1"]).await?;
    drop(pve);

    let lv = Libvirtd::shared()?;
    let files = at("libvirtd", &[provider(&lv.uri, json!({}), ("standard", &lv.pool), ("default", &lv.network))])?;
    let disk = format!("backing-file:{}", lv.guest_disk());
    measure("libvirt on libvirtd + qemu", env_or("BENCH_LIBVIRTD_RUNS", 1usize), &["--driver", &driver("provider-libvirt"), "-f", &files, "--image", &disk, "--disk-gib", "1"]).await?;
    Ok(())
}
