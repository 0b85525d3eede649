//! tracefs: mounted for the recording if it is not, its tracepoints' ids
//! read from `events/SYSTEM/NAME/id`, and unmounted after if we mounted it,
//! on every ending: [`Tracefs`]'s drop, and [`undo`] from the signal path.

use crate::error::{KernelError, Result};
use std::ffi::CString;
use std::io;
use std::path::Path;
use std::sync::Mutex;

const TRACEFS: &str = "/sys/kernel/tracing";

/// Whether this process mounted tracefs and has not unmounted it yet. A
/// mutex, so the signal path and the drop never both unmount (the second
/// would unmount a tracefs someone mounted meanwhile).
static MOUNTED_BY_US: Mutex<bool> = Mutex::new(false);

/// tracefs, mounted for as long as this lives.
pub struct Tracefs {
    _private: (),
}

impl Tracefs {
    /// Mounts tracefs at /sys/kernel/tracing unless it is mounted there.
    pub fn open() -> Result<Tracefs> {
        let mut ours = MOUNTED_BY_US.lock().unwrap_or_else(|p| p.into_inner());
        if !is_mounted()? {
            mount()?;
            *ours = true;
        }
        Ok(Tracefs { _private: () })
    }

    /// The id of tracepoint `system:name`.
    pub fn id(&self, system: &str, name: &str) -> Result<u64> {
        let path = Path::new(TRACEFS)
            .join("events")
            .join(system)
            .join(name)
            .join("id");
        let text = std::fs::read_to_string(&path).map_err(|e| KernelError::io(&path, e))?;
        text.trim().parse().map_err(|_| {
            KernelError::Refused(format!("{} holds {text:?}, not an id", path.display()))
        })
    }
}

impl Drop for Tracefs {
    fn drop(&mut self) {
        if let Err(e) = undo() {
            eprintln!("hugelab: {e}");
        }
    }
}

/// Unmounts tracefs if this process mounted it (and has not yet).
pub fn undo() -> Result<()> {
    let mut ours = MOUNTED_BY_US.lock().unwrap_or_else(|p| p.into_inner());
    if *ours {
        let target = CString::new(TRACEFS).expect("no NUL");
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
            let e = io::Error::last_os_error();
            return Err(KernelError::Refused(format!(
                "cannot unmount the tracefs hugelab mounted at {TRACEFS}: {e}; unmount it with `umount {TRACEFS}`"
            )));
        }
        *ours = false;
    }
    Ok(())
}

/// Whether tracefs is mounted at /sys/kernel/tracing (/proc/self/mounts).
pub fn is_mounted() -> Result<bool> {
    let path = "/proc/self/mounts";
    let text = std::fs::read_to_string(path).map_err(|e| KernelError::io(path, e))?;
    Ok(text.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (_, dir, kind) = (f.next(), f.next(), f.next());
        dir == Some(TRACEFS) && kind == Some("tracefs")
    }))
}

fn mount() -> Result<()> {
    let (src, target, kind) = (
        CString::new("nodev").expect("no NUL"),
        CString::new(TRACEFS).expect("no NUL"),
        CString::new("tracefs").expect("no NUL"),
    );
    // SAFETY: NUL-terminated strings; no data.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            kind.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(KernelError::Refused(format!(
            "cannot mount tracefs at {TRACEFS}: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}
