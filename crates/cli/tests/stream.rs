//! `hugelab run` streams its files: plain, gzip and zstd; a large workload
//! runs quickly; bad compressed data is one sentence and exit 2.

mod common;
use common::{run as hugelab, stderr};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// A directory of this test's own, removed at the end.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("hugelab-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    fn file(&self, name: &str, bytes: &[u8]) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_str().unwrap().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn gzip(text: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(text).unwrap();
    e.finish().unwrap()
}

fn zstd(text: &[u8]) -> Vec<u8> {
    zstd::encode_all(text, 1).unwrap()
}

/// `n` writes to pages of a 1 GiB region, a reclaim of nothing, expectations.
fn big_workload(n: u64) -> String {
    let mut text = String::from("spawn a\na mmap r 1G\n");
    for i in 0..n {
        let off = i * 7919 % 4096;
        text.push_str(&format!("a write r+{}K:4K\n", off * 4));
    }
    text.push_str("expect vmstat.pgfault == 4096\nexpect smaps.a.r.Rss == 16384\n");
    text
}

fn json(o: &Output) -> serde_json::Value {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

#[test]
fn compressed_workloads_run_like_plain_ones() {
    let dir = Dir::new("stream-compressed");
    let text = "set transparent_hugepage/enabled always\nspawn a\na mmap buf 4M\na write buf\n\
                snapshot mid\nexpect vmstat.thp_fault_alloc == 2\na munmap buf\n"
        .as_bytes();
    let plain = dir.file("w.hlw", text);
    let gz = dir.file("w.hlw.gz", &gzip(text));
    let zst = dir.file("w.hlw.zst", &zstd(text));
    let strip = |mut v: serde_json::Value| {
        v["workload"] = serde_json::Value::Null;
        v
    };
    let want = strip(json(&hugelab(&["run", "--json", &plain])));
    for file in [&gz, &zst] {
        let got = json(&hugelab(&["run", "--json", file]));
        assert_eq!(got["workload"], file.as_str());
        assert_eq!(strip(got), want, "{file}");
    }
    // Errors in compressed files are at their line too.
    let bad = dir.file(
        "bad.hlw.gz",
        &gzip(b"spawn a\na mmap buf 4M\na write nope\n"),
    );
    let o = hugelab(&["run", &bad]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("{bad}:3:9: unknown region 'nope'")),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_compressed_data_is_one_sentence_and_exit_2() {
    let dir = Dir::new("stream-bad");
    let text = big_workload(20_000);
    let gz = gzip(text.as_bytes());
    let zst = zstd(text.as_bytes());
    let cases = [
        ("not-gzip.hlw.gz", b"spawn a\n".to_vec(), "cannot read"),
        ("not-zstd.hlw.zst", b"spawn a\n".to_vec(), "cannot read"),
        (
            "truncated.hlw.gz",
            gz[..gz.len() / 2].to_vec(),
            "cannot read after line",
        ),
        (
            "truncated.hlw.zst",
            zst[..zst.len() / 2].to_vec(),
            "cannot read",
        ),
        ("empty.hlw.zst", Vec::new(), "cannot read"),
    ];
    for (name, bytes, words) in cases {
        let file = dir.file(name, &bytes);
        let o = hugelab(&["run", &file]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(
            err.starts_with(&format!("hugelab: {file}: {words}")),
            "{name}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    // A directory is not a workload either.
    let o = hugelab(&["run", dir.0.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read"), "{}", stderr(&o));
}

#[test]
fn a_large_workload_streams_quickly() {
    // 200,000 statements (about 4 MB): seconds even in a debug build.
    let dir = Dir::new("stream-large");
    let text = big_workload(200_000);
    let zst = dir.file("large.hlw.zst", &zstd(text.as_bytes()));
    let t = Instant::now();
    let o = hugelab(&["run", &zst]);
    let took = t.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("2 passed, 0 failed"), "{out}");
    assert!(
        took < Duration::from_secs(20),
        "200,000 statements took {took:?}"
    );
    assert!(Path::new(&zst).exists());
}
