//! The settings a measurement window checks around each statement: the
//! anonymous THP modes (transparent_hugepage/enabled and each size's
//! hugepages-<size>kB/enabled) and vm.hugetlb_optimize_vmemmap, read through
//! files kept open ([`ProcFile`]): a window reads them two or three times,
//! and the directory listing and opens were a large part of its cost.

use crate::procfile::ProcFile;
use crate::sysfs::{self, size_dirs, SYS_MM};
use hugelab_workload::{SetValue, ThpEnabled, ThpSizeEnabled, Tunable, VmSysctl};
use std::path::Path;

/// The THP modes as read at one moment.
#[derive(Clone)]
pub(crate) struct ThpModes {
    top: ThpEnabled,
    /// Each size's mode (None: it could not be read or parsed).
    sizes: Vec<(u64, Option<ThpSizeEnabled>)>,
}

impl ThpModes {
    /// The mTHP sizes the page-fault path may allocate.
    pub(crate) fn sizes_enabled(&self) -> Vec<u64> {
        self.sizes
            .iter()
            .filter(|(_, v)| v.is_some_and(|v| v.resolve(self.top) != ThpEnabled::Never))
            .map(|(kb, _)| *kb)
            .collect()
    }
}

/// Reads the settings again and again.
pub(crate) struct Modes {
    top: ProcFile,
    /// The sizes' `enabled` files (the size directories are fixed at boot).
    sizes: Vec<(u64, ProcFile)>,
    hvo: ProcFile,
    buf: Vec<u8>,
}

impl Modes {
    pub(crate) fn new() -> Modes {
        let thp = Path::new(SYS_MM).join("transparent_hugepage");
        Modes {
            top: ProcFile::single(sysfs::tunable_file(&Tunable::ThpEnabled)),
            sizes: size_dirs(&thp)
                .into_iter()
                .map(|size_kb| {
                    let t = Tunable::ThpSizeEnabled { size_kb };
                    (size_kb, ProcFile::single(sysfs::tunable_file(&t)))
                })
                .collect(),
            hvo: ProcFile::single(sysfs::tunable_file(&Tunable::Sysctl(
                VmSysctl::HugetlbOptimizeVmemmap,
            ))),
            buf: Vec::with_capacity(256),
        }
    }

    /// The THP modes now; None when transparent_hugepage/enabled cannot be
    /// read or parsed.
    pub(crate) fn thp(&mut self) -> Option<ThpModes> {
        let top = match read_setting(&mut self.top, &mut self.buf, &Tunable::ThpEnabled)? {
            SetValue::Enabled(e) => e,
            _ => return None,
        };
        let mut sizes = Vec::with_capacity(self.sizes.len());
        for (size_kb, file) in &mut self.sizes {
            let t = Tunable::ThpSizeEnabled { size_kb: *size_kb };
            let v = match read_setting(file, &mut self.buf, &t) {
                Some(SetValue::SizeEnabled(e)) => Some(e),
                _ => None,
            };
            sizes.push((*size_kb, v));
        }
        Some(ThpModes { top, sizes })
    }

    /// Whether vm.hugetlb_optimize_vmemmap is 1 now (absent: no HVO here).
    pub(crate) fn hvo_enabled(&mut self) -> bool {
        self.hvo.read_into(&mut self.buf).is_ok()
            && sysfs::selected(&String::from_utf8_lossy(&self.buf)) == "1"
    }
}

/// The value of tunable `t` read through `file`, as `set` would write it.
fn read_setting(file: &mut ProcFile, buf: &mut Vec<u8>, t: &Tunable) -> Option<SetValue> {
    file.read_into(buf).ok()?;
    t.parse_value(&sysfs::selected(&String::from_utf8_lossy(buf)))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_as_the_sysfs_readers_do() {
        let mut m = Modes::new();
        let Some(thp) = m.thp() else {
            eprintln!("skipped: no transparent_hugepage/enabled here");
            return;
        };
        assert_eq!(Some(thp.top), sysfs::thp_enabled());
        for (kb, v) in &thp.sizes {
            assert_eq!(*v, sysfs::thp_size_enabled(*kb), "hugepages-{kb}kB");
        }
        let hvo = sysfs::read_tunable(&Tunable::Sysctl(VmSysctl::HugetlbOptimizeVmemmap));
        assert_eq!(m.hvo_enabled(), hvo.is_ok_and(|v| v == "1"));
    }

    #[test]
    fn sizes_resolve_against_the_top_mode() {
        use ThpSizeEnabled::*;
        let modes = ThpModes {
            top: ThpEnabled::Always,
            sizes: vec![(16, Some(Never)), (64, Some(Inherit)), (2048, None)],
        };
        assert_eq!(modes.sizes_enabled(), vec![64]);
        let modes = ThpModes {
            top: ThpEnabled::Never,
            sizes: vec![(16, Some(Madvise)), (64, Some(Inherit))],
        };
        assert_eq!(modes.sizes_enabled(), vec![16]);
    }
}
