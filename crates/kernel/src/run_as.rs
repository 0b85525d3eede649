//! Who a measured command runs as: `hugelab bench` keeps root for its own
//! work (tunables, cgroups) and runs the command as the user who invoked
//! sudo (`SUDO_UID`, `SUDO_GID`), or as `--user NAME`, with the user's
//! supplementary groups (getgrouplist) and a clean environment the way
//! sudo's `env_reset` makes one: HOME, SHELL, USER and LOGNAME from the
//! passwd entry, a fixed PATH (Debian's `secure_path`), and TERM, LANG,
//! LANGUAGE and LC_* kept from hugelab's own environment.
//!
//! The child drops (setgroups, setgid, setuid, in that order: only root may
//! set groups and gid) between fork and exec, after it has joined its memory
//! cgroup ([`crate::command`]); [`RunAs::drop_privileges`] is the
//! async-signal-safe part it calls there. Like sudo's `closefrom 3`, it also
//! keeps every descriptor above stderr from reaching the command: one that
//! hugelab inherited (a file root opened for writing, say) would otherwise
//! let the user's command use it as root could.

use crate::error::{KernelError, Result};
use std::ffi::{CStr, CString};

/// PATH in the command's environment.
pub const SANE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Variables kept from hugelab's environment (and every `LC_*`).
const KEPT: [&str; 3] = ["TERM", "LANG", "LANGUAGE"];

/// A user to run a command as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, the primary one included.
    pub groups: Vec<u32>,
    pub home: String,
    pub shell: String,
}

/// A passwd entry's fields.
struct Passwd {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
    shell: String,
}

impl RunAs {
    /// The user named `name` (or a numeric uid), with their primary group.
    pub fn user(name: &str) -> Result<RunAs> {
        let pw = match name.parse::<u32>() {
            Ok(uid) => passwd_of_uid(uid),
            Err(_) => passwd_of_name(name),
        }
        .ok_or_else(|| KernelError::Refused(format!("there is no user {name} on this machine")))?;
        let gid = pw.gid;
        Ok(RunAs::of(pw, gid))
    }

    /// The user who ran `sudo hugelab …`, from `SUDO_UID` and `SUDO_GID`
    /// (`var` reads the environment); None when they are not set or name
    /// root.
    pub fn sudo_invoker(var: impl Fn(&str) -> Option<String>) -> Result<Option<RunAs>> {
        let Some(uid) = var("SUDO_UID") else {
            return Ok(None);
        };
        let bad =
            |what: &str, v: &str| KernelError::Refused(format!("{what} is {v:?}, not a number"));
        let uid: u32 = uid.trim().parse().map_err(|_| bad("SUDO_UID", &uid))?;
        if uid == 0 {
            return Ok(None);
        }
        let pw = passwd_of_uid(uid).unwrap_or_else(|| Passwd {
            // A uid without a passwd entry: sudo's own fallback names.
            name: var("SUDO_USER").unwrap_or_else(|| format!("#{uid}")),
            uid,
            gid: uid,
            home: "/".into(),
            shell: "/bin/sh".into(),
        });
        let gid = match var("SUDO_GID") {
            Some(g) => g.trim().parse().map_err(|_| bad("SUDO_GID", &g))?,
            None => pw.gid,
        };
        Ok(Some(RunAs::of(pw, gid)))
    }

    fn of(pw: Passwd, gid: u32) -> RunAs {
        let mut groups = group_list(&pw.name, gid);
        if !groups.contains(&gid) {
            groups.insert(0, gid);
        }
        RunAs {
            name: pw.name,
            uid: pw.uid,
            gid,
            groups,
            home: pw.home,
            shell: pw.shell,
        }
    }

    /// `nobody (uid 65534, gid 65534)`.
    pub fn describe(&self) -> String {
        format!("{} (uid {}, gid {})", self.name, self.uid, self.gid)
    }

    /// The command's environment: see the module doc.
    pub fn environment(&self, var: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let mut env = vec![
            ("HOME".to_string(), self.home.clone()),
            ("SHELL".to_string(), self.shell.clone()),
            ("USER".to_string(), self.name.clone()),
            ("LOGNAME".to_string(), self.name.clone()),
            ("PATH".to_string(), SANE_PATH.to_string()),
        ];
        let mut kept: Vec<String> = KEPT.iter().map(|k| k.to_string()).collect();
        kept.extend(
            std::env::vars_os()
                .filter_map(|(k, _)| k.into_string().ok())
                .filter(|k| k.starts_with("LC_")),
        );
        for k in kept {
            if let Some(v) = var(&k) {
                env.push((k, v));
            }
        }
        env
    }

    /// Descriptors above stderr closed on exec, then setgroups, setgid,
    /// setuid: between fork and exec, so only async-signal-safe calls on
    /// memory prepared before the fork.
    pub fn drop_privileges(&self) -> std::io::Result<()> {
        close_on_exec_from(3)?;
        // SAFETY: the three calls take plain values and a pointer to
        // `groups`, which lives as long as self.
        unsafe {
            if libc::setgroups(self.groups.len(), self.groups.as_ptr()) != 0
                || libc::setgid(self.gid) != 0
                || libc::setuid(self.uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Marks every descriptor from `first` on close-on-exec (sudo's
/// `closefrom`): close_range(CLOSE_RANGE_CLOEXEC), Linux 5.11 on; before
/// that, fcntl on each descriptor below the open-files limit. Marked rather
/// than closed, so that the spawner's own exec-error pipe still works.
fn close_on_exec_from(first: u32) -> std::io::Result<()> {
    // SAFETY: close_range and fcntl take plain values; getrlimit fills a
    // local.
    unsafe {
        let flags = libc::CLOSE_RANGE_CLOEXEC as libc::c_uint;
        if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, flags) == 0 {
            return Ok(());
        }
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let end = lim.rlim_cur.min(1 << 20) as libc::c_int;
        for fd in first as libc::c_int..end {
            let f = libc::fcntl(fd, libc::F_GETFD);
            if f >= 0 && f & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, f | libc::FD_CLOEXEC);
            }
        }
    }
    Ok(())
}

fn passwd_of_name(name: &str) -> Option<Passwd> {
    let c = CString::new(name).ok()?;
    lookup(|pw, buf, out| {
        // SAFETY: getpwnam_r fills `pw` and `buf` (its length given) and
        // sets `out`.
        unsafe { libc::getpwnam_r(c.as_ptr(), pw, buf.as_mut_ptr(), buf.len(), out) }
    })
}

fn passwd_of_uid(uid: u32) -> Option<Passwd> {
    lookup(|pw, buf, out| {
        // SAFETY: as in passwd_of_name.
        unsafe { libc::getpwuid_r(uid, pw, buf.as_mut_ptr(), buf.len(), out) }
    })
}

fn lookup(
    mut get: impl FnMut(&mut libc::passwd, &mut [libc::c_char], &mut *mut libc::passwd) -> i32,
) -> Option<Passwd> {
    let mut buf: Vec<libc::c_char> = vec![0; 16384];
    // SAFETY: a zeroed passwd is a valid out-parameter.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out = std::ptr::null_mut();
    if get(&mut pw, &mut buf, &mut out) != 0 || out.is_null() {
        return None;
    }
    let text = |p: *const libc::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: getpw*_r's strings point into `buf`, NUL-terminated.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    Some(Passwd {
        name: text(pw.pw_name),
        uid: pw.pw_uid,
        gid: pw.pw_gid,
        home: text(pw.pw_dir),
        shell: text(pw.pw_shell),
    })
}

/// The groups `name` belongs to (getgrouplist), `gid` first.
fn group_list(name: &str, gid: u32) -> Vec<u32> {
    let Ok(c) = CString::new(name) else {
        return vec![gid];
    };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups: Vec<libc::gid_t> = vec![0; n as usize];
        let asked = n;
        // SAFETY: getgrouplist writes at most `n` gids and sets `n`.
        let rc = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n as usize);
            return groups;
        }
        if n <= asked {
            return vec![gid];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_nobody_from_passwd() {
        let root = RunAs::user("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert_eq!(RunAs::user("0").unwrap().name, "root");
        let e = RunAs::user("no-such-user-here").unwrap_err().to_string();
        assert!(e.contains("there is no user no-such-user-here"), "{e}");
    }

    #[test]
    fn the_sudo_invoker_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(RunAs::sudo_invoker(env(&[])).unwrap(), None);
        assert_eq!(
            RunAs::sudo_invoker(env(&[("SUDO_UID", "0"), ("SUDO_GID", "0")])).unwrap(),
            None
        );
        let u = RunAs::sudo_invoker(env(&[
            ("SUDO_UID", "65534"),
            ("SUDO_GID", "65534"),
            ("SUDO_USER", "nobody"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!((u.uid, u.gid), (65534, 65534));
        assert!(u.groups.contains(&65534), "{u:?}");
        let e = RunAs::sudo_invoker(env(&[("SUDO_UID", "x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SUDO_UID is \"x\""), "{e}");
        let envs = u.environment(env(&[("TERM", "xterm"), ("HOME", "/root")]));
        let get = |k: &str| envs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("USER"), Some(u.name.as_str()));
        assert_eq!(get("LOGNAME"), Some(u.name.as_str()));
        assert_eq!(
            get("HOME"),
            Some(u.home.as_str()),
            "the passwd home, not root's"
        );
        assert_eq!(get("PATH"), Some(SANE_PATH));
        assert_eq!(get("TERM"), Some("xterm"));
    }

    /// A descriptor without close-on-exec (9, on /dev/null) reaches an
    /// executed program unless the child marks everything above stderr.
    #[test]
    fn descriptors_above_stderr_do_not_reach_the_command() {
        use std::os::unix::io::AsRawFd;
        use std::os::unix::process::CommandExt;
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd = null.as_raw_fd();
        let open_in_ls = |mark: bool| {
            let mut cmd = std::process::Command::new("ls");
            cmd.arg("/proc/self/fd");
            // SAFETY: dup2 and close_on_exec_from only, between fork and
            // exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(fd, 9) != 9 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if mark {
                        close_on_exec_from(3)?;
                    }
                    Ok(())
                });
            }
            let out = cmd.output().unwrap();
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert!(open_in_ls(false).contains(&"9".to_string()));
        // stdin, the two output pipes, and ls's own directory.
        assert_eq!(open_in_ls(true), ["0", "1", "2", "3"]);
    }
}
