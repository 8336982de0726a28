//! What a placement policy author waits for: `banlieue placement explain` over BENCH_DOMAINS
//! failure domains (default 10,000: 100 Providers of 100 each, 2,000 placed VMs), from a
//! `kubectl get -o yaml`-shaped file — the whole process (reading the objects, the host's
//! hard constraints, ranking the top 10 and the top 1 with the built-in spread) — beside
//! `banlieue placement bench` (one `choose` over as many generated candidates), BENCH_RUNS
//! times each (default 3). Medians.
//!
//! `cargo bench --profile dev -p banlieue-tests --bench placement` (needs `guests/build.sh`
//! and `cargo build -p banlieue`).

use std::time::Instant;

use banlieue_tests::bench::{env_or, median};
use banlieue_tests::control::repo_root;
use serde_json::{json, Value};

fn main() -> anyhow::Result<()> {
    let domains = env_or("BENCH_DOMAINS", 10_000usize);
    let runs = env_or("BENCH_RUNS", 3usize);
    let per = 100.min(domains).max(1);
    let providers = domains.div_ceil(per);
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("objects.yaml");
    let mut docs: Vec<Value> = vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
               "spec": {"cpus": 2, "memoryMiB": 2048, "disks": [{"name": "root", "sizeGiB": 20, "storageClass": "fast"}], "nics": [{"name": "eth0", "networkClass": "lan"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "debian"},
               "spec": {"sources": [{"providerClass": "libvirt", "backingFile": "/images/debian.qcow2"}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web", "namespace": "bench", "uid": "u-web", "labels": {"app": "web"}},
               "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}}}),
    ];
    for p in 0..providers {
        let fds: Vec<Value> = (0..per)
            .map(|d| json!({"name": format!("fd-{d}"), "labels": {"topology.kubernetes.io/zone": format!("z{}", d % 3)},
                             "capacity": {"cpus": 64, "memoryMiB": 65536 + ((p * per + d) % 97) * 512, "storageGiB": 1000},
                             "storageClasses": ["fast"], "networkClasses": ["lan"]}))
            .collect();
        docs.push(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": format!("p{p}"), "namespace": "bench"},
            "spec": {"providerClassRef": {"name": "libvirt"}, "connection": {"endpoint": "test:///default"},
                     "capabilities": {"storageClasses": {"fast": "pool"}, "networkClasses": {"lan": "default"}}},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Probed", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                       "failureDomains": fds}}));
    }
    for v in 0..domains / 5 {
        docs.push(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": format!("vm-{v}"), "namespace": "bench", "uid": format!("u-{v}"), "labels": {"app": if v % 2 == 0 { "web" } else { "db" }}},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}},
            "status": {"scheduled": {"provider": format!("p{}", v % providers), "failureDomain": format!("fd-{}", (v * 7) % per), "providerClass": "libvirt"}}}));
    }
    let yaml: Vec<String> = docs.iter().map(serde_yaml::to_string).collect::<Result<_, _>>()?;
    std::fs::write(&file, yaml.join("---\n"))?;
    let banlieue = banlieue_tests::bootstrap::banlieue()?;
    let builtin = repo_root().join("guests/dist");
    let run = |args: &[&str]| -> anyhow::Result<(f64, String)> {
        let t = Instant::now();
        let out = std::process::Command::new(&banlieue).args(args).env("BANLIEUE_BUILTIN_DIR", &builtin).output()?;
        anyhow::ensure!(out.status.success(), "banlieue {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        Ok((t.elapsed().as_secs_f64(), String::from_utf8_lossy(&out.stdout).into_owned()))
    };
    let file = file.to_string_lossy().into_owned();
    println!("{domains} failure domains ({providers} Providers), {} placed VMs, {runs} runs each, medians:", domains / 5);
    for top in ["10", "1"] {
        let mut secs = vec![];
        let mut ranked = 0;
        for _ in 0..runs {
            let (s, out) = run(&["placement", "explain", "web", "-n", "bench", "--from", &file, "--top", top])?;
            secs.push(s);
            ranked = out.lines().filter(|l| l.contains("score")).count();
        }
        println!("  placement explain --top {top:<3}  {:>7.2} s  ({ranked} ranked)", median(secs));
    }
    let mut secs = vec![];
    let mut said = String::new();
    for _ in 0..runs {
        let (s, out) = run(&["placement", "bench", "builtin:spread", "--candidates", &domains.to_string(), "--runs", "10"])?;
        secs.push(s);
        said = out;
    }
    println!("  placement bench (process, 10 calls) {:>7.2} s; its own figures:\n{said}", median(secs));
    Ok(())
}
