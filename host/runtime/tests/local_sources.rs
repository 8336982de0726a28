//! `builtin:` and `file://` components are read through `cap-std` directories: `file://`
//! only from the one directory an administrator configures, and no path, `..` or
//! symlink reaches a file outside it.

use banlieue_oci::Auth;
use banlieue_runtime::source::{fetch, LocalDirs, Source, SourceError, Trust};

const UNSIGNED_OK: Trust = Trust { public_keys: Vec::new(), allow_unsigned: true };

async fn read(source: &str, dirs: &LocalDirs) -> Result<Vec<u8>, SourceError> {
    let source: Source = source.parse()?;
    fetch(&source, &UNSIGNED_OK, &Auth::Anonymous, dirs).await.map(|f| f.bytes)
}

#[tokio::test]
async fn file_sources_come_only_from_the_component_directory() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let (components, builtin) = (tmp.path().join("components"), tmp.path().join("builtin"));
    std::fs::create_dir_all(components.join("team"))?;
    std::fs::create_dir_all(&builtin)?;
    std::fs::write(components.join("team/driver.wasm"), b"driver")?;
    std::fs::write(tmp.path().join("secret.wasm"), b"secret")?;
    std::fs::write(builtin.join("spread.wasm"), b"spread")?;
    std::os::unix::fs::symlink(tmp.path().join("secret.wasm"), components.join("absolute-link.wasm"))?;
    std::os::unix::fs::symlink("../secret.wasm", components.join("relative-link.wasm"))?;
    std::os::unix::fs::symlink("team/driver.wasm", components.join("inner-link.wasm"))?;
    let dirs = LocalDirs { builtin: builtin.clone(), files: Some(components.clone()) };
    let dir = components.display();

    assert_eq!(read(&format!("file://{dir}/team/driver.wasm"), &dirs).await?, b"driver");
    assert_eq!(read(&format!("file://{dir}/inner-link.wasm"), &dirs).await?, b"driver", "a link that stays inside is fine");
    assert_eq!(read("builtin:spread", &dirs).await?, b"spread");

    // Outside the directory, by path, by `..`, by symlink: refused, naming why.
    let outside = read(&format!("file://{}/secret.wasm", tmp.path().display()), &dirs).await.unwrap_err();
    assert!(matches!(outside, SourceError::OutsideComponentDir { .. }), "{outside}");
    assert!(outside.to_string().contains("--component-dir"), "{outside}");
    for escape in [format!("file://{dir}/../secret.wasm"), format!("file://{dir}/team/../../secret.wasm"), format!("file://{dir}/absolute-link.wasm"), format!("file://{dir}/relative-link.wasm")] {
        let e = read(&escape, &dirs).await.unwrap_err();
        assert!(matches!(e, SourceError::File { .. }), "{escape}: {e}");
    }
    // A built-in name cannot leave the builtin directory either.
    assert!("builtin:../secret".parse::<Source>().is_err());
    assert!(matches!(read("builtin:missing", &dirs).await, Err(SourceError::UnknownBuiltin(_))));

    // With no component directory configured, no file is read at all.
    let off = LocalDirs { builtin, files: None };
    let e = read(&format!("file://{dir}/team/driver.wasm"), &off).await.unwrap_err();
    assert!(matches!(e, SourceError::FileSourcesDisabled(_)), "{e}");
    Ok(())
}
