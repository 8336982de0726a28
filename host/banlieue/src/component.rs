//! `banlieue component …`: new, keygen, push, sign, verify, inspect.

use std::path::PathBuf;

use anyhow::Context;
use banlieue_oci::{Auth, Reference};
use banlieue_runtime::{Runtime, RuntimeConfig};

#[derive(clap::Subcommand)]
pub enum ComponentCommand {
    /// Write a new component's crate: every export of its contract stubbed, a test, a README
    /// with the build, sign and push commands. It builds for wasm32-wasip2 as written.
    New {
        kind: crate::scaffold::Kind,
        /// Its name (a crate and OCI repository name: lowercase letters, digits, '-').
        name: String,
        /// Where (default: ./NAME); must not exist or be empty.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The banlieue SDK's directory (default: the source tree this binary was built from).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Create a signing key pair (cosign's encrypted private key format).
    Keygen {
        /// Write `<prefix>.key` (encrypted private key) and `<prefix>.pub`.
        #[arg(long, default_value = "cosign")]
        output_prefix: String,
        /// Password of the private key.
        #[arg(long, env = "COSIGN_PASSWORD", hide_env_values = true)]
        password: String,
    },
    /// Push a component as a Wasm OCI artifact; prints the digest.
    Push {
        file: PathBuf,
        /// `oci://REGISTRY/REPO:TAG`
        reference: String,
        #[command(flatten)]
        auth: AuthArgs,
    },
    /// Sign an artifact (by tag or digest) with a private key.
    Sign {
        reference: String,
        #[arg(long)]
        key: PathBuf,
        #[arg(long, env = "COSIGN_PASSWORD", hide_env_values = true)]
        password: String,
        #[command(flatten)]
        auth: AuthArgs,
    },
    /// Verify an artifact's signature with one or more public keys; prints the verified digest.
    Verify {
        reference: String,
        #[arg(long = "key", required = true)]
        keys: Vec<PathBuf>,
        #[command(flatten)]
        auth: AuthArgs,
    },
    /// Print a component's digest, contract and version, imports and exports
    /// (a `.wasm` file or an `oci://` reference, pulled without verification).
    Inspect {
        source: String,
        #[command(flatten)]
        auth: AuthArgs,
    },
}

/// Registry credentials.
#[derive(clap::Args)]
pub struct AuthArgs {
    /// A docker config file (`~/.docker/config.json` or a Secret's `.dockerconfigjson`).
    #[arg(long)]
    docker_config: Option<PathBuf>,
}

impl AuthArgs {
    pub fn auth(&self, r: &Reference) -> anyhow::Result<Auth> {
        match &self.docker_config {
            None => Ok(Auth::Anonymous),
            Some(p) => {
                let json = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
                Ok(banlieue_oci::auth_from_docker_config(&json, r.registry())?)
            }
        }
    }
}

fn reference(s: &str) -> anyhow::Result<Reference> {
    s.parse().with_context(|| format!("invalid reference {s:?}"))
}

pub async fn run(cmd: ComponentCommand) -> anyhow::Result<()> {
    match cmd {
        ComponentCommand::New { kind, name, dir, sdk } => {
            let dir = crate::scaffold::new(kind, &name, dir, sdk)?;
            println!("wrote {}: `cargo build --release` there builds the component (README.md says what next)", dir.display());
            Ok(())
        }
        ComponentCommand::Keygen { output_prefix, password } => {
            let (private, public) = banlieue_oci::keygen(password.as_bytes())?;
            for (path, content) in [(format!("{output_prefix}.key"), private), (format!("{output_prefix}.pub"), public)] {
                if std::path::Path::new(&path).exists() {
                    anyhow::bail!("{path} exists; not overwriting");
                }
                std::fs::write(&path, content)?;
                println!("wrote {path}");
            }
            Ok(())
        }
        ComponentCommand::Push { file, reference: r, auth } => {
            let r = reference(&r)?;
            let wasm = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            // Refuse to publish something banlieue would refuse to run.
            let rt = Runtime::new(RuntimeConfig::default())?;
            let i = rt.inspect(&wasm)?;
            if let Some(why) = i.refusal {
                anyhow::bail!("{} is not a usable banlieue component: {why}", file.display());
            }
            let digest = banlieue_oci::push(&r, wasm, &auth.auth(&r)?).await?;
            println!("{}", r.with_digest(&digest)?);
            Ok(())
        }
        ComponentCommand::Sign { reference: r, key, password, auth } => {
            let r = reference(&r)?;
            let pem = std::fs::read_to_string(&key).with_context(|| format!("reading {}", key.display()))?;
            let tag = banlieue_oci::sign(&r, &pem, password.as_bytes(), &auth.auth(&r)?).await?;
            println!("signed: {tag}");
            Ok(())
        }
        ComponentCommand::Verify { reference: r, keys, auth } => {
            let r = reference(&r)?;
            let keys: Vec<String> = keys.iter().map(std::fs::read_to_string).collect::<Result<_, _>>()?;
            let digest = banlieue_oci::verify(&r, &keys, &auth.auth(&r)?).await?;
            println!("verified: {}", r.with_digest(&digest)?);
            Ok(())
        }
        ComponentCommand::Inspect { source, auth } => {
            let bytes = if source.starts_with("oci://") {
                let r = reference(&source)?;
                banlieue_oci::pull(&r, &auth.auth(&r)?).await?.1
            } else {
                std::fs::read(&source).with_context(|| format!("reading {source}"))?
            };
            inspect(&bytes)
        }
    }
}

fn inspect(bytes: &[u8]) -> anyhow::Result<()> {
    let rt = Runtime::new(RuntimeConfig::default())?;
    let i = rt.inspect(bytes)?;
    println!("digest:   {}", i.digest);
    match &i.contract {
        Some((c, v)) => println!("world:    {} (contract {v})", c.world()),
        None => println!("world:    none"),
    }
    if let Some(why) = &i.refusal {
        println!("refused:  {why}");
    }
    println!("imports:");
    for n in &i.imports {
        println!("  {n}");
    }
    println!("exports:");
    for n in &i.exports {
        println!("  {n}");
    }
    if i.refusal.is_some() {
        std::process::exit(2);
    }
    Ok(())
}
