//! Helpers for the reliability suite (`tests/reliability_*.rs`): figures,
//! process signals, dataset comparison, DUMP trailers and a raw reader of
//! the replication stream.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use redis::{Connection, Value};

use super::{info_field, value_str, Server};

// ---------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------

/// The file figures are appended to: env `RL_RELIABILITY_OUT`, else
/// `target/reliability-figures.txt` under the crate root.
pub fn figures_path() -> PathBuf {
    match std::env::var_os("RL_RELIABILITY_OUT") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability-figures.txt"),
    }
}

/// Measures a test's run time and records its figure.
pub struct Figure {
    started: Instant,
}

impl Figure {
    /// Starts the clock (call first thing in the test).
    pub fn start() -> Figure {
        Figure {
            started: Instant::now(),
        }
    }

    /// Seconds since [`Figure::start`].
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Appends `property | how | figure; N.N s` to [`figures_path`] (one
    /// line, one `write` in append mode, so parallel tests do not interleave)
    /// and prints it to stderr. `|` and newlines inside the texts are
    /// replaced, so the line always has three fields.
    pub fn record(&self, property: &str, how: &str, figure: &str) {
        let clean = |s: &str| s.replace('|', "/").replace(['\n', '\r'], " ");
        let line = format!(
            "{} | {} | {}; {:.1} s\n",
            clean(property),
            clean(how),
            clean(figure),
            self.elapsed_s()
        );
        let path = figures_path();
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        f.write_all(line.as_bytes())
            .unwrap_or_else(|e| panic!("append to {}: {e}", path.display()));
        eprint!("figure: {line}");
    }
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// `redis-server`'s own pid (from `INFO server`).
pub fn redis_pid(server: &Server) -> u32 {
    server
        .info_get("server", "process_id")
        .and_then(|p| p.parse().ok())
        .expect("INFO server process_id")
}

/// Sends `sig` (`"STOP"`, `"CONT"`, ...) to `pid` with `kill -SIG`.
pub fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Whether `server`'s log shows a crash report or an assertion (Redis
/// writes `=== REDIS BUG REPORT START`, Valkey `=== VALKEY BUG REPORT START`).
pub fn log_shows_crash(server: &Server) -> bool {
    let log = server.log();
    log.contains(" BUG REPORT START")
        || log.contains("crashed by signal")
        || log.contains("ASSERTION FAILED")
        || log.contains("Guru Meditation")
}

// ---------------------------------------------------------------------------
// Datasets
// ---------------------------------------------------------------------------

/// `DEBUG DIGEST` of the selected database set.
pub fn digest(con: &mut Connection) -> String {
    value_str(
        &redis::cmd("DEBUG")
            .arg("DIGEST")
            .query::<Value>(con)
            .expect("DEBUG DIGEST"),
    )
}

/// Every key matching `pattern` (`SCAN` with `COUNT 1000`, bounded).
pub fn scan_keys(con: &mut Connection, pattern: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut cursor: u64 = 0;
    for _ in 0..10_000_000 {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query(con)
            .expect("SCAN");
        out.extend(batch);
        cursor = next;
        if cursor == 0 {
            out.sort();
            out.dedup();
            return out;
        }
    }
    panic!("SCAN did not finish");
}

/// `PEXPIRETIME` of each of `keys` (pipelined by 1000).
pub fn expiretimes(con: &mut Connection, keys: &[Vec<u8>]) -> BTreeMap<Vec<u8>, i64> {
    let mut out = BTreeMap::new();
    for chunk in keys.chunks(1000) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("PEXPIRETIME").arg(&k[..]);
        }
        let ats: Vec<i64> = pipe.query(con).expect("PEXPIRETIME");
        out.extend(chunk.iter().cloned().zip(ats));
    }
    out
}

/// `DUMP` and `PEXPIRETIME` of one key (`None` for the dump of a missing key).
pub fn dump_and_expiry(
    con: &mut Connection,
    key: &str,
) -> redis::RedisResult<(Option<Vec<u8>>, i64)> {
    redis::pipe()
        .cmd("DUMP")
        .arg(key)
        .cmd("PEXPIRETIME")
        .arg(key)
        .query(con)
}

/// `INFO keyspace` of db 0 as `(keys, expires)`.
pub fn keyspace_counts(server: &Server) -> (u64, u64) {
    let Some(db0) = server.info_get("keyspace", "db0") else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        db0.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(0)
    };
    (field("keys"), field("expires"))
}

/// An integer field of `INFO <section>`.
pub fn info_u64(server: &Server, section: &str, field: &str) -> u64 {
    let info = server.info(section);
    info_field(&info, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no integer {field}"))
}

// ---------------------------------------------------------------------------
// DUMP payloads
// ---------------------------------------------------------------------------

/// Redis's CRC-64 (Jones polynomial, reflected), which ends every DUMP.
pub fn crc64(data: &[u8]) -> u64 {
    let mut crc = 0u64;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x95AC_9329_AC4B_C9B5
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// Splits a `DUMP` into (body: type byte and value, 2-byte RDB version).
pub fn split_dump(dump: &[u8]) -> (&[u8], &[u8]) {
    assert!(dump.len() >= 10, "a DUMP ends with 10 trailer bytes");
    let (body, trailer) = dump.split_at(dump.len() - 10);
    (body, &trailer[..2])
}

/// A `DUMP` payload of `body` with the RDB `version` and a valid CRC, so
/// Redis hands the value to the module.
pub fn with_trailer(body: &[u8], version: &[u8]) -> Vec<u8> {
    let mut out = body.to_vec();
    out.extend_from_slice(version);
    out.extend_from_slice(&crc64(&out).to_le_bytes());
    out
}

// ---------------------------------------------------------------------------
// RESP and the replication stream
// ---------------------------------------------------------------------------

/// One RESP2 value read off a raw socket.
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// Reads one `\r\n`-terminated line (without the terminator).
pub fn read_line<R: BufRead>(r: &mut R) -> std::io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    Ok(line)
}

fn parse_int(b: &[u8]) -> std::io::Result<i64> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("not an integer: {:?}", String::from_utf8_lossy(b))))
}

/// Reads one RESP2 value.
pub fn read_resp<R: BufRead>(r: &mut R) -> std::io::Result<Resp> {
    let line = read_line(r)?;
    let Some((&kind, rest)) = line.split_first() else {
        return Err(bad("empty RESP line".into()));
    };
    match kind {
        b'+' => Ok(Resp::Simple(rest.to_vec())),
        b'-' => Ok(Resp::Error(rest.to_vec())),
        b':' => Ok(Resp::Int(parse_int(rest)?)),
        b'$' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Resp::Bulk(None));
            }
            let mut buf = vec![0u8; n as usize + 2];
            r.read_exact(&mut buf)?;
            buf.truncate(n as usize);
            Ok(Resp::Bulk(Some(buf)))
        }
        b'*' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Resp::Array(None));
            }
            let items = (0..n).map(|_| read_resp(r)).collect::<Result<_, _>>()?;
            Ok(Resp::Array(Some(items)))
        }
        other => Err(bad(format!(
            "unexpected RESP type byte {other:#x} in {:?}",
            String::from_utf8_lossy(&line)
        ))),
    }
}

/// The path of the server's incremental AOF file and the commands it
/// holds, in order.
pub fn incremental_aof(server: &Server) -> (PathBuf, Vec<Vec<Vec<u8>>>) {
    let path = std::fs::read_dir(server.dir.join("appendonlydir"))
        .expect("appendonlydir")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incremental AOF file");
    let bytes = std::fs::read(&path).expect("read the AOF");
    let mut reader = std::io::BufReader::new(&bytes[..]);
    let mut cmds = Vec::new();
    loop {
        match read_resp(&mut reader) {
            Ok(Resp::Array(Some(items))) => cmds.push(
                items
                    .into_iter()
                    .map(|i| match i {
                        Resp::Bulk(Some(b)) => b,
                        other => panic!("AOF argument {other:?}"),
                    })
                    .collect(),
            ),
            Ok(other) => panic!("AOF holds {other:?}"),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("AOF parse: {e}"),
        }
    }
    (path, cmds)
}

/// A RESP command (array of bulk strings) of `args`.
pub fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads an RDB transfer as a master sends it after `SYNC`/`PSYNC`:
/// keep-alive newlines, an optional `+FULLRESYNC` line, then either
/// `$<len>\r\n<len bytes>` or `$EOF:<40-byte mark>\r\n...<mark>`.
pub fn read_rdb_transfer<R: BufRead>(r: &mut R) -> std::io::Result<Vec<u8>> {
    loop {
        let line = read_line(r)?;
        if line.is_empty() || line.starts_with(b"+") {
            continue;
        }
        if let Some(mark) = line.strip_prefix(b"$EOF:") {
            let mut data = Vec::new();
            loop {
                let mut byte = [0u8; 1];
                r.read_exact(&mut byte)?;
                data.push(byte[0]);
                if data.ends_with(mark) {
                    data.truncate(data.len() - mark.len());
                    return Ok(data);
                }
            }
        }
        let Some(len) = line.strip_prefix(b"$") else {
            return Err(bad(format!(
                "unexpected line before the RDB: {:?}",
                String::from_utf8_lossy(&line)
            )));
        };
        let mut data = vec![0u8; parse_int(len)? as usize];
        r.read_exact(&mut data)?;
        return Ok(data);
    }
}

/// A raw replication link: a socket that sent `SYNC` to a master, read the
/// RDB, and now reads the command stream the master propagates.
pub struct ReplicationTap {
    reader: BufReader<TcpStream>,
    /// The RDB the master sent first.
    pub rdb: Vec<u8>,
}

impl ReplicationTap {
    /// Connects to `server`, sends `SYNC` and reads the RDB (bounded).
    pub fn sync(server: &Server) -> ReplicationTap {
        let stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect for SYNC");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("read timeout");
        let mut writer = stream.try_clone().expect("clone socket");
        writer.write_all(b"SYNC\r\n").expect("send SYNC");
        let mut reader = BufReader::new(stream);
        let rdb = read_rdb_transfer(&mut reader).expect("read the RDB after SYNC");
        assert!(rdb.starts_with(b"REDIS"), "an RDB follows SYNC");
        ReplicationTap { reader, rdb }
    }

    /// The next propagated command as its arguments.
    pub fn next_command(&mut self) -> std::io::Result<Vec<Vec<u8>>> {
        match read_resp(&mut self.reader)? {
            Resp::Array(Some(items)) => items
                .into_iter()
                .map(|i| match i {
                    Resp::Bulk(Some(b)) => Ok(b),
                    other => Err(bad(format!("non-bulk argument {other:?}"))),
                })
                .collect(),
            other => Err(bad(format!("not a command: {other:?}"))),
        }
    }

    /// Commands up to and including the first `SET <marker> ...`; panics
    /// after 20 s or on a closed link.
    pub fn until_marker(&mut self, marker: &str) -> Vec<Vec<Vec<u8>>> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut out = Vec::new();
        while Instant::now() < deadline {
            let cmd = self.next_command().expect("read the replication stream");
            let done = cmd.len() >= 2
                && cmd[0].eq_ignore_ascii_case(b"SET")
                && cmd[1] == marker.as_bytes();
            out.push(cmd);
            if done {
                return out;
            }
        }
        panic!("marker {marker} not seen in the replication stream within 20 s");
    }
}

/// A command's arguments as a readable line (binary shown lossily, long
/// arguments cut).
pub fn show_command(cmd: &[Vec<u8>]) -> String {
    cmd.iter()
        .map(|a| {
            let s = String::from_utf8_lossy(a);
            if s.chars().count() > 40 {
                let head: String = s.chars().take(40).collect();
                format!("{head}...({} bytes)", a.len())
            } else {
                s.into_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A plain RESP connection on a raw socket: binary arguments, pipelines
/// whose error replies do not abort the batch (unlike `redis::pipe`).
pub struct RawConn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl RawConn {
    /// Connects to `server` with a 30 s read timeout.
    pub fn connect(server: &Server) -> RawConn {
        let stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        stream.set_nodelay(true).expect("nodelay");
        let writer = stream.try_clone().expect("clone socket");
        RawConn {
            reader: BufReader::with_capacity(1 << 16, stream),
            writer,
        }
    }

    /// Sends all `cmds`, then reads one reply per command.
    pub fn pipeline<A: AsRef<[u8]>>(&mut self, cmds: &[Vec<A>]) -> std::io::Result<Vec<Resp>> {
        let mut out = Vec::new();
        for c in cmds {
            let args: Vec<&[u8]> = c.iter().map(|a| a.as_ref()).collect();
            out.extend_from_slice(&resp_command(&args));
        }
        self.writer.write_all(&out)?;
        (0..cmds.len())
            .map(|_| read_resp(&mut self.reader))
            .collect()
    }

    /// One command.
    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> std::io::Result<Resp> {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_ref()).collect();
        self.writer.write_all(&resp_command(&args))?;
        read_resp(&mut self.reader)
    }
}
