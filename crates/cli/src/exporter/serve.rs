//! Where the exposition goes: served on `/metrics` (tiny_http, one thread
//! answering, the scan in its own), or written for node_exporter's textfile
//! collector (a temporary file in the same directory, renamed over
//! `hugelab.prom`: a reader sees the old file or the new one, never half of
//! one; the temporary name does not end in `.prom`, so the collector never
//! reads it). Read-only: no request changes anything.

use super::metrics::{self, ScanState, CONTENT_TYPE};
use super::scan_loop::Shared;
use super::Config;
use anyhow::{anyhow, bail, Result};
use hugelab_kernel::vmstat::SystemReader;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use tiny_http::{Header, Method, Request, Response};

/// The exposition now: the machine's counters read, the last pass.
fn exposition(reader: &mut SystemReader, shared: &Shared, budget: f64) -> Result<String> {
    reader.capture_unfolded()?;
    let read = reader.parse()?;
    let pass = shared.latest();
    let state = ScanState {
        passes: shared.passes(),
        running: shared.running(),
    };
    Ok(metrics::render(&read, pass.as_deref(), state, budget))
}

/// Serves until the process is ended. The address served is printed first
/// (with port 0, the port the kernel chose).
pub fn serve(shared: &Shared, config: &Config, listen: SocketAddr) -> Result<()> {
    let listener = TcpListener::bind(listen).map_err(|e| bind_error(listen, &e))?;
    let addr = listener.local_addr()?;
    let server = tiny_http::Server::from_listener(listener, None)
        .map_err(|e| anyhow!("cannot serve on {addr}: {e}"))?;
    let mut out = io::stdout().lock();
    // Nobody reading the line is no reason to stop serving.
    let _ = writeln!(out, "hugelab exporter: serving http://{addr}/metrics");
    let _ = out.flush();
    drop(out);
    let mut reader = SystemReader::new();
    for request in server.incoming_requests() {
        answer(request, &mut reader, shared, config.budget);
    }
    Ok(())
}

fn answer(request: Request, reader: &mut SystemReader, shared: &Shared, budget: f64) {
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let text = |s: &str| Response::from_string(s).with_header(header("text/plain; charset=utf-8"));
    let response = match (request.method(), path.as_str()) {
        (Method::Get | Method::Head, "/metrics") => match exposition(reader, shared, budget) {
            Ok(body) => Response::from_string(body).with_header(header(CONTENT_TYPE)),
            Err(e) => text(&format!("reading the machine's counters failed: {e:#}\n"))
                .with_status_code(500),
        },
        (Method::Get | Method::Head, "/") => {
            text("hugelab exporter: the metrics are at /metrics\n")
        }
        (Method::Get | Method::Head, _) => {
            text("not found: the metrics are at /metrics\n").with_status_code(404)
        }
        _ => text("the exporter is read-only: GET /metrics\n")
            .with_status_code(405)
            .with_header(Header::from_bytes("Allow", "GET, HEAD").expect("a valid header")),
    };
    // A client that went away is its own business.
    let _ = request.respond(response);
}

fn header(content_type: &str) -> Header {
    Header::from_bytes("Content-Type", content_type).expect("a valid header")
}

/// Why `addr` cannot be listened on, in one sentence.
fn bind_error(addr: SocketAddr, e: &io::Error) -> anyhow::Error {
    match e.kind() {
        io::ErrorKind::AddrInUse => anyhow!(
            "{addr} is in use by another program: stop it, or give --listen another port"
        ),
        io::ErrorKind::AddrNotAvailable => anyhow!(
            "{addr} is not an address of this machine: give --listen one of its addresses (127.0.0.1 for loopback)"
        ),
        io::ErrorKind::PermissionDenied => anyhow!(
            "listening on {addr} was refused ({e}): ports below 1024 need CAP_NET_BIND_SERVICE"
        ),
        _ => anyhow!("cannot listen on {addr}: {e}"),
    }
}

/// The temporary file of `path` (same directory, not `*.prom`).
fn temporary(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// `--textfile DIR` must be a directory this process can write in: tried
/// by writing and removing the temporary file.
pub fn check_textfile_dir(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        let why = if dir.exists() {
            "it is not a directory"
        } else {
            "there is no such directory"
        };
        bail!(
            "--textfile {}: {why}; give node_exporter's textfile directory",
            dir.display()
        );
    }
    let probe = temporary(&dir.join(super::TEXTFILE));
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| anyhow!("--textfile {}: cannot write there ({e})", dir.display()))
}

/// Writes `text` to `path` through its temporary file.
fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = temporary(path);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow!("writing {}: {e}", path.display())
    })
}

/// Writes the exposition to `path` at every interval and after every
/// complete pass; with `once`, after the first pass only, then returns.
pub fn write_textfiles(shared: &Shared, config: &Config, path: &Path, once: bool) -> Result<()> {
    let mut reader = SystemReader::new();
    let mut seen = 0;
    loop {
        let passes = shared.wait_past(seen, config.interval);
        if !once || passes > 0 {
            write_atomically(path, &exposition(&mut reader, shared, config.budget)?)?;
            if once {
                println!("hugelab exporter: wrote {}", path.display());
                return Ok(());
            }
        }
        seen = passes;
    }
}
