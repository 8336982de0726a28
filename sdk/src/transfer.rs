//! The image of an `import-image` call, streamed by the host to a target the driver names
//! inside its grant. The bytes never pass through the driver.

use crate::bindings::host::banlieue::host::transfer as host;
use crate::Result;

pub use host::Image;

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
