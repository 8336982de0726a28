//! The NoCloud seed: a small FAT image labelled `cidata` holding `meta-data`
//! (instance ID, hostname) and `user-data`, built in memory and uploaded as a
//! raw volume the domain reads-only. cloud-init (and the test guest) find it by
//! its label; nothing is written on the libvirt host but that volume.

use std::io::{Cursor, Write};

use banlieue_sdk::{Error, Result};
use fatfs::{FileSystem, FormatVolumeOptions, FsOptions};

/// The most user-data a seed carries: the size limit of a Kubernetes Secret,
/// where user-data usually comes from.
pub const MAX_USER_DATA: usize = 1024 * 1024;

/// FAT overhead (boot sector, two FATs, root directory) with room to spare.
const OVERHEAD: usize = 192 * 1024;
const ALIGN: usize = 64 * 1024;

/// The seed's files: NoCloud `meta-data` (YAML), `user-data` (as given, or empty) and,
/// for static addresses, `network-config`.
pub fn files(instance_id: &str, hostname: &str, user_data: Option<&str>, network_config: Option<&str>) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let user_data = user_data.unwrap_or_default();
    if user_data.len() > MAX_USER_DATA {
        return Err(Error::InvalidSpec(format!(
            "user-data is {} bytes; the NoCloud seed takes at most {MAX_USER_DATA} bytes",
            user_data.len()
        )));
    }
    // Both values are checked Kubernetes names/UIDs: nothing in them needs YAML quoting.
    let meta = format!("instance-id: {instance_id}\nlocal-hostname: {hostname}\n");
    let mut files = vec![("meta-data", meta.into_bytes()), ("user-data", user_data.as_bytes().to_vec())];
    if let Some(config) = network_config {
        files.push(("network-config", config.as_bytes().to_vec()));
    }
    Ok(files)
}

/// A FAT image labelled `cidata` with `files` in its root directory.
pub fn image(files: &[(&str, Vec<u8>)]) -> Result<Vec<u8>> {
    let content: usize = files.iter().map(|(_, bytes)| bytes.len()).sum();
    // Twice the content covers cluster slack for a handful of files.
    let size = (OVERHEAD + 2 * content).div_ceil(ALIGN) * ALIGN;
    let mut disk = Cursor::new(vec![0u8; size]);
    let fail = |what: &str, e: std::io::Error| Error::Internal(format!("building the NoCloud seed: {what}: {e}"));
    fatfs::format_volume(&mut disk, FormatVolumeOptions::new().volume_label(*b"cidata     "))
        .map_err(|e| fail("formatting", e))?;
    {
        let fs = FileSystem::new(&mut disk, FsOptions::new()).map_err(|e| fail("mounting", e))?;
        let root = fs.root_dir();
        for (name, bytes) in files {
            let mut file = root.create_file(name).map_err(|e| fail(name, e))?;
            file.truncate().map_err(|e| fail(name, e))?;
            file.write_all(bytes).map_err(|e| fail(name, e))?;
            file.flush().map_err(|e| fail(name, e))?;
        }
        drop(root);
        fs.unmount().map_err(|e| fail("unmounting", e))?;
    }
    Ok(disk.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn read(image: &[u8], name: &str) -> Vec<u8> {
        let fs = FileSystem::new(Cursor::new(image.to_vec()), FsOptions::new()).unwrap();
        let mut out = Vec::new();
        fs.root_dir().open_file(name).unwrap().read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn seed_holds_meta_data_and_user_data_under_the_cidata_label() {
        let user_data = "#cloud-config\n#banlieue-marker: hello\n";
        let files = files("6f1c2a3e-1111-4222-8333-444455556666", "web-0", Some(user_data), None).unwrap();
        let img = image(&files).unwrap();
        assert_eq!(img.len() % ALIGN, 0);
        let fs = FileSystem::new(Cursor::new(img.clone()), FsOptions::new()).unwrap();
        assert_eq!(fs.volume_label(), "cidata");
        drop(fs);
        assert_eq!(read(&img, "user-data"), user_data.as_bytes());
        assert_eq!(
            String::from_utf8(read(&img, "meta-data")).unwrap(),
            "instance-id: 6f1c2a3e-1111-4222-8333-444455556666\nlocal-hostname: web-0\n"
        );
    }

    #[test]
    fn static_addresses_add_a_network_config() {
        let config = r#"{"version":2,"ethernets":{}}"#;
        let img = image(&files("id", "h", None, Some(config)).unwrap()).unwrap();
        assert_eq!(read(&img, "network-config"), config.as_bytes());
    }

    #[test]
    fn no_user_data_is_an_empty_file_and_the_largest_fits() {
        let img = image(&files("id", "h", None, None).unwrap()).unwrap();
        assert!(read(&img, "user-data").is_empty());
        let big = "x".repeat(MAX_USER_DATA);
        let img = image(&files("id", "h", Some(&big), None).unwrap()).unwrap();
        assert_eq!(read(&img, "user-data").len(), MAX_USER_DATA);
        match files("id", "h", Some(&format!("{big}y")), None) {
            Err(Error::InvalidSpec(m)) => assert!(m.contains("at most 1048576 bytes"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
