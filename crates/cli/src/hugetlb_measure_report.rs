//! The figures of `hugelab hugetlb measure` and their tables: per size and
//! HVO setting, the vmemmap given back per huge page from the memmap
//! counters (exact) and from the free-page counts (noisy: how noisy is
//! measured too), the grow and shrink times, beside the model's prediction
//! and seed 003's 2021 figures.
//!
//! Per-page figures divide by the pages each grow added (target minus the
//! pool's old size). Medians, with the smallest and largest value, since a
//! few cycles on a VM have outliers (a slow host fault) that a mean would
//! spread over the rest.

use crate::table;
use hugelab_kernel::hugetlb::{Cycle, PoolRun};
use hugelab_model::hugetlb_vmemmap::{hugetlb_vmemmap_optimizable_pages, HvoRule, VmemmapGeometry};
use hugelab_workload::Size;
use serde::Serialize;

/// Seed 003's cover letter (Muchun Song, v23, 2021): `time echo 10240 >
/// /proc/sys/vm/nr_hugepages` and `echo 0`, 2M pages, without and with the
/// series.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SeedTimes {
    pub pages: u64,
    pub grow_s_off: f64,
    pub grow_s_on: f64,
    pub shrink_s_off: f64,
    pub shrink_s_on: f64,
}

pub const SEED_2M: SeedTimes = SeedTimes {
    pages: 10240,
    grow_s_off: 0.067,
    grow_s_on: 0.166,
    shrink_s_off: 0.081,
    shrink_s_on: 0.213,
};

/// The median, smallest and largest of some values.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// None for no values (NaNs are not expected: every value is a ratio of
    /// counters to a positive page count, or a duration).
    pub fn of(xs: &[f64]) -> Option<Spread> {
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }

    pub fn range(&self) -> f64 {
        self.max - self.min
    }

    fn scaled(&self, k: f64) -> Spread {
        Spread {
            median: self.median * k,
            min: self.min * k,
            max: self.max * k,
        }
    }
}

/// One size's measured cycles with one HVO setting.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SettingFigures {
    pub hvo: bool,
    pub cycles: usize,
    /// Vmemmap pages given back per huge page grown: −Δ(nr_memmap_pages +
    /// nr_memmap_boot_pages) / pages.
    pub memmap_given_back_per_page: Spread,
    /// Vmemmap pages allocated again per huge page the shrink freed.
    pub memmap_taken_back_per_page: Spread,
    /// Free pages a grow used per huge page: −Δ(nr_free_pages + the
    /// per-cpu lists' pages) / pages.
    pub free_pages_used_per_page: Spread,
    /// The same from nr_free_pages alone, which misses the 2 MiB blocks
    /// that move between the per-cpu lists and the buddy lists.
    pub nr_free_pages_used_per_page: Spread,
    pub grow_ms: Spread,
    pub shrink_ms: Spread,
    /// The model's vmemmap pages freed per huge page: Linux 6.18's rule with
    /// HVO on (`hugetlb_vmemmap_optimizable_pages`), 0 off.
    pub model_given_back_per_page: u64,
    /// The same under the 2021 series' rule (seed 003).
    pub seed_given_back_per_page: u64,
}

/// The saving as a free-page count shows it, against the memmap counters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FreePageCheck {
    /// Which count: "free pages + per-cpu lists" or "nr_free_pages alone".
    pub source: &'static str,
    /// Median free pages used per huge page with HVO off minus with HVO on.
    pub given_back_per_page: f64,
    /// Half the sum of the two settings' ranges (max − min over the cycles)
    /// of free pages used per huge page.
    pub spread_per_page: f64,
    /// The largest |Δnr_free_pages| over an idle interval as long as a
    /// grow, in pages, and per huge page grown.
    pub idle_drift_pages: i64,
    pub idle_drift_per_page: f64,
    /// The larger of the spread and the idle drift, per huge page.
    pub noise_per_page: f64,
    /// Median memmap figure with HVO on minus with HVO off.
    pub memmap_given_back_per_page: f64,
    /// The two figures differ by no more than the noise.
    pub agrees: bool,
}

/// HVO on over HVO off, medians.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Ratios {
    pub grow: f64,
    pub shrink: f64,
}

/// The grow that fell short of the target.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Short {
    pub hvo: bool,
    pub warmup: bool,
    pub repeat: u32,
    pub reached: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SizeReport {
    /// "2M", "1G".
    pub size: String,
    pub size_kb: u64,
    /// nr_hugepages before and after.
    pub original_pool: u64,
    /// The size each grow wrote.
    pub target: u64,
    /// Pages each grow added: the divisor of every per-page figure.
    pub pages_per_grow: u64,
    /// Figures exist only when every grow reached the target.
    pub short: Option<Short>,
    pub hvo_off: Option<SettingFigures>,
    pub hvo_on: Option<SettingFigures>,
    /// From nr_free_pages + the per-cpu lists, then from nr_free_pages
    /// alone.
    pub free_pages: Vec<FreePageCheck>,
    pub on_off_ratio: Option<Ratios>,
    /// Every cycle, warm-ups included, in the order run.
    pub cycles: Vec<Cycle>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub warmup: u32,
    pub repeat: u32,
    pub sizes: Vec<SizeReport>,
    /// Sizes this kernel has no pool of.
    pub not_offered: Vec<String>,
    /// Seed 003's times, 2M pages.
    pub seed_2m: SeedTimes,
    /// What the settings guard put back: (tunable, value).
    pub restored: Vec<(String, String)>,
}

/// The report of the pools measured.
pub fn report(
    runs: Vec<PoolRun>,
    not_offered: Vec<String>,
    warmup: u32,
    repeat: u32,
    restored: Vec<(String, String)>,
) -> Report {
    Report {
        warmup,
        repeat,
        sizes: runs.into_iter().map(size_report).collect(),
        not_offered,
        seed_2m: SEED_2M,
        restored,
    }
}

fn size_report(run: PoolRun) -> SizeReport {
    let size = run.size_kb << 10;
    let pages = run.target - run.original;
    let mut cycles = run.cycles;
    let short = run.short.map(|c| {
        let s = Short {
            hvo: c.hvo,
            warmup: c.warmup,
            repeat: c.repeat,
            reached: c.reached,
        };
        cycles.push(c);
        s
    });
    let mut r = SizeReport {
        size: Size(size).to_string(),
        size_kb: run.size_kb,
        original_pool: run.original,
        target: run.target,
        pages_per_grow: pages,
        short,
        hvo_off: None,
        hvo_on: None,
        free_pages: Vec::new(),
        on_off_ratio: None,
        cycles,
    };
    if r.short.is_some() {
        return r;
    }
    let measured = |hvo| -> Vec<&Cycle> {
        r.cycles
            .iter()
            .filter(|c| c.hvo == hvo && !c.warmup)
            .collect()
    };
    let (off, on) = (measured(false), measured(true));
    let (Some(off_f), Some(on_f)) = (
        setting_figures(&off, false, size, pages),
        setting_figures(&on, true, size, pages),
    ) else {
        return r;
    };
    let idle = |f: fn(&Cycle) -> i64| off.iter().chain(&on).map(|c| f(c).abs()).max().unwrap_or(0);
    let memmap = on_f.memmap_given_back_per_page.median - off_f.memmap_given_back_per_page.median;
    r.free_pages = vec![
        free_page_check(
            FREE_AND_PCP,
            &off_f.free_pages_used_per_page,
            &on_f.free_pages_used_per_page,
            idle(|c| c.idle.free),
            pages,
            memmap,
        ),
        free_page_check(
            NR_FREE_PAGES,
            &off_f.nr_free_pages_used_per_page,
            &on_f.nr_free_pages_used_per_page,
            idle(|c| c.idle.nr_free_pages),
            pages,
            memmap,
        ),
    ];
    r.on_off_ratio = Some(Ratios {
        grow: on_f.grow_ms.median / off_f.grow_ms.median,
        shrink: on_f.shrink_ms.median / off_f.shrink_ms.median,
    });
    r.hvo_off = Some(off_f);
    r.hvo_on = Some(on_f);
    r
}

fn setting_figures(cycles: &[&Cycle], hvo: bool, size: u64, pages: u64) -> Option<SettingFigures> {
    let per_page = |f: fn(&Cycle) -> i64| -> Option<Spread> {
        let xs: Vec<f64> = cycles.iter().map(|c| f(c) as f64 / pages as f64).collect();
        Spread::of(&xs)
    };
    let ms = |f: fn(&Cycle) -> f64| -> Option<Spread> {
        Spread::of(&cycles.iter().map(|c| f(c) * 1e3).collect::<Vec<_>>())
    };
    let g = VmemmapGeometry::default();
    let freed = |rule| {
        if hvo {
            hugetlb_vmemmap_optimizable_pages(g, size, rule)
        } else {
            0
        }
    };
    Some(SettingFigures {
        hvo,
        cycles: cycles.len(),
        memmap_given_back_per_page: per_page(|c| -c.grow.memmap)?,
        memmap_taken_back_per_page: per_page(|c| c.shrink.memmap)?,
        free_pages_used_per_page: per_page(|c| -c.grow.free)?,
        nr_free_pages_used_per_page: per_page(|c| -c.grow.nr_free_pages)?,
        grow_ms: ms(|c| c.grow_s)?,
        shrink_ms: ms(|c| c.shrink_s)?,
        model_given_back_per_page: freed(HvoRule::Linux618),
        seed_given_back_per_page: freed(HvoRule::Series2021),
    })
}

const FREE_AND_PCP: &str = "free + per-cpu lists";
const NR_FREE_PAGES: &str = "nr_free_pages alone";

/// A free-page figure and its noise: the spread of each setting over its
/// cycles (free pages used per huge page, `off` and `on`), and how far the
/// count moves on its own over as long a time (`idle_drift_pages`).
fn free_page_check(
    source: &'static str,
    off: &Spread,
    on: &Spread,
    idle_drift_pages: i64,
    pages: u64,
    memmap: f64,
) -> FreePageCheck {
    let given_back = off.median - on.median;
    let spread = (off.range() + on.range()) / 2.0;
    let drift = idle_drift_pages as f64 / pages as f64;
    let noise = spread.max(drift);
    FreePageCheck {
        source,
        given_back_per_page: given_back,
        spread_per_page: spread,
        idle_drift_pages,
        idle_drift_per_page: drift,
        noise_per_page: noise,
        memmap_given_back_per_page: memmap,
        agrees: (given_back - memmap).abs() <= noise,
    }
}

/// A figure: whole numbers as such, others with `decimals`.
fn num(x: f64, decimals: usize) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x:.decimals$}")
    }
}

/// "median (min..max)", or the one value when all are equal.
fn spread(s: &Spread, decimals: usize) -> String {
    if s.min == s.max {
        num(s.median, decimals)
    } else {
        format!(
            "{} ({}..{})",
            num(s.median, decimals),
            num(s.min, decimals),
            num(s.max, decimals)
        )
    }
}

fn hvo_name(hvo: bool) -> &'static str {
    if hvo {
        "on"
    } else {
        "off"
    }
}

impl Report {
    pub fn render(&self) -> String {
        let measured: Vec<&SizeReport> = self.sizes.iter().filter(|s| s.hvo_on.is_some()).collect();
        let sizes: Vec<String> = self
            .sizes
            .iter()
            .map(|s| format!("{} {} -> {}", s.size, s.original_pool, s.target))
            .collect();
        let mut out = format!(
            "hugelab hugetlb measure: pools {}; {} measured cycles per HVO setting after {} warm-up, HVO off then on in each round\n",
            sizes.join(", "),
            self.repeat,
            self.warmup
        );
        if !measured.is_empty() {
            out.push_str(&self.given_back_table(&measured));
            out.push_str(&self.free_page_table(&measured));
            out.push_str(&self.time_table(&measured));
        }
        out.push('\n');
        for s in &self.sizes {
            if let Some(short) = &s.short {
                let which = if short.warmup { "warm-up" } else { "repeat" };
                out.push_str(&format!(
                    "{}: the pool reached {} of the {} pages asked (HVO {}, {which} {}); its figures are left out\n",
                    s.size,
                    short.reached,
                    s.target,
                    hvo_name(short.hvo),
                    short.repeat + 1
                ));
            }
        }
        for s in &self.not_offered {
            out.push_str(&format!(
                "{s}: not measured, this kernel has no pool of it\n"
            ));
        }
        out.push_str(
            "memmap counters: nr_memmap_pages + nr_memmap_boot_pages after stat_refresh; model: hugetlb_vmemmap_optimizable_pages, Linux 6.18 rule (4K pages, 64-byte struct page)\n\
             seed 003 (HVO series, 2021): 6 vmemmap pages freed per 2M page and 4094 per 1G; echo 10240 > nr_hugepages 0.067 s without HVO, 0.166 s with (~2x); echo 0 0.081 s and 0.213 s (~2-3x)\n",
        );
        if !self.restored.is_empty() {
            let r: Vec<String> = self
                .restored
                .iter()
                .map(|(t, v)| format!("{t} {v}"))
                .collect();
            out.push_str(&format!("restored: {}\n", r.join(", ")));
        }
        out
    }

    fn given_back_table(&self, sizes: &[&SizeReport]) -> String {
        let header = [
            "size",
            "HVO",
            "given back: memmap counters",
            "model (6.18)",
            "seed 003 (2021)",
            "taken back by the shrink",
            "free pages used",
        ]
        .map(String::from);
        let mut rows = Vec::new();
        for s in sizes {
            for f in [&s.hvo_off, &s.hvo_on].into_iter().flatten() {
                rows.push(vec![
                    s.size.clone(),
                    hvo_name(f.hvo).to_string(),
                    spread(&f.memmap_given_back_per_page, 2),
                    f.model_given_back_per_page.to_string(),
                    f.seed_given_back_per_page.to_string(),
                    spread(&f.memmap_taken_back_per_page, 2),
                    spread(&f.free_pages_used_per_page, 2),
                ]);
            }
        }
        format!(
            "\nvmemmap pages (4 KiB) per huge page, median (min..max)\n{}",
            table::render(&header, &rows)
        )
    }

    fn free_page_table(&self, sizes: &[&SizeReport]) -> String {
        let header = [
            "size",
            "count",
            "off - on",
            "noise +-",
            "spread",
            "idle drift",
            "memmap counters",
            "within the noise",
        ]
        .map(String::from);
        let rows: Vec<Vec<String>> = sizes
            .iter()
            .flat_map(|s| s.free_pages.iter().map(move |f| (s, f)))
            .map(|(s, f)| {
                vec![
                    s.size.clone(),
                    f.source.to_string(),
                    format!("{:.2}", f.given_back_per_page),
                    format!("{:.2}", f.noise_per_page),
                    format!("{:.2}", f.spread_per_page),
                    format!(
                        "{:.2} ({} pages)",
                        f.idle_drift_per_page, f.idle_drift_pages
                    ),
                    num(f.memmap_given_back_per_page, 2),
                    if f.agrees { "yes" } else { "no" }.to_string(),
                ]
            })
            .collect();
        format!(
            "\nvmemmap pages given back per huge page, from the free pages a grow used with HVO off minus on (noise: the larger of half the two settings' ranges and the largest idle drift over as long as a grow)\n{}",
            table::render(&header, &rows)
        )
    }

    fn time_table(&self, sizes: &[&SizeReport]) -> String {
        let header = [
            "size",
            "HVO",
            "grow ms",
            "shrink ms",
            "grow us/page",
            "shrink us/page",
            "seed 003 grow us/page",
            "seed 003 shrink us/page",
        ]
        .map(String::from);
        let seed = self.seed_2m;
        let us = |s: f64| format!("{:.1}", s * 1e6 / seed.pages as f64);
        let mut rows = Vec::new();
        for s in sizes {
            let is_2m = s.size_kb == 2048;
            let per_page = 1e3 / s.pages_per_grow as f64;
            for f in [&s.hvo_off, &s.hvo_on].into_iter().flatten() {
                let (sg, ss) = match (is_2m, f.hvo) {
                    (false, _) => ("-".to_string(), "-".to_string()),
                    (true, false) => (us(seed.grow_s_off), us(seed.shrink_s_off)),
                    (true, true) => (us(seed.grow_s_on), us(seed.shrink_s_on)),
                };
                rows.push(vec![
                    s.size.clone(),
                    hvo_name(f.hvo).to_string(),
                    spread(&f.grow_ms, 2),
                    spread(&f.shrink_ms, 2),
                    format!("{:.1}", f.grow_ms.scaled(per_page).median),
                    format!("{:.1}", f.shrink_ms.scaled(per_page).median),
                    sg,
                    ss,
                ]);
            }
            if let Some(r) = &s.on_off_ratio {
                let (sg, ss) = if is_2m {
                    (
                        format!("{:.2}x", seed.grow_s_on / seed.grow_s_off),
                        format!("{:.2}x", seed.shrink_s_on / seed.shrink_s_off),
                    )
                } else {
                    ("-".to_string(), "-".to_string())
                };
                rows.push(vec![
                    s.size.clone(),
                    "on/off".to_string(),
                    format!("{:.2}x", r.grow),
                    format!("{:.2}x", r.shrink),
                    String::new(),
                    String::new(),
                    sg,
                    ss,
                ]);
            }
        }
        format!(
            "\ntime of the nr_hugepages write, median (min..max); seed 003: 10240 2M pages\n{}",
            table::render(&header, &rows)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hugelab_kernel::hugetlb::Delta;
    use hugelab_workload::units::PAGE_KB;

    #[test]
    fn spread_median_of_odd_and_even_counts() {
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Spread::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.range()), (2.5, 1.0, 4.0, 3.0));
        assert_eq!(Spread::of(&[]), None);
    }

    #[test]
    fn figures_print_whole_numbers_whole() {
        assert_eq!(spread(&Spread::of(&[7.0, 7.0]).unwrap(), 2), "7");
        assert_eq!(
            spread(&Spread::of(&[6.5, 7.0, 7.25]).unwrap(), 2),
            "7 (6.50..7.25)"
        );
        assert_eq!(num(-0.0, 2), "-0");
        assert_eq!(num(0.125, 2), "0.12");
    }

    /// `free` pages, of which 512 more than nr_free_pages saw (a 2 MiB
    /// block from a per-cpu list) when `pcp`.
    fn delta(memmap: i64, free: i64, pcp: bool) -> Delta {
        Delta {
            memmap,
            nr_memmap_pages: memmap,
            nr_memmap_boot_pages: 0,
            free,
            nr_free_pages: if pcp { free + 512 } else { free },
            mem_free_kb: free * PAGE_KB as i64,
        }
    }

    /// A cycle of 64 2M pages: HVO gives back 7 vmemmap pages of each;
    /// `noise` free pages from elsewhere.
    fn cycle(hvo: bool, warmup: bool, repeat: u32, noise: i64, grow_s: f64) -> Cycle {
        let back = if hvo { 7 * 64 } else { 0 };
        Cycle {
            hvo,
            warmup,
            repeat,
            grow_s,
            shrink_s: grow_s * 2.0,
            reached: 64,
            grow: delta(-back, -512 * 64 + back + noise, repeat == 1),
            shrink: delta(back, 512 * 64 - back, false),
            grow_window_s: grow_s + 0.002,
            idle: delta(0, noise / 2, false),
            idle_s: grow_s + 0.002,
        }
    }

    fn run(cycles: Vec<Cycle>, short: Option<Cycle>) -> PoolRun {
        PoolRun {
            size_kb: 2048,
            original: 0,
            target: 64,
            cycles,
            short,
        }
    }

    #[test]
    fn figures_of_a_pool_leave_warmups_out() {
        let cycles = vec![
            // A warm-up far off: it must not count.
            cycle(false, true, 0, 10_000, 1.0),
            cycle(true, true, 0, 10_000, 1.0),
            cycle(false, false, 0, 0, 0.001),
            cycle(true, false, 0, 64, 0.003),
            cycle(false, false, 1, -64, 0.002),
            cycle(true, false, 1, 0, 0.004),
            cycle(false, false, 2, 32, 0.003),
            cycle(true, false, 2, -32, 0.005),
        ];
        let r = size_report(run(cycles, None));
        assert_eq!(r.cycles.len(), 8);
        let (off, on) = (r.hvo_off.unwrap(), r.hvo_on.unwrap());
        assert_eq!(off.cycles, 3);
        assert_eq!(off.memmap_given_back_per_page, Spread::of(&[0.0]).unwrap());
        assert_eq!(on.memmap_given_back_per_page, Spread::of(&[7.0]).unwrap());
        assert_eq!(on.memmap_taken_back_per_page.median, 7.0);
        assert_eq!(
            (on.model_given_back_per_page, on.seed_given_back_per_page),
            (7, 6)
        );
        assert_eq!(
            (off.model_given_back_per_page, off.seed_given_back_per_page),
            (0, 0)
        );
        // Free pages used: off 512 + {0, 1, -0.5}, on 505 + {-1, 0, 0.5}.
        assert_eq!(off.free_pages_used_per_page.median, 512.0);
        assert_eq!(on.free_pages_used_per_page.range(), 1.5);
        let f = &r.free_pages[0];
        assert_eq!(f.source, "free + per-cpu lists");
        assert_eq!(f.given_back_per_page, 7.0);
        assert_eq!(f.spread_per_page, 1.5);
        assert_eq!(f.idle_drift_pages, 32);
        assert_eq!(f.idle_drift_per_page, 0.5);
        assert_eq!(f.noise_per_page, 1.5);
        assert!(f.agrees);
        // Repeat 1's grows took a 2 MiB block each from a per-cpu list:
        // nr_free_pages alone saw 8 pages fewer used per huge page there.
        let b = &r.free_pages[1];
        assert_eq!(b.source, "nr_free_pages alone");
        // Off: 512, 513 − 8, 511.5; on: 504, 505 − 8, 505.5.
        assert_eq!(off.nr_free_pages_used_per_page.min, 513.0 - 8.0);
        assert_eq!(b.spread_per_page, (7.0 + 8.5) / 2.0);
        assert!(b.agrees, "7 ± 7.75");
        assert_eq!(off.grow_ms.median, 2.0);
        let ratio = r.on_off_ratio.unwrap();
        assert!((ratio.grow - 2.0).abs() < 1e-9 && (ratio.shrink - 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_free_page_figure_outside_the_noise_disagrees() {
        // HVO on seems to give back 9 pages each, with a spread of 0.
        let mut on = cycle(true, false, 0, 0, 0.002);
        on.grow.free += 2 * 64;
        let r = size_report(run(vec![cycle(false, false, 0, 0, 0.001), on], None));
        let f = &r.free_pages[0];
        assert_eq!((f.given_back_per_page, f.noise_per_page), (9.0, 0.0));
        assert!(!f.agrees);
    }

    #[test]
    fn a_short_pool_has_no_figures_and_says_so() {
        let mut c = cycle(true, false, 1, 0, 0.002);
        c.reached = 40;
        let mut r = report(
            vec![run(vec![cycle(false, false, 0, 0, 0.001)], Some(c))],
            vec!["1G".to_string()],
            0,
            3,
            vec![],
        );
        let s = &r.sizes[0];
        assert_eq!(s.cycles.len(), 2, "the short cycle is kept");
        assert!(s.hvo_off.is_none() && s.hvo_on.is_none() && s.free_pages.is_empty());
        r.restored = vec![("hugepages/hugepages-2048kB/nr_hugepages".into(), "0".into())];
        let text = r.render();
        assert!(
            text.contains("2M: the pool reached 40 of the 64 pages asked (HVO on, repeat 2); its figures are left out"),
            "{text}"
        );
        assert!(text.contains("1G: not measured"), "{text}");
        assert!(!text.contains("| 2M"), "{text}");
        assert!(text.contains("restored: hugepages/hugepages-2048kB/nr_hugepages 0"));
    }

    /// The cells of every table row whose first two cells are `a` and `b`.
    fn rows<'a>(text: &'a str, a: &'a str, b: &'a str) -> impl Iterator<Item = Vec<String>> + 'a {
        crate::table::all_row_cells(text)
            .filter(move |c| c[0] == a && c.get(1).is_some_and(|x| x == b))
    }

    #[test]
    fn tables_hold_the_figures_beside_the_models_and_seeds() {
        let cycles = vec![
            cycle(false, false, 0, 0, 0.001),
            cycle(true, false, 0, 0, 0.003),
        ];
        let r = report(vec![run(cycles, None)], vec![], 0, 1, vec![]);
        let text = r.render();
        let cells = |a, b| rows(&text, a, b).collect::<Vec<_>>();
        // Given back, model, seed, taken back, free pages used.
        assert_eq!(
            cells("2M", "off")[0][2..],
            ["0", "0", "0", "0", "512"].map(String::from),
            "{text}"
        );
        assert_eq!(
            cells("2M", "on")[0][2..],
            ["7", "7", "6", "7", "505"].map(String::from),
            "{text}"
        );
        // Off − on, noise, spread, idle drift, memmap, agrees.
        assert_eq!(
            cells("2M", "free + per-cpu lists")[0][2..],
            ["7.00", "0.00", "0.00", "0.00 (0 pages)", "7", "yes"].map(String::from),
            "{text}"
        );
        // 1 ms and 2 ms for 64 pages; seed 003: 67 ms and 81 ms for 10240.
        assert_eq!(
            cells("2M", "off")[1][2..],
            ["1", "2", "15.6", "31.2", "6.5", "7.9"].map(String::from),
            "{text}"
        );
        // 3 ms vs 1 ms; seed 003: 0.166 s / 0.067 s and 0.213 s / 0.081 s.
        assert_eq!(
            cells("2M", "on/off")[0][2..],
            ["3.00x", "3.00x", "", "", "2.48x", "2.63x"].map(String::from),
            "{text}"
        );
    }
}
