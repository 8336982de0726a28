//! `banlieue provider conformance`: the provider contract's behaviours against a driver
//! component and the live backend its Provider manifest names (see `banlieue_conformance`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use banlieue_runtime::{CallError, Runtime, RuntimeConfig};

use crate::component::AuthArgs;

#[derive(clap::Args)]
pub struct ConformanceArgs {
    /// The driver: a `.wasm` file, or an `oci://` reference (verified with --key, or --allow-unsigned).
    #[arg(long)]
    driver: String,
    /// A public key the `oci://` driver's signature must verify with (repeatable).
    #[arg(long = "key")]
    keys: Vec<PathBuf>,
    /// Run an `oci://` driver without checking its signature.
    #[arg(long)]
    allow_unsigned: bool,
    /// Manifests holding the Provider and the Secret its credentialsRef names (repeatable;
    /// multi-document YAML).
    #[arg(short = 'f', long = "filename", required = true)]
    files: Vec<PathBuf>,
    /// The boot image of the machines made: `template:NAME` or `backing-file:PATH`.
    #[arg(long)]
    image: String,
    /// The failure domain to use (default: the first the probe reports).
    #[arg(long)]
    failure_domain: Option<String>,
    /// The Provider's storage class for the boot disk (default: its first).
    #[arg(long)]
    storage_class: Option<String>,
    /// The Provider's network class for the NIC (default: its first).
    #[arg(long)]
    network_class: Option<String>,
    /// The boot disk's size.
    #[arg(long, default_value_t = 4)]
    disk_gib: u64,
    /// Seconds one driver call may take.
    #[arg(long, default_value_t = 120)]
    call_timeout: u64,
    /// Seconds a guest is given to honour a soft power-off.
    #[arg(long, default_value_t = 120)]
    soft_off_timeout: u64,
    /// At most this many crash points in create (1st, middle, last changing backend call).
    #[arg(long, default_value_t = 3)]
    crash_points: usize,
    /// Also write the outcomes as JUnit XML to this file.
    #[arg(long)]
    junit: Option<PathBuf>,
    /// Print the outcomes as JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    auth: AuthArgs,
}

/// Exit codes: 0 every required behaviour passed, 1 some failed, 2 the run could not start.
pub async fn run(args: ConformanceArgs) -> anyhow::Result<()> {
    if let Err(e) = conform(args).await {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
    Ok(())
}

async fn conform(args: ConformanceArgs) -> anyhow::Result<()> {
    let image = banlieue_conformance::behaviours::image(&args.image).map_err(anyhow::Error::msg)?;
    let backend = banlieue_conformance::Backend::read(&args.files)?;
    let bytes = driver_bytes(&args).await?;
    let rt = Runtime::new(RuntimeConfig::default())?;
    let driver = match rt.provider(&bytes) {
        Ok(d) => d,
        // Refused before any behaviour runs, naming both versions.
        Err(e @ CallError::Incompatible(_)) => {
            eprintln!("IncompatibleContract: {} {e}", args.driver);
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("error: {}: {e}", args.driver);
            std::process::exit(2);
        }
    };
    let opts = banlieue_conformance::Options {
        image,
        failure_domain: args.failure_domain.clone(),
        storage_class: args.storage_class.clone(),
        network_class: args.network_class.clone(),
        disk_gib: args.disk_gib,
        call_timeout: Duration::from_secs(args.call_timeout),
        soft_off_timeout: Duration::from_secs(args.soft_off_timeout),
        crash_points: args.crash_points,
    };
    let mut report = banlieue_conformance::run(&rt, &driver, &backend, &opts).await;
    report.driver = args.driver.clone();
    if let Some(path) = &args.junit {
        std::fs::write(path, report.junit()).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    std::process::exit(if report.passed() { 0 } else { 1 });
}

async fn driver_bytes(args: &ConformanceArgs) -> anyhow::Result<Vec<u8>> {
    if !args.driver.starts_with("oci://") {
        return std::fs::read(&args.driver).with_context(|| format!("reading {}", args.driver));
    }
    let r: banlieue_oci::Reference = args.driver.parse().with_context(|| format!("invalid reference {:?}", args.driver))?;
    let policy = match (args.keys.is_empty(), args.allow_unsigned) {
        (false, _) => banlieue_oci::Policy::Verify { public_keys: args.keys.iter().map(std::fs::read_to_string).collect::<Result<_, _>>()? },
        (true, true) => banlieue_oci::Policy::AllowUnsigned,
        (true, false) => anyhow::bail!("{} is pulled from a registry: give --key (its signature is checked before it runs) or --allow-unsigned", args.driver),
    };
    Ok(banlieue_oci::pull_verified(&r, &policy, &args.auth.auth(&r)?).await?.bytes)
}
