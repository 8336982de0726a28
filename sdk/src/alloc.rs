//! A bump allocator for guests whose calls each run in a fresh instance.
//!
//! The host gives every call its own instance and drops it afterwards, so a
//! call's memory never needs to be reused: allocating is a pointer bump and
//! freeing is a no-op, except for the most recent block, which is handed back so
//! a growing `Vec` or `String` usually extends in place. Everything a call
//! allocates still counts against its memory limit: a policy that allocates
//! without bound fails with a memory error, as before.
//!
//! Moving `choose`'s arguments in takes one allocation per string and list
//! (through `cabi_realloc`, which Rust's std routes to the global allocator) and
//! lifting them into Rust values as many again; with the default allocator those
//! allocations dominated a call over many candidates.
//!
//! Opt in from the component crate (Wasm only, so native tests keep the system
//! allocator):
//!
//! ```ignore
//! #[cfg(target_arch = "wasm32")]
//! #[global_allocator]
//! static ALLOC: banlieue_sdk::alloc::Bump = banlieue_sdk::alloc::Bump::new();
//! ```
//!
//! Memory comes from the system allocator (wasi-libc's `malloc`) in chunks that
//! are never returned, starting small so a trivial call needs no `memory.grow`.
//! Blocks this allocator did not hand out (from libc) are never touched: freeing
//! them is a no-op, growing them copies. The other way round, libc must never
//! `free` a block from here: it would, for a non-empty list that a WASI call made
//! by libc itself returns (environment, arguments, stdin). The banlieue host runs
//! components with an empty WASI context, so those lists are always empty;
//! a component that reads its environment or stdin elsewhere must not use this
//! allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The first chunk: enough for small calls, and small enough to fit in the
/// memory an instance starts with.
const FIRST_CHUNK: usize = 16 * 1024;
/// Chunks double up to this size.
const MAX_CHUNK: usize = 4 << 20;
/// Alignment requested for chunks.
const CHUNK_ALIGN: usize = 16;

/// The bump allocator; see the module documentation.
pub struct Bump {
    /// Start of the chunk being carved, the next free byte, and the chunk's end.
    start: Cell<usize>,
    next: Cell<usize>,
    end: Cell<usize>,
    /// Size of the next chunk to request.
    chunk: Cell<usize>,
}

// SAFETY: wasm32-wasip2 components are single-threaded; natively the type is
// only used by tests, each with its own instance.
unsafe impl Sync for Bump {}

impl Bump {
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Bump {
        Bump { start: Cell::new(0), next: Cell::new(0), end: Cell::new(0), chunk: Cell::new(FIRST_CHUNK) }
    }

    /// Whether `[p, p + size)` is the most recent block of the current chunk.
    fn is_last(&self, p: usize, size: usize) -> bool {
        p >= self.start.get() && p.wrapping_add(size) == self.next.get() && self.next.get() != 0
    }

    /// A block for `layout` outside the fast path: from a new chunk, or on its
    /// own when it is large next to the chunks.
    #[cold]
    fn alloc_slow(&self, layout: Layout) -> *mut u8 {
        let Some(want) = layout.size().checked_add(layout.align().max(CHUNK_ALIGN)) else { return std::ptr::null_mut() };
        let chunk = self.chunk.get();
        // SAFETY: sizes are non-zero and the alignment is a power of two.
        let system = |size: usize| unsafe { System.alloc(Layout::from_size_align_unchecked(size, CHUNK_ALIGN)) as usize };
        if want > chunk / 2 {
            // Large: its own block, keeping the current chunk for what follows.
            let base = system(want);
            return if base == 0 { std::ptr::null_mut() } else { align_up(base, layout.align()) as *mut u8 };
        }
        let base = system(chunk);
        if base == 0 {
            return std::ptr::null_mut();
        }
        self.chunk.set((chunk * 2).min(MAX_CHUNK));
        let p = align_up(base, layout.align());
        self.start.set(base);
        self.next.set(p + layout.size());
        self.end.set(base + chunk);
        p as *mut u8
    }
}

fn align_up(p: usize, align: usize) -> usize {
    (p + align - 1) & !(align - 1)
}

unsafe impl GlobalAlloc for Bump {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = align_up(self.next.get(), layout.align());
        match p.checked_add(layout.size()) {
            Some(end) if end <= self.end.get() && self.next.get() != 0 => {
                self.next.set(end);
                p as *mut u8
            }
            _ => self.alloc_slow(layout),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Only the most recent block is handed back; the rest goes with the instance.
        if self.is_last(ptr as usize, layout.size()) {
            self.next.set(ptr as usize);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = ptr as usize;
        // The most recent block grows or shrinks in place when its chunk has room.
        if self.is_last(p, layout.size()) && p.checked_add(new_size).is_some_and(|e| e <= self.end.get()) {
            self.next.set(p + new_size);
            return ptr;
        }
        if new_size <= layout.size() {
            return ptr;
        }
        // SAFETY: the old alignment with a larger, non-zero size.
        let new = unsafe { self.alloc(Layout::from_size_align_unchecked(new_size, layout.align())) };
        if !new.is_null() {
            // SAFETY: both blocks are valid for `layout.size()` bytes, and distinct.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size()) };
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(b: &Bump, size: usize, align: usize) -> *mut u8 {
        let p = unsafe { b.alloc(Layout::from_size_align(size, align).unwrap()) };
        assert!(!p.is_null());
        assert_eq!(p as usize % align, 0);
        p
    }

    #[test]
    fn blocks_are_aligned_distinct_and_writable() {
        let b = Bump::new();
        let mut blocks = Vec::new();
        for i in 1..2000usize {
            let (size, align) = (i % 300 + 1, 1 << (i % 5));
            let p = alloc(&b, size, align);
            unsafe { std::ptr::write_bytes(p, (i % 251) as u8, size) };
            blocks.push((p, size, (i % 251) as u8));
        }
        // Large blocks get their own allocation and leave the chunk usable.
        let big = alloc(&b, 10 << 20, 64);
        unsafe { std::ptr::write_bytes(big, 7, 10 << 20) };
        for (p, size, v) in blocks {
            assert!(unsafe { std::slice::from_raw_parts(p, size) }.iter().all(|x| *x == v));
        }
    }

    #[test]
    fn the_last_block_is_reused_and_grows_in_place() {
        let b = Bump::new();
        let a = alloc(&b, 100, 8);
        let l = Layout::from_size_align(100, 8).unwrap();
        let grown = unsafe { b.realloc(a, l, 200) };
        assert_eq!(grown, a, "the last block grows in place");
        unsafe { b.dealloc(grown, Layout::from_size_align(200, 8).unwrap()) };
        assert_eq!(alloc(&b, 50, 8), a, "the last block is handed back");
        // A block that is not the last one is copied when it grows.
        let x = alloc(&b, 16, 8);
        unsafe { std::ptr::write_bytes(x, 9, 16) };
        let _y = alloc(&b, 16, 8);
        let moved = unsafe { b.realloc(x, Layout::from_size_align(16, 8).unwrap(), 64) };
        assert_ne!(moved, x);
        assert!(unsafe { std::slice::from_raw_parts(moved, 16) }.iter().all(|v| *v == 9));
    }

    #[test]
    fn foreign_blocks_are_left_alone() {
        let b = Bump::new();
        let _ = alloc(&b, 8, 8);
        let l = Layout::from_size_align(32, 8).unwrap();
        let foreign = unsafe { System.alloc(l) };
        unsafe { std::ptr::write_bytes(foreign, 3, 32) };
        unsafe { b.dealloc(foreign, l) };
        let grown = unsafe { b.realloc(foreign, l, 100) };
        assert!(unsafe { std::slice::from_raw_parts(grown, 32) }.iter().all(|v| *v == 3));
        unsafe { System.dealloc(foreign, l) };
    }
}
