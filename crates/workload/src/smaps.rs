//! The fields of /proc/PID/smaps that hugelab reports, defined once, in the
//! order Linux 6.18 `fs/proc/task_mmu.c` `__show_smap` prints them. The
//! model's `MemSizeStats`, the kernel backend's smaps reader and the counter
//! registry's `smaps.<proc>[.<region>].<field>` take names and order from
//! [`SmapsField::ALL`].

/// One smaps field hugelab reports (kB).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SmapsField {
    Rss,
    Pss,
    SharedClean,
    SharedDirty,
    PrivateClean,
    PrivateDirty,
    Anonymous,
    LazyFree,
    AnonHugePages,
    SharedHugetlb,
    PrivateHugetlb,
}

impl SmapsField {
    /// Every field, in smaps order; `f as usize` is `f`'s index here.
    pub const ALL: [SmapsField; 11] = [
        SmapsField::Rss,
        SmapsField::Pss,
        SmapsField::SharedClean,
        SmapsField::SharedDirty,
        SmapsField::PrivateClean,
        SmapsField::PrivateDirty,
        SmapsField::Anonymous,
        SmapsField::LazyFree,
        SmapsField::AnonHugePages,
        SmapsField::SharedHugetlb,
        SmapsField::PrivateHugetlb,
    ];

    /// The field's name as smaps prints it (before the `:`).
    pub const fn name(self) -> &'static str {
        match self {
            SmapsField::Rss => "Rss",
            SmapsField::Pss => "Pss",
            SmapsField::SharedClean => "Shared_Clean",
            SmapsField::SharedDirty => "Shared_Dirty",
            SmapsField::PrivateClean => "Private_Clean",
            SmapsField::PrivateDirty => "Private_Dirty",
            SmapsField::Anonymous => "Anonymous",
            SmapsField::LazyFree => "LazyFree",
            SmapsField::AnonHugePages => "AnonHugePages",
            SmapsField::SharedHugetlb => "Shared_Hugetlb",
            SmapsField::PrivateHugetlb => "Private_Hugetlb",
        }
    }

    /// The field named `name`, if hugelab reports it.
    pub fn from_name(name: &str) -> Option<SmapsField> {
        SmapsField::ALL.into_iter().find(|f| f.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_declaration_order_and_names_round_trip() {
        for (i, f) in SmapsField::ALL.into_iter().enumerate() {
            assert_eq!(f as usize, i);
            assert_eq!(SmapsField::from_name(f.name()), Some(f));
        }
        assert_eq!(SmapsField::from_name("Size"), None);
    }
}
