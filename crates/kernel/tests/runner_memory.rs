//! The runner keeps its heap once the kernel backend starts
//! (`agent::hold_runner_memory`): a large buffer freed between two windows
//! stays mapped, so none of the runner's page tables is freed by an RCU
//! callback that would land in a later window. A binary of its own: the
//! malloc settings are process-wide. Needs no privileges.

#![cfg(target_env = "gnu")]

use std::hint::black_box;

/// Whether `[start, end)` lies inside one mapping of this process.
fn mapped(start: u64, end: u64) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|line| {
        let range = line.split_whitespace().next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        a <= start && end <= b
    })
}

#[test]
fn a_freed_large_buffer_stays_mapped() {
    hugelab_kernel::agent::hold_runner_memory();
    // 4 MiB: glibc would mmap it by default (threshold 128 KiB) and munmap
    // it on free, which is how the pagemap batch of a 1 GiB region went.
    let buf = black_box(vec![1u8; 4 << 20]);
    let start = buf.as_ptr() as u64;
    let end = start + buf.len() as u64;
    drop(buf);
    assert!(
        mapped(start, end),
        "the freed buffer {start:#x}-{end:#x} went back to the kernel"
    );
}
