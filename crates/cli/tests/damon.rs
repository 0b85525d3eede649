//! DAMON on this machine: a kernel run turns every running kdamond off for
//! its duration and on again after (after a SIGKILL, `hugelab settings
//! restore` does), and the commands' `--dry-run` say so.
//! Where no kdamond exists, each test makes one like the paddr `pageout`
//! scheme of the VMs hugelab was built on, which can never act (see
//! [`MadeKdamond`]), and removes it after. Skipped, with the reason
//! printed, when not root or DAMON's sysfs interface is missing.

mod common;

use common::{cannot_run, hugelab, run, state_dir};
use hugelab_kernel::{damon, damon_view};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The kdamonds running now, or why this test cannot use them.
fn running() -> Result<Vec<PathBuf>, String> {
    if let Some(why) = cannot_run() {
        return Err(format!("the kernel backend cannot run here: {why}"));
    }
    let on: Vec<PathBuf> = damon::running(Path::new(damon::ADMIN))
        .map_err(|e| e.to_string())?
        .iter()
        .map(|k| k.state_file())
        .collect();
    if on.is_empty() {
        return Err("no kdamond is running on this machine".into());
    }
    Ok(on)
}

/// [`running`], or None with the reason the test is skipped printed.
fn kdamonds() -> Option<Vec<PathBuf>> {
    running().map_err(|why| eprintln!("skipped: {why}")).ok()
}

fn states(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .map(|f| damon::read_state(f).unwrap())
        .collect()
}

/// The tests' runs must not overlap: one would see the other's kdamonds off.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A kdamond made for a test where the machine has none: kdamond 0, a
/// `paddr` context and one `pageout` scheme, on, whose regions must be
/// unchanged for u32::MAX aggregation intervals and whose quota is 4 KiB a
/// second, so it never pages anything out. Turned off and removed on drop
/// (a failed assertion too).
struct MadeKdamond;

impl MadeKdamond {
    /// None where kdamonds exist already, or DAMON cannot be written here.
    fn make() -> Option<MadeKdamond> {
        let admin = Path::new(damon::ADMIN).join("kdamonds");
        let nr = std::fs::read_to_string(admin.join("nr_kdamonds")).ok()?;
        if cannot_run().is_some() || nr.trim() != "0" {
            return None;
        }
        let made = MadeKdamond;
        let ctx = admin.join("0/contexts");
        let scheme = ctx.join("0/schemes/0");
        let writes = [
            (admin.join("nr_kdamonds"), "1"),
            (ctx.join("nr_contexts"), "1"),
            (ctx.join("0/operations"), "paddr"),
            (ctx.join("0/targets/nr_targets"), "1"),
            (ctx.join("0/schemes/nr_schemes"), "1"),
            (scheme.join("action"), "pageout"),
            (scheme.join("access_pattern/age/min"), "4294967295"),
            (scheme.join("access_pattern/age/max"), "4294967295"),
            (scheme.join("quotas/bytes"), "4096"),
            (scheme.join("quotas/reset_interval_ms"), "1000"),
            (admin.join("0/state"), "on"),
        ];
        for (file, value) in writes {
            if let Err(e) = std::fs::write(&file, value) {
                eprintln!("no kdamond made: {}: {e}", file.display());
                return None;
            }
        }
        Some(made)
    }
}

impl Drop for MadeKdamond {
    fn drop(&mut self) {
        let admin = Path::new(damon::ADMIN).join("kdamonds");
        // Off may be refused (EPERM) when it is off already.
        let _ = damon::write_state(&admin.join("0/state"), "off");
        std::fs::write(admin.join("nr_kdamonds"), "0").expect("removing the test's kdamond");
    }
}

/// Whatever a failed assertion left: a journal in the state directory is
/// replayed, so no test leaves a kdamond off.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.0.join("journal.json").exists() {
            let out = hugelab(&["settings", "restore"], &self.0);
            eprintln!("cleanup: {}", String::from_utf8_lossy(&out.stdout));
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Waits (for as long as other runs hold the settings lock) until `child`
/// has journaled its changes in `state` and every kdamond in `files` reads
/// off; false if it ended first.
fn wait_off(child: &mut Child, state: &Path, files: &[PathBuf]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(600);
    let off = vec!["off".to_string(); files.len()];
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        if state.join("journal.json").exists() && states(files) == off {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

#[test]
fn a_run_killed_with_sigkill_leaves_damon_off_until_settings_restore() {
    let _serial = serial();
    let _made = MadeKdamond::make();
    let Some(files) = kdamonds() else {
        return;
    };
    let state = state_dir("damon-kill");
    let _cleanup = Cleanup(state.to_path_buf());
    let wl = state.join("slow.hlw");
    std::fs::write(&wl, "spawn a\na mmap buf 2M\na write buf\nsleep 60s\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["run", "--backend", "kernel", wl.to_str().unwrap()])
        .env("HUGELAB_STATE_DIR", &state)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seen_off = wait_off(&mut child, &state, &files);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(seen_off, "DAMON was never off during the run");
    let off = vec!["off".to_string(); files.len()];
    assert_eq!(states(&files), off, "nothing restores after a SIGKILL");
    // The next run refuses over the journal until it is replayed.
    let out = hugelab(
        &["run", "--backend", "kernel", wl.to_str().unwrap()],
        &state,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("run `hugelab settings restore` first"),
        "{stderr}"
    );
    let out = hugelab(&["settings", "restore"], &state);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "settings restore: {out:?}");
    for f in &files {
        let line = format!("{} on (was off)", damon::tunable_name(f));
        assert!(stdout.contains(&line), "{line} not in:\n{stdout}");
    }
    let on = vec!["on".to_string(); files.len()];
    assert_eq!(states(&files), on);
}

#[test]
fn a_kernel_diff_turns_damon_off_for_the_run_and_on_after() {
    let _serial = serial();
    let _made = MadeKdamond::make();
    let Some(files) = kdamonds() else {
        return;
    };
    let state = state_dir("damon");
    let _cleanup = Cleanup(state.to_path_buf());
    let wl = state.join("damon.hlw");
    // The sleep keeps the run going long enough to see DAMON off in it.
    std::fs::write(
        &wl,
        "spawn a\na mmap buf 2M\na write buf\nsleep 1s\na read buf\nsnapshot s1\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hugelab"))
        .args(["diff", wl.to_str().unwrap()])
        .env("HUGELAB_STATE_DIR", &state)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let seen_off = wait_off(&mut child, &state, &files);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "diff: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(seen_off, "DAMON was never off during the run");
    let on = vec!["on".to_string(); files.len()];
    assert_eq!(states(&files), on, "DAMON is on again after the run");
    assert!(!state.join("journal.json").exists());
    // A paused kdamond cannot act on the run: no line on stderr about it
    // (an error's one sentence stays one).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("DAMON kdamond"), "{stderr}");
}

/// `settings show` lists every kdamond, on or off (a run may have paused
/// it), with each scheme's action and whether it acts on huge pages; on this
/// VM kdamond 0's paddr `pageout` scheme.
#[test]
fn settings_show_names_the_damon_schemes() {
    let _serial = serial();
    let _made = MadeKdamond::make();
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let views = damon_view::kdamonds(Path::new(damon::ADMIN));
    let out = run(&["settings", "show"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    if views.is_empty() {
        assert!(text.contains("\nDAMON: "), "{text}");
        eprintln!("skipped: no kdamond on this machine");
        return;
    }
    for k in &views {
        for c in &k.contexts {
            for s in &c.schemes {
                let huge = if s.acts_on_huge_pages { "yes" } else { "no" };
                let row = format!("| {:<7} |", k.index);
                let line = text
                    .lines()
                    .find(|l| {
                        l.starts_with(&row)
                            && l.contains(&format!("| {} ", c.operations))
                            && l.contains(&format!("| {} ", s.action))
                    })
                    .unwrap_or_else(|| {
                        panic!("no row for kdamond {} {}:\n{text}", k.index, s.action)
                    });
                assert!(line.contains(&format!("| {huge} ")), "{line}");
                assert!(line.contains(&s.pattern(c)), "{line}");
            }
        }
    }
    let json: serde_json::Value =
        serde_json::from_slice(&run(&["settings", "show", "--json"]).stdout).unwrap();
    let actions: Vec<&str> = json["activity"]["damon"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|k| k["contexts"].as_array().unwrap())
        .flat_map(|c| c["schemes"].as_array().unwrap())
        .map(|s| s["action"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = views
        .iter()
        .flat_map(|k| &k.contexts)
        .flat_map(|c| &c.schemes)
        .map(|s| s.action.as_str())
        .collect();
    assert_eq!(actions, expected);
    // This VM: kdamond 0 runs a paddr pageout scheme.
    if views[0]
        .contexts
        .first()
        .is_some_and(|c| c.operations == "paddr")
    {
        assert!(
            text.lines()
                .any(|l| l.starts_with("| 0 ") && l.contains("| pageout ")),
            "{text}"
        );
    }
}

#[test]
fn dry_runs_list_the_kdamonds() {
    let _serial = serial();
    let _made = MadeKdamond::make();
    let Some(files) = kdamonds() else {
        return;
    };
    let setting = "a:transparent_hugepage/enabled=never";
    let bench = |json: &'static str| {
        let args = [
            "bench",
            json,
            "--setting",
            setting,
            "--dry-run",
            "--",
            "true",
        ];
        args.into_iter()
            .filter(|a| !a.is_empty())
            .collect::<Vec<_>>()
    };
    let measure = |json: &'static str| {
        let args = ["hugetlb", "measure", json, "--dry-run"];
        args.into_iter()
            .filter(|a| !a.is_empty())
            .collect::<Vec<_>>()
    };
    let names: Vec<String> = files.iter().map(|f| damon::tunable_name(f)).collect();
    for command in [
        &bench as &dyn Fn(&'static str) -> Vec<&'static str>,
        &measure,
    ] {
        let args = command("");
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        for name in &names {
            let line = format!("{name} = off (now on): kdamond ");
            assert!(text.contains(&line), "{args:?} lacks {line}:\n{text}");
        }
        let args = command("--json");
        let out = run(&args);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let listed: Vec<&str> = v["damon"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["tunable"].as_str().unwrap())
            .collect();
        assert_eq!(listed, names, "{args:?}");
    }
    // A dry run changes nothing.
    let on = vec!["on".to_string(); files.len()];
    assert_eq!(states(&files), on);
}
