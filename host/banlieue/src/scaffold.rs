//! `banlieue component new provider|placement NAME`: a crate that builds a component as
//! written — every export of its contract stubbed (a refusal with `invalid-spec` where only
//! the backend can answer, the right answer where there is one), a test, and a README with
//! the build, sign and push commands. The templates are under `host/banlieue/scaffold/`.

use std::path::{Path, PathBuf};

/// Which kind of component.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// A provider driver (`banlieue:provider`).
    Provider,
    /// A placement policy (`banlieue:placement`).
    Placement,
}

const CARGO_TOML: &str = include_str!("../scaffold/Cargo.toml.in");
const CARGO_CONFIG: &str = include_str!("../scaffold/config.toml.in");
const README: &str = include_str!("../scaffold/README.md.in");
const PROVIDER: &str = include_str!("../scaffold/provider/lib.rs.in");
const PLACEMENT: &str = include_str!("../scaffold/placement/lib.rs.in");

/// Where the SDK is when none is named: the source tree this binary was built from.
fn default_sdk() -> Option<PathBuf> {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk");
    sdk.join("Cargo.toml").is_file().then(|| sdk.canonicalize().unwrap_or(sdk))
}

/// Write the crate of component `name` of `kind` into `dir` (`./NAME` by default), the SDK
/// at `sdk`. Nothing is written over: `dir` must not exist or be empty.
pub fn new(kind: Kind, name: &str, dir: Option<PathBuf>, sdk: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() && std::fs::read_dir(&dir)?.next().is_some() {
        anyhow::bail!("{} exists and is not empty: nothing is written over", dir.display());
    }
    let sdk = match sdk.or_else(default_sdk) {
        Some(s) if s.join("Cargo.toml").is_file() => s.canonicalize()?,
        Some(s) => anyhow::bail!("{} holds no Cargo.toml: --sdk names the banlieue source tree's sdk/ directory", s.display()),
        None => anyhow::bail!("no banlieue SDK found: name its directory with --sdk (the banlieue source tree's sdk/)"),
    };
    let krate = name.replace('-', "_");
    let ty: String = name.split(['-', '_']).filter(|p| !p.is_empty()).map(|p| p[..1].to_ascii_uppercase() + &p[1..]).collect();
    let (description, lib, contract, usage) = match kind {
        Kind::Provider => (
            format!("Provider driver {name}"),
            PROVIDER,
            format!("banlieue:provider@{}", banlieue_runtime::PROVIDER_VERSION),
            format!(
                "A ProviderClass names it (`spec.component.source: oci://REGISTRY/{name}:0.1.0`, with\n\
                 `verification.publicKeys` holding `{name}.pub`), and a Provider of that class gives it its endpoint and\n\
                 credentials. Check it against a live backend first (a Provider manifest and its Secret):\n\n\
                 ```sh\n\
                 banlieue provider conformance --driver target/wasm32-wasip2/release/{krate}.wasm -f provider.yaml --image template:NAME\n\
                 ```"
            ),
        ),
        Kind::Placement => (
            format!("Placement policy {name}"),
            PLACEMENT,
            format!("banlieue:placement@{}", banlieue_runtime::PLACEMENT_VERSION),
            format!(
                "A PlacementPolicy names it (`spec.component.source: oci://REGISTRY/{name}:0.1.0`, with\n\
                 `verification.publicKeys` holding `{name}.pub`), and a VM's `placement.policyRef` uses it."
            ),
        ),
    };
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{crate}}", &krate)
            .replace("{{type}}", &ty)
            .replace("{{description}}", &description)
            .replace("{{sdk}}", &sdk.to_string_lossy())
            .replace("{{contract}}", &contract)
            .replace("{{usage}}", &usage)
    };
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::create_dir_all(dir.join(".cargo"))?;
    for (file, template) in [("Cargo.toml", CARGO_TOML), (".cargo/config.toml", CARGO_CONFIG), ("README.md", README), ("src/lib.rs", lib)] {
        std::fs::write(dir.join(file), fill(template))?;
    }
    Ok(dir)
}

/// A crate name that is also a component's name in an OCI reference: lowercase ASCII
/// letters, digits and `-`, starting with a letter, at most 64 characters.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    anyhow::ensure!(ok, "{name:?} is not a component name: lowercase letters, digits and '-', starting with a letter, at most 64 characters (e.g. my-driver)");
    anyhow::ensure!(!matches!(name, "test" | "core" | "std" | "alloc" | "proc-macro" | "self" | "crate" | "super"), "{name:?} is reserved by Rust: choose another name");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_crate_names_and_oci_repository_names() {
        for good in ["my-driver", "vmware2", "a"] {
            check_name(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for bad in ["", "My-Driver", "2fast", "my_driver", "driver-", "a b", "std", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_crate_is_written_filled_in_and_never_over_something() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("acme-cloud");
        let sdk = default_sdk().expect("the source tree's sdk");
        new(Kind::Provider, "acme-cloud", Some(at.clone()), Some(sdk.clone())).unwrap();
        let lib = std::fs::read_to_string(at.join("src/lib.rs")).unwrap();
        assert!(lib.contains("pub struct AcmeCloud;") && lib.contains("export_provider!(AcmeCloud)"), "{lib}");
        assert!(!lib.contains("{{"), "every placeholder filled: {lib}");
        let manifest = std::fs::read_to_string(at.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("name = \"acme-cloud\"") && manifest.contains(&format!("path = \"{}\"", sdk.display())), "{manifest}");
        let readme = std::fs::read_to_string(at.join("README.md")).unwrap();
        assert!(readme.contains("release/acme_cloud.wasm") && readme.contains("banlieue:provider@"), "{readme}");
        let again = new(Kind::Placement, "acme-cloud", Some(at), Some(sdk)).unwrap_err();
        assert!(again.to_string().contains("not empty"), "{again}");
    }
}
