//! VMImages on every Provider (role `imagebuilder`). What is here so far is the part every
//! import starts from: [`cache`], the host-side image cache that downloads an image once,
//! verifies it against its declared sha256 and converts it with `qemu-img` to the format
//! each backend takes. Nothing a component or an object supplies is ever a path in it.
//! And [`handout`]: one-time URLs a backend downloads a carried disk from.

pub mod cache;
pub mod handout;

pub use handout::Handouts;
pub use cache::{CarriedFile, ConvertError, Digest, DiskFormat, Entry, FetchError, ImageCache, ImageInfo};
