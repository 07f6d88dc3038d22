//! efopt: a tensor-program superoptimizer over a unified tensor/tiled IR.
//!
//! Data flows one way: [`parse`] text into the [`ir`], [`passes`] verify and transform it (the
//! [`interp`] reference interpreter evaluates it), [`lower`] and [`backend`] emit GPU code.
//! [`passes::PassManager`] runs a pipeline of passes on a module; the [`driver`] is the `efopt`
//! command around it (command line, files, output).

// Every binary linking the library (the `efopt` tool, tests, benches) gets this allocator:
// the e-graph passes allocate many small short-lived values (terms, e-nodes, types), and
// mimalloc was measured faster than the system allocator on saturation (issue 3 notes).
#[global_allocator]
static ALLOCATOR: alloc::Mimalloc = alloc::Mimalloc;

/// Returns the memory freed so far to the system, so that the resident size the memory limits
/// read counts what is live: mimalloc keeps freed pages for reuse, and after a search that
/// stopped at `max-memory` the output would otherwise find the limit already reached.
pub fn release_free_memory() {
    // SAFETY: `mi_collect` only walks the allocator's own free lists.
    unsafe { alloc::mi_collect(true) }
}

mod alloc {
    use libmimalloc_sys as mi;

    // In the linked mimalloc, declared by `libmimalloc-sys` only under its `extended` feature.
    extern "C" {
        pub fn mi_collect(force: bool);
    }
    use std::alloc::{GlobalAlloc, Layout};
    use std::ffi::c_void;

    /// mimalloc, asked for plain blocks where their natural alignment suffices (as the
    /// standard library's `System` does with `malloc`): mimalloc's aligned entry points fall
    /// back to a slow path whenever a free list runs dry.
    pub struct Mimalloc;

    /// Every mimalloc block of at least this size is aligned to it (`MI_MAX_ALIGN_SIZE`).
    const NATURAL_ALIGN: usize = 16;

    fn natural(align: usize, size: usize) -> bool {
        align <= NATURAL_ALIGN && align <= size
    }

    unsafe impl GlobalAlloc for Mimalloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if natural(layout.align(), layout.size()) {
                mi::mi_malloc(layout.size()) as *mut u8
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            if natural(layout.align(), layout.size()) {
                mi::mi_zalloc(layout.size()) as *mut u8
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
            mi::mi_free(ptr as *mut c_void)
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            if natural(layout.align(), new_size) {
                mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

pub mod backend;
pub mod diag;
pub mod driver;
pub mod egraph;
pub mod interp;
pub mod ir;
pub mod lower;
pub mod parse;
pub mod passes;
pub mod verify;
