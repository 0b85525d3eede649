//! Reading and writing the tunables the model knows, by their kernel paths:
//! /sys/kernel/mm/<path> and /proc/sys/vm/<name> for `vm.<name>`.
//!
//! Bracketed choice files (`always [madvise] never`) read back as the selected
//! word, so a value read here can be written back unchanged.

use crate::error::{KernelError, Result};
use hugelab_workload::tunables::every_tunable;
pub use hugelab_workload::tunables::{PROC_VM, SYS_MM};
use hugelab_workload::{SetValue, ThpEnabled, ThpSizeEnabled, Tunable};
use std::fs;
use std::path::{Path, PathBuf};

/// The file a tunable lives in.
pub fn tunable_file(t: &Tunable) -> PathBuf {
    let path = t.path();
    match path.strip_prefix("vm.") {
        Some(name) => Path::new(PROC_VM).join(name),
        None => Path::new(SYS_MM).join(path),
    }
}

/// Reads a file, trimmed; `[x]`-style choice files give the selected word.
pub fn read_value(file: &Path) -> Result<String> {
    let text = fs::read_to_string(file).map_err(|e| KernelError::io(file, e))?;
    Ok(selected(&text))
}

pub(crate) fn selected(text: &str) -> String {
    let text = text.trim();
    match (text.find('['), text.find(']')) {
        (Some(a), Some(b)) if a < b => text[a + 1..b].to_string(),
        _ => text.to_string(),
    }
}

pub fn read_tunable(t: &Tunable) -> Result<String> {
    read_value(&tunable_file(t))
}

/// transparent_hugepage/enabled now; None if it cannot be read or parsed.
pub fn thp_enabled() -> Option<ThpEnabled> {
    match read_setting(&Tunable::ThpEnabled)? {
        SetValue::Enabled(e) => Some(e),
        _ => None,
    }
}

/// transparent_hugepage/hugepages-<size_kb>kB/enabled now; None if it
/// cannot be read or parsed.
pub fn thp_size_enabled(size_kb: u64) -> Option<ThpSizeEnabled> {
    match read_setting(&Tunable::ThpSizeEnabled { size_kb })? {
        SetValue::SizeEnabled(e) => Some(e),
        _ => None,
    }
}

/// A tunable's value now, as `set` would write it.
fn read_setting(t: &Tunable) -> Option<SetValue> {
    t.parse_value(&read_tunable(t).ok()?).ok()
}

/// Writes a value the way `echo value > file` does.
pub fn write_value(file: &Path, value: &str) -> Result<()> {
    fs::write(file, format!("{value}\n")).map_err(|e| KernelError::io(file, e))
}

/// Every tunable the model knows that exists on this machine, in a stable
/// order: THP global files, per-size enabled, khugepaged, hugetlb pools, vm
/// sysctls. A file the running kernel does not have (the vendor knob
/// anon_beside_full, a hugetlb size the CPU lacks) is left out.
pub fn known_tunables() -> Vec<Tunable> {
    let thp = size_dirs(&Path::new(SYS_MM).join("transparent_hugepage"));
    let hugetlb = size_dirs(&Path::new(SYS_MM).join("hugepages"));
    let mut out = every_tunable(&thp, &hugetlb);
    out.retain(|t| tunable_file(t).exists());
    out
}

/// The sizes of the `hugepages-<n>kB` directories under `dir`, ascending.
pub fn size_dirs(dir: &Path) -> Vec<u64> {
    let mut sizes: Vec<u64> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()
        })
        .collect();
    sizes.sort_unstable();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_word_of_choice_files() {
        assert_eq!(selected("always [madvise] never\n"), "madvise");
        assert_eq!(
            selected("[always] defer defer+madvise madvise never"),
            "always"
        );
        assert_eq!(selected("511\n"), "511");
    }

    #[test]
    fn sysctls_live_in_proc_sys_vm() {
        let t: Tunable = "vm.nr_hugepages".parse().unwrap();
        assert_eq!(tunable_file(&t), Path::new("/proc/sys/vm/nr_hugepages"));
        let t: Tunable = "transparent_hugepage/hugepages-64kB/enabled"
            .parse()
            .unwrap();
        assert_eq!(
            tunable_file(&t),
            Path::new("/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled")
        );
    }
}
