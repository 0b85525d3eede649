//! `hugelab hugetlb plan`: sizes that are not a whole number of pages, and
//! page sizes that do not exist.

mod common;
use common::{run as hugelab, stderr};

/// Each plan of the JSON as (page size, rule, huge pages, vmemmap bytes, freed pages per page).
fn plans(args: &[&str]) -> Vec<(u64, String, u64, u64, u64)> {
    let o = hugelab(args);
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    v.as_array()
        .expect("a list of plans")
        .iter()
        .map(|p| {
            (
                p["hpage_size"].as_u64().unwrap(),
                p["rule"].as_str().unwrap().to_string(),
                p["huge_pages"].as_u64().unwrap(),
                p["vmemmap_bytes"].as_u64().unwrap(),
                p["freed_pages_per_hpage"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn plan_of_less_than_a_gigabyte_plans_the_2m_pages_it_holds() {
    // 3M holds one 2M page (and no 1G one): its vmemmap is 512 struct pages
    // of 64 bytes, 32 KiB = 8 base pages, of which HVO frees all but
    // RESERVE_VMEMMAP_NR = 2 (2021) or HUGETLB_VMEMMAP_RESERVE_SIZE = one page (6.18).
    let p = plans(&["hugetlb", "plan", "3M", "--json"]);
    assert_eq!(
        p,
        vec![
            (2 << 20, "Series2021".to_string(), 1, 32 << 10, 6),
            (2 << 20, "Linux618".to_string(), 1, 32 << 10, 7),
        ]
    );
    let o = hugelab(&["hugetlb", "plan", "3M"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("3M holds 1 × 2M page; 1M left over\n"),
        "{text}"
    );
    assert!(text.contains("3M holds no 1G page\n"), "{text}");
}

#[test]
fn plan_says_what_is_rounded_down() {
    let o = hugelab(&["hugetlb", "plan", "1025M"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("1025M holds 512 × 2M pages; 1M left over\n"),
        "{text}"
    );
    assert!(
        text.contains("1025M holds 1 × 1G page; 1M left over\n"),
        "{text}"
    );
    // A whole number of pages says nothing more.
    let o = hugelab(&["hugetlb", "plan", "1T"]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("left over"));
}

#[test]
fn plan_refuses_a_page_size_hugetlb_does_not_have() {
    for size in ["4M", "64K", "512M", "2G"] {
        let o = hugelab(&["hugetlb", "plan", "1T", "--size", size]);
        assert_eq!(o.status.code(), Some(2), "--size {size}");
        assert_eq!(
            stderr(&o),
            format!("hugelab: --size {size} is not a HugeTLB page size: they are 2M and 1G\n")
        );
        assert!(o.stdout.is_empty());
    }
    let o = hugelab(&["hugetlb", "plan", "1M"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "hugelab: 1M holds no HugeTLB page (2M or 1G): give at least 2M\n"
    );
}

/// The plan's HugeTLB sizes are x86-64's (2M and 1G, over 4K base pages):
/// another base page (arm64's 16K or 64K granule, whose HugeTLB sizes are
/// others) is refused in one sentence, not planned with x86-64's sizes.
#[test]
fn plan_refuses_a_base_page_other_than_x86_64s() {
    for base in ["16K", "64K", "3K"] {
        let o = hugelab(&["hugetlb", "plan", "1T", "--base-page", base]);
        assert_eq!(o.status.code(), Some(2), "--base-page {base}");
        assert_eq!(
            stderr(&o),
            format!(
                "hugelab: --base-page {base}: hugelab plans x86-64 only, whose base page is 4K \
                 (with HugeTLB pages of 2M and 1G); other architectures' page sizes are not planned\n"
            )
        );
        assert!(o.stdout.is_empty());
    }
    let o = hugelab(&["hugetlb", "plan", "1T", "--base-page", "4K"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}
