//! Disk bytes the host streams between the backend and its cache, to and from places the
//! driver names inside its grant: the image of an `import-image` call, the disks a
//! `disk-export` call hands over, the disks a `disk-import` call carries in. The bytes
//! never pass through the driver.

use crate::bindings::host::banlieue::host::transfer as host;
use crate::Result;

pub use host::{CarriedDisk, Image};

/// What the host holds for this call: digest, format, size, virtual size.
pub fn image() -> Result<Image> {
    host::current().map_err(|e| e.context("transfer image"))
}

/// Stream the image into storage volume `name` of `pool` (created by the driver, at least
/// [`Image::size`] bytes) on the granted libvirt connection; returns the bytes sent.
pub fn to_libvirt_volume(pool: &str, name: &str) -> Result<u64> {
    host::to_libvirt_volume(pool, name).map_err(|e| e.context(format_args!("uploading the image to volume {pool}/{name}")))
}

/// Stream the image as the body of one `method` (PUT or POST) request to `url`, which must be
/// inside the http grant (an upload URL the backend handed out); returns the response status.
pub fn to_http(method: &str, url: &str, headers: &[(String, String)]) -> Result<u16> {
    host::to_http(method, url, headers).map_err(|e| e.context(format_args!("uploading the image to {url}")))
}

/// During `disk-export`: hand over storage volume `name` of `pool` as the machine's disk `disk`.
pub fn from_libvirt_volume(disk: &str, pool: &str, name: &str) -> Result<u64> {
    host::from_libvirt_volume(disk, pool, name).map_err(|e| e.context(format_args!("exporting disk {disk} from volume {pool}/{name}")))
}

/// During `disk-export`: hand over the body of a GET of `url` as the machine's disk `disk`.
pub fn from_http(disk: &str, url: &str, headers: &[(String, String)]) -> Result<u64> {
    host::from_http(disk, url, headers).map_err(|e| e.context(format_args!("exporting disk {disk} from {url}")))
}

/// During `disk-import`: the disks carried for this call, boot disk first.
pub fn carried() -> Result<Vec<CarriedDisk>> {
    host::carried().map_err(|e| e.context("carried disks"))
}

/// During `disk-import`: stream carried disk `disk` into volume `name` of `pool`.
pub fn carried_to_libvirt_volume(disk: &str, pool: &str, name: &str) -> Result<u64> {
    host::carried_to_libvirt_volume(disk, pool, name).map_err(|e| e.context(format_args!("uploading disk {disk} to volume {pool}/{name}")))
}

/// During `disk-import`: stream carried disk `disk` as the body of one request to `url`.
pub fn carried_to_http(disk: &str, method: &str, url: &str, headers: &[(String, String)]) -> Result<u16> {
    host::carried_to_http(disk, method, url, headers).map_err(|e| e.context(format_args!("uploading disk {disk} to {url}")))
}

/// During `disk-import`: a one-time URL the backend can download carried disk `disk` from.
pub fn carried_url(disk: &str) -> Result<String> {
    host::carried_url(disk).map_err(|e| e.context(format_args!("a download URL for disk {disk}")))
}
