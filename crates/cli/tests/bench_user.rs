//! Who `hugelab bench`'s measured command runs as. Under sudo (SUDO_UID,
//! SUDO_GID and SUDO_USER of nobody, simulated: no sudo here) and with
//! `--user nobody` it has exactly the credentials a login of nobody gets:
//! `setpriv --dump` and the capability sets of /proc/self/status read the
//! same as under `setpriv --reuid --regid --init-groups` (what sudo does:
//! setresuid, setresgid, initgroups), the environment is the passwd entry's,
//! no descriptor of hugelab's reaches it, and a root-only file stays shut.
//! `--as-root` keeps root and says so. Skipped where not root.

mod common;

use common::{cannot_run, machine_state, read, state_dir};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
/// sudo's PATH (Debian's `secure_path`).
const SECURE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The root-only file's text.
const SECRET: &str = "root only\n";

/// The measured command, in a directory of its own: its credentials
/// (`creds`: setpriv's dump, then the capability sets and no_new_privs of
/// /proc/self/status, as setpriv prints neither the effective nor the
/// permitted set), its environment, the descriptors `ls` has open, and what
/// the shell says when it appends to the root-only `secret` and writes to
/// descriptor 9 (which hugelab was started with, open on `secret`).
const PROBE: &str = "setpriv --dump > creds; \
    grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status >> creds; \
    env > env; ls /proc/self/fd > fds; \
    { echo appended >> secret; } 2> append; { echo leaked >&9; } 2> leak; true";

/// What the probe left in its directory.
struct Probe {
    creds: String,
    env: BTreeMap<String, String>,
    fds: Vec<String>,
    append: String,
    leak: String,
    secret: String,
    /// Owner and group of `creds`.
    owner: (u32, u32),
}

impl Probe {
    fn read(dir: &Path) -> Probe {
        let text = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let meta = std::fs::metadata(dir.join("creds")).expect("the probe wrote creds");
        Probe {
            creds: text("creds"),
            env: pairs(&text("env"), '='),
            fds: text("fds").lines().map(str::to_string).collect(),
            append: text("append"),
            leak: text("leak"),
            secret: text("secret"),
            owner: (meta.uid(), meta.gid()),
        }
    }

    /// A `creds` line's value (`uid`, `CapEff`, ...).
    fn cred(&self, key: &str) -> &str {
        self.creds
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
            .unwrap_or_else(|| panic!("no {key} in {}", self.creds))
            .trim()
    }
}

fn pairs(text: &str, sep: char) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(sep))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// A user, from their passwd entry.
struct User {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
    shell: String,
}

impl User {
    /// `getent passwd KEY` (a name or a uid), if there is such a user.
    fn get(key: &str) -> Option<User> {
        let out = Command::new("getent").args(["passwd", key]).output().ok()?;
        let entry = String::from_utf8(out.stdout).ok()?;
        let f: Vec<&str> = entry.lines().next()?.split(':').collect();
        (f.len() == 7).then(|| User {
            name: f[0].to_string(),
            uid: f[2].parse().unwrap(),
            gid: f[3].parse().unwrap(),
            home: f[5].to_string(),
            shell: f[6].to_string(),
        })
    }

    /// The first user in the passwd database (root aside) who belongs to
    /// a group besides their own, if any.
    fn with_supplementary_groups() -> Option<User> {
        let out = Command::new("getent").arg("passwd").output().ok()?;
        String::from_utf8(out.stdout)
            .ok()?
            .lines()
            .filter_map(|l| User::get(l.split(':').next()?))
            .find(|u| u.uid != 0 && u.groups().len() > 1)
    }

    /// The user's groups as `id -G NAME` lists them (getgrouplist).
    fn groups(&self) -> BTreeSet<String> {
        let out = Command::new("id")
            .args(["-G", &self.name])
            .output()
            .unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// What sudo sets when this user runs it.
    fn sudo_vars(&self) -> [(&'static str, String); 3] {
        [
            ("SUDO_UID", self.uid.to_string()),
            ("SUDO_GID", self.gid.to_string()),
            ("SUDO_USER", self.name.clone()),
        ]
    }

    /// The environment sudo gives a command of this user's: the passwd
    /// entry's HOME, SHELL, USER and LOGNAME, secure_path, the kept TERM
    /// and LC_ALL.
    fn login_env(&self) -> BTreeMap<String, String> {
        [
            ("HOME", self.home.as_str()),
            ("SHELL", &self.shell),
            ("USER", &self.name),
            ("LOGNAME", &self.name),
            ("PATH", SECURE_PATH),
            ("TERM", "xterm-probe"),
            ("LC_ALL", "C"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// `nobody (uid 65534, gid 65534)`, as bench's header names the user.
    fn describe(&self) -> String {
        format!("{} (uid {}, gid {})", self.name, self.uid, self.gid)
    }
}

/// A directory for one probe, owned by `user`, holding a root-only (0600)
/// `secret`.
fn probe_dir(state: &Path, name: &str, user: &User) -> PathBuf {
    let dir = state.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(user.uid), Some(user.gid)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    dir
}

/// hugelab's environment in these runs: root's HOME and a variable of its
/// own that must not reach the command, a TERM and an LC_ALL that must.
fn hugelab_env(state: &Path) -> Vec<(String, String)> {
    [
        ("PATH", "/usr/bin:/bin"),
        ("HOME", "/root"),
        ("TERM", "xterm-probe"),
        ("LC_ALL", "C"),
        ("ROOT_ONLY_SECRET", "hugelab's own"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .chain([("HUGELAB_STATE_DIR".to_string(), state.display().to_string())])
    .collect()
}

/// `hugelab bench` of the probe in `dir` with `extra` options, under sudo
/// simulated for `sudo` if given, started with descriptor 9 open for
/// appending on the root-only `secret`; its table.
fn bench(dir: &Path, state: &Path, extra: &[&str], sudo: Option<&User>) -> String {
    let setting = format!("A:transparent_hugepage/enabled={}", read(ENABLED));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hugelab"));
    cmd.args([
        "bench",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--setting",
        &setting,
    ])
    .args(extra)
    .args(["--", "sh", "-c", PROBE])
    .current_dir(dir)
    .env_clear()
    .envs(hugelab_env(state));
    if let Some(user) = sudo {
        cmd.envs(user.sudo_vars());
    }
    let secret = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("secret"))
        .unwrap();
    let fd = secret.as_raw_fd();
    // SAFETY: dup2 only, between fork and exec; the new descriptor 9 has
    // no close-on-exec flag, so hugelab inherits it.
    unsafe {
        cmd.pre_exec(move || match libc::dup2(fd, 9) {
            9 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        });
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{extra:?}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The reference: the probe run directly the way sudo runs a command as
/// `user` (uid, gid, initgroups, no inheritable capabilities) with the
/// user's login environment.
fn reference(state: &Path, user: &User) -> Probe {
    let dir = probe_dir(state, &format!("reference-{}", user.name), user);
    let status = Command::new("setpriv")
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .arg("--init-groups")
        .args(["--inh-caps=-all", "--", "sh", "-c", PROBE])
        .current_dir(&dir)
        .env_clear()
        .envs(user.login_env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "the reference probe: {status}");
    let p = Probe::read(&dir);
    assert_eq!(p.cred("uid"), user.uid.to_string(), "{}", p.creds);
    p
}

/// Every check a probe run as `user` must pass against the `reference`;
/// `how` names the run.
fn assert_a_login_of(user: &User, p: &Probe, reference: &Probe, how: &str) {
    assert_eq!(
        p.creds, reference.creds,
        "{how}: the credentials setpriv gives"
    );
    for key in ["uid", "euid", "gid", "egid"] {
        let want = if key.ends_with("uid") {
            user.uid
        } else {
            user.gid
        };
        assert_eq!(p.cred(key), want.to_string(), "{how}: {key}");
    }
    let groups: BTreeSet<String> = p
        .cred("Supplementary groups")
        .split(',')
        .map(|g| g.trim().to_string())
        .collect();
    assert_eq!(groups, user.groups(), "{how}: initgroups' groups");
    for key in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(p.cred(key), "0000000000000000", "{how}: {key}");
    }
    let own = pairs(&std::fs::read_to_string("/proc/self/status").unwrap(), ':');
    assert_eq!(
        p.cred("CapBnd"),
        own["CapBnd"],
        "{how}: the bounding set as sudo leaves it"
    );
    assert_eq!(p.cred("no_new_privs"), "0", "{how}");
    assert_eq!(p.cred("NoNewPrivs"), "0", "{how}");
    assert_eq!(
        p.owner,
        (user.uid, user.gid),
        "{how}: the owner of what it writes"
    );
    let mut env = user.login_env();
    env.insert("PWD".into(), p.env["PWD"].clone()); // the shell's own
    assert_eq!(p.env, env, "{how}: the environment");
    assert_eq!(
        p.fds,
        ["0", "1", "2", "3"],
        "{how}: stdio and ls's directory only"
    );
    assert!(
        p.append.contains("Permission denied"),
        "{how}: EACCES: {}",
        p.append
    );
    assert!(
        p.leak.contains("Bad file descriptor"),
        "{how}: fd 9: {}",
        p.leak
    );
    assert_eq!(p.secret, SECRET, "{how}: the root-only file is untouched");
    eprintln!(
        "{how}: uid {} gid {} groups {} CapEff {} CapBnd {}; fds {}; {} keys of env; secret: {}",
        p.cred("uid"),
        p.cred("gid"),
        p.cred("Supplementary groups"),
        p.cred("CapEff"),
        p.cred("CapBnd"),
        p.fds.join(" "),
        p.env.len(),
        p.append.trim()
    );
}

#[test]
fn the_command_has_the_credentials_of_a_login_of_the_user() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: no setpriv (util-linux) here");
        return;
    }
    let state = state_dir("bench-setpriv");
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let found = machine_state(&state);
    let nobody = User::get("nobody").expect("a user nobody");
    let reference_of_nobody = reference(&state, &nobody);
    let header = format!("ran as user {}", nobody.describe());

    let dir = probe_dir(&state, "sudo", &nobody);
    let text = bench(&dir, &state, &[], Some(&nobody));
    assert!(text.contains(&header), "{text}");
    let p = Probe::read(&dir);
    assert_a_login_of(&nobody, &p, &reference_of_nobody, "under sudo");

    let dir = probe_dir(&state, "user", &nobody);
    bench(&dir, &state, &["--user", "nobody"], None);
    let p = Probe::read(&dir);
    assert_a_login_of(&nobody, &p, &reference_of_nobody, "--user nobody");

    // A user with a supplementary group: initgroups' list, not root's.
    match User::with_supplementary_groups() {
        Some(user) => {
            let reference = reference(&state, &user);
            let dir = probe_dir(&state, "sudo-groups", &user);
            bench(&dir, &state, &[], Some(&user));
            let how = format!("under sudo by {}", user.name);
            assert_a_login_of(&user, &Probe::read(&dir), &reference, &how);
        }
        None => eprintln!("no user with a supplementary group here: that case is not run"),
    }

    let dir = probe_dir(&state, "root", &nobody);
    let text = bench(&dir, &state, &["--as-root"], Some(&nobody));
    assert!(text.contains("ran as root (--as-root)"), "{text}");
    let root = Probe::read(&dir);
    for key in ["uid", "euid", "gid", "egid"] {
        assert_eq!(root.cred(key), "0", "--as-root: {key}");
    }
    assert_ne!(
        root.cred("CapEff"),
        "0000000000000000",
        "--as-root keeps root's capabilities"
    );
    assert_eq!(root.owner, (0, 0));

    assert!(!state.join("journal.json").exists());
    assert_eq!(machine_state(&state), found, "the machine is as it was");
}

/// A working directory the user cannot read: refused in one sentence
/// before anything changes.
#[test]
fn a_working_directory_the_user_cannot_read_is_refused() {
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let state = state_dir("bench-user-dir");
    let found = machine_state(&state);
    let dir = state.join("root-only");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let setting = format!("A:transparent_hugepage/enabled={}", read(ENABLED));
    let out = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args([
            "bench",
            "--runs",
            "1",
            "--user",
            "nobody",
            "--setting",
            &setting,
        ])
        .args(["--", "true"])
        .current_dir(&dir)
        .env("HUGELAB_STATE_DIR", &state)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("cannot read the working directory") && err.lines().count() == 1,
        "{err}"
    );
    assert!(!state.join("journal.json").exists());
    assert_eq!(machine_state(&state), found, "the machine is as it was");
}
