//! `hugelab hugetlb plan`: the vmemmap (`struct page`) memory behind HugeTLB
//! pages, without and with the HugeTLB Vmemmap Optimization, for each page
//! size and each HVO rule (the model's `hugetlb_vmemmap`). It plans x86-64,
//! the machine hugelab models: 4K base pages, HugeTLB pages of 2M (PMD) and
//! 1G (PUD). Other architectures' base pages and HugeTLB sizes (arm64's
//! contiguous-PTE and contiguous-PMD sizes, its 16K and 64K granules) are
//! refused rather than planned with x86-64's sizes. `hugelab hugetlb
//! measure` is `hugetlb_measure.rs`.

use crate::hugetlb_measure::MeasureArgs;
use crate::table::{self, human};
use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use hugelab_model::hugetlb_vmemmap::{vmemmap_plan, HvoRule, VmemmapGeometry, VmemmapPlan};
use hugelab_workload::{HugetlbSize, Size};
use std::process::ExitCode;

/// x86-64's base page, the one the planned HugeTLB sizes go with.
const X86_64_BASE_PAGE: u64 = 4096;

#[derive(Subcommand)]
pub enum HugetlbCommand {
    /// The vmemmap memory of SIZE of HugeTLB pages, without and with HVO,
    /// under the 2021 series' rule and Linux 6.18's.
    Plan(PlanArgs),
    /// Grow and shrink this machine's HugeTLB pools with HVO off and on:
    /// the vmemmap given back per page and the time it costs (root).
    Measure(MeasureArgs),
}

#[derive(Args)]
pub struct PlanArgs {
    /// How much memory in HugeTLB pages (1T, 64G...).
    total: Size,
    /// One HugeTLB page size (2M or 1G); both when left out.
    #[arg(long)]
    size: Option<Size>,
    /// The base page size: 4K, x86-64's (the only architecture planned).
    #[arg(long, default_value = "4K")]
    base_page: Size,
    /// sizeof(struct page), in bytes.
    #[arg(long, default_value_t = 64)]
    struct_page: u64,
    /// Print the plan as JSON.
    #[arg(long)]
    json: bool,
}

pub fn main(cmd: HugetlbCommand) -> Result<ExitCode> {
    match cmd {
        HugetlbCommand::Plan(args) => plan(args),
        HugetlbCommand::Measure(args) => crate::hugetlb_measure::main(args),
    }
}

fn plan(args: PlanArgs) -> Result<ExitCode> {
    let base_page = args.base_page.bytes();
    if base_page != X86_64_BASE_PAGE {
        bail!(
            "--base-page {}: hugelab plans x86-64 only, whose base page is 4K (with HugeTLB pages of 2M and 1G); other architectures' page sizes are not planned",
            args.base_page
        );
    }
    if args.struct_page == 0 || args.struct_page > base_page {
        bail!(
            "--struct-page {} is not a struct page size: 1 to {base_page} bytes",
            args.struct_page
        );
    }
    // The sizes HugeTLB offers on the machine hugelab models (x86_64: PMD
    // and PUD), the ones `mmap ... hugetlb=` takes.
    let offered = [HugetlbSize::Size2M, HugetlbSize::Size1G].map(|s| s.bytes().bytes());
    let asked: Vec<u64> = match args.size {
        Some(s) if !offered.contains(&s.bytes()) => bail!(
            "--size {s} is not a HugeTLB page size: they are {}",
            sizes_list(&offered, "and")
        ),
        Some(s) => vec![s.bytes()],
        None => offered.to_vec(),
    };
    // Plan what fits: the sizes that hold at least one page.
    let sizes: Vec<u64> = asked
        .iter()
        .copied()
        .filter(|&size| args.total.bytes() >= size)
        .collect();
    if sizes.is_empty() {
        let smallest = asked.iter().copied().min().unwrap_or(offered[0]);
        bail!(
            "{} holds no HugeTLB page ({}): give at least {}",
            args.total,
            sizes_list(&asked, "or"),
            Size(smallest)
        );
    }
    let g = VmemmapGeometry {
        base_page,
        struct_page: args.struct_page,
    };
    let plans: Vec<VmemmapPlan> = sizes
        .iter()
        .flat_map(|&size| HvoRule::ALL.map(|rule| vmemmap_plan(g, args.total.bytes(), size, rule)))
        .collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&plans)?);
    } else {
        print!("{}", render(&plans, args.total, &fits(args.total, &asked)));
    }
    Ok(ExitCode::SUCCESS)
}

/// `2M and 1G`, `2M`: sizes for a sentence.
fn sizes_list(sizes: &[u64], conjunction: &str) -> String {
    let names: Vec<String> = sizes.iter().map(|&s| Size(s).to_string()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => {
            format!("{} {conjunction} {last}", rest.join(", "))
        }
        _ => names.join(""),
    }
}

/// What `total` holds of each size when it is not a whole number of pages of
/// it: `1025M holds 512 × 2M pages; 1M left over`, `3M holds no 1G page`.
/// Nothing for a size it fills exactly.
fn fits(total: Size, sizes: &[u64]) -> Vec<String> {
    sizes
        .iter()
        .filter_map(|&size| {
            let pages = total.bytes() / size;
            let left = total.bytes() % size;
            let plural = if pages == 1 { "" } else { "s" };
            match (pages, left) {
                (_, 0) => None,
                (0, _) => Some(format!("{total} holds no {} page", Size(size))),
                _ => Some(format!(
                    "{total} holds {pages} × {} page{plural}; {} left over",
                    Size(size),
                    Size(left)
                )),
            }
        })
        .collect()
}

fn render(plans: &[VmemmapPlan], total: Size, fits: &[String]) -> String {
    let header = [
        "page size",
        "HVO rule",
        "huge pages",
        "vmemmap/page",
        "freed pages/page",
        "vmemmap without HVO",
        "with HVO",
        "saved",
    ]
    .map(String::from);
    let rows: Vec<Vec<String>> = plans
        .iter()
        .map(|p| {
            vec![
                Size(p.hpage_size).to_string(),
                p.rule.name().to_string(),
                p.huge_pages.to_string(),
                human(p.vmemmap_bytes_per_hpage),
                p.freed_pages_per_hpage.to_string(),
                human(p.vmemmap_bytes),
                human(p.vmemmap_bytes_hvo),
                human(p.saved_bytes()),
            ]
        })
        .collect();
    let notes: String = fits.iter().map(|f| format!("{f}\n")).collect();
    format!(
        "vmemmap of {total} of HugeTLB pages\n{notes}{}",
        table::render(&header, &rows)
    )
}
