//! A fake master: serves RDBs (whole or cut short) and a command stream
//! to a real replica.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use super::{call_ok, poll_for, read_resp, wait_until, Flavor, Resp, Server};

/// A listening socket on 127.0.0.1 that a replica is pointed at
/// (`--replicaof 127.0.0.1 <port>`); the test then plays the master.
pub struct FakeMaster {
    listener: TcpListener,
}

impl FakeMaster {
    /// Binds a free port (non-blocking, so accepts can be bounded).
    pub fn new() -> FakeMaster {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake master");
        listener.set_nonblocking(true).expect("nonblocking");
        FakeMaster { listener }
    }

    /// A real replica (with the module) of this fake master, with `extra`
    /// config arguments; it connects at once and waits for
    /// [`FakeMaster::handshake`].
    pub fn replica(&self, extra: &[&str]) -> Server {
        let port = self.port().to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &port];
        args.extend_from_slice(extra);
        Server::launch(&[], Flavor::Module, &args)
    }

    /// The port to point the replica at.
    pub fn port(&self) -> u16 {
        self.listener.local_addr().expect("addr").port()
    }

    /// Accepts the replica's next connection (bounded, 20 s) and answers
    /// its handshake up to `PSYNC` with `+FULLRESYNC`.
    pub fn handshake(&self) -> TcpStream {
        let accepted = poll_for(
            Duration::from_secs(20),
            Duration::from_millis(20),
            || match self.listener.accept() {
                Ok((s, _)) => Some(s),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(e) => panic!("accept: {e}"),
            },
        );
        let stream = accepted.expect("the replica connects within 20 s");
        stream.set_nonblocking(false).expect("blocking");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut writer = stream.try_clone().expect("clone");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        loop {
            let cmd = match read_resp(&mut reader).expect("handshake command") {
                Resp::Array(Some(items)) => items,
                other => panic!("handshake: {other:?}"),
            };
            let name = match &cmd[0] {
                Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).to_ascii_uppercase(),
                other => panic!("handshake: {other:?}"),
            };
            match name.as_str() {
                "PING" => writer.write_all(b"+PONG\r\n").expect("write"),
                "PSYNC" | "SYNC" => {
                    writer
                        .write_all(format!("+FULLRESYNC {} 0\r\n", "f".repeat(40)).as_bytes())
                        .expect("write");
                    return stream;
                }
                _ => writer.write_all(b"+OK\r\n").expect("write"),
            }
        }
    }
}

/// The RDB transfer of `rdb`, diskless (`$EOF:` mark) or with a length,
/// cut after `cut` bytes of the RDB when given.
pub fn transfer(rdb: &[u8], diskless: bool, cut: Option<usize>) -> Vec<u8> {
    let mark = b"0123456789abcdefghij0123456789abcdefghij";
    let mut out = if diskless {
        let mut o = b"$EOF:".to_vec();
        o.extend_from_slice(mark);
        o.extend_from_slice(b"\r\n");
        o
    } else {
        format!("${}\r\n", rdb.len()).into_bytes()
    };
    match cut {
        Some(n) => out.extend_from_slice(&rdb[..n]),
        None => {
            out.extend_from_slice(rdb);
            if diskless {
                out.extend_from_slice(mark);
            }
        }
    }
    out
}

/// The RDB of `server`'s dataset, from `SAVE`.
pub fn rdb_of(server: &Server) -> Vec<u8> {
    call_ok(&mut server.client(), "SAVE");
    std::fs::read(server.dir.join("dump.rdb")).expect("read dump.rdb")
}

/// Serves the whole `rdb` and waits until the replica has loaded it.
pub fn serve_whole(master: &FakeMaster, replica: &Server, rdb: &[u8]) -> TcpStream {
    let mut link = master.handshake();
    link.write_all(&transfer(rdb, true, None))
        .expect("send RDB");
    wait_until(Duration::from_secs(20), "replica loaded the RDB", || {
        replica
            .info_get("replication", "master_link_status")
            .as_deref()
            == Some("up")
    });
    link
}
