//! The allocator gives freed memory back when asked, so that the resident size the memory
//! limits read counts what is live (`efopt::release_free_memory`, called between the search
//! and the output of `extract`). Its own test binary: other tests allocating on other threads
//! would move the resident size this one reads.

use efopt::egraph::extract::resident_mib;

#[test]
fn freed_memory_leaves_the_resident_size_once_released() {
    let Some(before) = resident_mib() else {
        return; // the system does not report it (not Linux)
    };
    // Many small blocks, like a search's worklist and seen-set entries: 2 M × 128 bytes.
    let blocks: Vec<Box<[u8; 128]>> = (0..2_000_000u32)
        .map(|i| Box::new([i as u8; 128]))
        .collect();
    let held = resident_mib().unwrap_or(0);
    assert!(
        held >= before + 200,
        "{} MiB held after allocating, {before} before",
        held
    );
    drop(blocks);
    efopt::release_free_memory();
    let after = resident_mib().unwrap_or(usize::MAX);
    assert!(
        after < before + 64,
        "{after} MiB resident after releasing, {before} before and {held} held"
    );
}
