//! Reliability, item 6: corrupt and truncated payloads. `RESTORE` of
//! mutated `DUMP`s of every kind of value (CRC fixed, so Redis hands them
//! to the module), `RL.APPLY` of mutated payloads over a replication link,
//! and a diskless replica sync cut short at several points.

mod common;

use std::collections::HashSet;
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use redis::Connection;

fn q(con: &mut Connection, line: &str) {
    call(con, line).unwrap_or_else(|e| panic!("{line}: {e}"));
}

/// Keys holding every kind of value the module stores, each set up by
/// its calls; returns the key names.
fn make_every_kind(con: &mut Connection, p: &str) -> Vec<String> {
    let kinds: &[(&str, &[&str])] = &[
        ("bucket", &["RL.TAKE {k} 10 1 100 COST 4"]),
        (
            "bucket-huge",
            &["RL.TAKE {k} 1000000000000000 1000000000 3 COST 999999999999"],
        ),
        (
            "strikes",
            &[
                "RL.TAKE {k} 1 1 100",
                "RL.TAKE {k} 1 1 100 STRIKES 5 100",
                "RL.TAKE {k} 1 1 100 STRIKES 5 100",
            ],
        ),
        (
            "timed-box",
            &[
                "RL.TAKE {k} 1 1 100",
                "RL.TAKE {k} 1 1 100 STRIKES 1 100 BOX 50 60 70 OFFENSES 1000",
            ],
        ),
        ("manual-box", &["RL.BOX TRIP {k} 3 0"]),
        ("offenses", &["RL.BOX TRIP {k} 1 10", "RL.BOX RELEASE {k}"]),
        (
            "sliding",
            &["RL.WINDOW {k} 10 100 COST 3", "RL.WINDOW {k} 10 100"],
        ),
        (
            "exact",
            &[
                "RL.WINDOW {k} 10 100 EXACT",
                "SLEEP",
                "RL.WINDOW {k} 10 100 EXACT COST 2",
                "SLEEP",
                "RL.WINDOW {k} 10 100 EXACT COST 3",
            ],
        ),
        ("fixed", &["RL.WINDOW {k} 10 100 FIXED COST 7"]),
        (
            "leases",
            &[
                "RL.LEASE ACQUIRE {k} 5 100 ID a",
                "RL.LEASE ACQUIRE {k} 5 100",
                "RL.LEASE ACQUIRE {k} 5 200 ID some-longer-lease-id",
            ],
        ),
        (
            "everything",
            &[
                "RL.TAKE {k} 3 1 100 COST 3",
                "RL.TAKE {k} 3 1 100 STRIKES 3 100",
                "RL.WINDOW {k} 5 100 EXACT",
                "RL.LEASE ACQUIRE {k} 2 100 ID z",
                "RL.BOX TRIP {k} 2 100",
            ],
        ),
    ];
    let mut keys = Vec::new();
    for (name, calls) in kinds {
        let k = format!("{p}:{name}");
        for c in *calls {
            if *c == "SLEEP" {
                std::thread::sleep(Duration::from_millis(3));
            } else {
                q(con, &c.replace("{k}", &k));
            }
        }
        keys.push(k);
    }
    keys
}

/// A small deterministic generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// How a payload was made.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Mutation {
    Truncated,
    BitFlip,
    ByteSet,
    Random,
}

/// Mutated variants of each of `bases`: every strict prefix, every bit
/// flipped, interesting bytes at every position, then random multi-byte
/// edits (overwrites, insertions, deletions, appends) until `total`
/// distinct payloads differ from every base.
fn mutate(bases: &[Vec<u8>], total: usize, seed: u64) -> Vec<(Mutation, Vec<u8>)> {
    let originals: HashSet<&Vec<u8>> = bases.iter().collect();
    let mut seen: HashSet<Vec<u8>> = HashSet::new();
    let mut out = Vec::new();
    let mut push = |m: Mutation, v: Vec<u8>, out: &mut Vec<(Mutation, Vec<u8>)>| {
        if !originals.contains(&v) && seen.insert(v.clone()) {
            out.push((m, v));
        }
    };
    const SPECIAL: &[u8] = &[
        0x00, 0x01, 0x02, 0x03, 0x04, 0x7f, 0x80, 0x90, 0x9f, 0xa0, 0xc0, 0xc1, 0xc2, 0xc3, 0xcc,
        0xcd, 0xce, 0xcf, 0xd0, 0xd3, 0xdc, 0xdd, 0xff,
    ];
    for b in bases {
        for n in 0..b.len() {
            push(Mutation::Truncated, b[..n].to_vec(), &mut out);
        }
        for i in 0..b.len() {
            for bit in 0..8 {
                let mut v = b.clone();
                v[i] ^= 1 << bit;
                push(Mutation::BitFlip, v, &mut out);
            }
            for &s in SPECIAL {
                let mut v = b.clone();
                v[i] = s;
                push(Mutation::ByteSet, v, &mut out);
            }
        }
    }
    let mut rng = Rng(seed);
    let mut attempts = 0;
    while out.len() < total && attempts < total * 20 {
        attempts += 1;
        let mut v = bases[rng.below(bases.len())].clone();
        for _ in 0..1 + rng.below(4) {
            match rng.below(5) {
                0 if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v[i] = rng.next() as u8;
                }
                1 => {
                    let i = rng.below(v.len() + 1);
                    v.insert(i, rng.next() as u8);
                }
                2 if !v.is_empty() => {
                    let i = rng.below(v.len());
                    v.remove(i);
                }
                3 => {
                    for _ in 0..1 + rng.below(8) {
                        v.push(rng.next() as u8);
                    }
                }
                _ if v.len() > 2 => {
                    // Swap two bytes.
                    let (i, j) = (rng.below(v.len()), rng.below(v.len()));
                    v.swap(i, j);
                }
                _ => {}
            }
        }
        push(Mutation::Random, v, &mut out);
    }
    out
}

fn is_error(r: &Resp) -> bool {
    matches!(r, Resp::Error(_))
}

fn text(r: &Resp) -> String {
    format!("{r:?}")
}

/// Appends Redis's RDB length encoding of `n` (the minimal form).
fn rdb_len(n: usize, out: &mut Vec<u8>) {
    if n < 64 {
        out.push(n as u8);
    } else if n < 16384 {
        out.extend_from_slice(&[0x40 | (n >> 8) as u8, n as u8]);
    } else {
        out.push(0x80);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// A `DUMP` body of a module value: type 7, the 9-byte module id, one
/// string (opcode 5) holding `payload` uncompressed, module EOF (0).
fn frame(type_and_id: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut v = type_and_id.to_vec();
    v.push(0x05);
    rdb_len(payload.len(), &mut v);
    v.extend_from_slice(payload);
    v.push(0x00);
    v
}

/// The inverse of [`frame`]: (type and module id, payload).
fn unframe(body: &[u8]) -> Option<(&[u8], &[u8])> {
    if body.len() < 13 || body[0] != 7 || body[1] != 0x81 || body[10] != 0x05 {
        return None;
    }
    let (len, at) = match body[11] >> 6 {
        0 => (usize::from(body[11] & 0x3f), 12),
        1 => (
            (usize::from(body[11] & 0x3f) << 8) | usize::from(body[12]),
            13,
        ),
        2 if body[11] == 0x80 && body.len() >= 16 => (
            u32::from_be_bytes(body[12..16].try_into().ok()?) as usize,
            16,
        ),
        _ => return None,
    };
    if body.len() != at + len + 1 || body[at + len] != 0 {
        return None;
    }
    Some((&body[..10], &body[at..at + len]))
}

/// The commands run on every accepted value: none may fail.
const PROBES: &[&str] = &[
    "RL.BOX STATUS {k}",
    "RL.LEASE LIST {k}",
    "MEMORY USAGE {k}",
    "DEBUG DIGEST-VALUE {k}",
    "RL.TAKE {k} 10 1 100 COST 0",
    "RL.TAKE {k} 10 1 100 STRIKES 2 100",
    "RL.WINDOW {k} 10 100 EXACT",
    "RL.LEASE ACQUIRE {k} 5 100",
    "RL.QUOTA {k} 10 DAY",
    "CL.THROTTLE {k} 9 1 100",
    "RL.BOX RELEASE {k}",
];

/// RESTOREs `bodies` (with a valid trailer) as `{prefix}:{i}`; returns
/// the indexes accepted and the error count.
/// The payload version rl writes today.
const PAYLOAD_VERSION: u8 = 5;

/// The bytes a payload is stored as: the same, except that a payload of
/// version 4 (the layout of version 5 when no refusal's retry is recorded)
/// is stored again under version 5.
fn as_current(payload: &[u8]) -> Vec<u8> {
    let mut p = payload.to_vec();
    if p.first() == Some(&(PAYLOAD_VERSION - 1)) {
        p[0] = PAYLOAD_VERSION;
    }
    p
}

fn restore_all(
    raw: &mut RawConn,
    prefix: &str,
    bodies: &[Vec<u8>],
    version: &[u8],
) -> (Vec<usize>, usize) {
    let (mut accepted, mut errors) = (Vec::new(), 0);
    for (chunk_no, chunk) in bodies.chunks(1000).enumerate() {
        let cmds: Vec<Vec<Vec<u8>>> = chunk
            .iter()
            .enumerate()
            .map(|(j, body)| {
                vec![
                    b"RESTORE".to_vec(),
                    format!("{prefix}:{}", chunk_no * 1000 + j).into_bytes(),
                    b"0".to_vec(),
                    with_trailer(body, version),
                ]
            })
            .collect();
        for (j, r) in raw
            .pipeline(&cmds)
            .expect("RESTORE batch")
            .iter()
            .enumerate()
        {
            match r {
                Resp::Error(_) => errors += 1,
                _ => accepted.push(chunk_no * 1000 + j),
            }
        }
    }
    (accepted, errors)
}

/// Runs [`PROBES`] on `key`; returns the failures.
fn probe(raw: &mut RawConn, key: &str) -> Vec<String> {
    let cmds: Vec<Vec<String>> = PROBES
        .iter()
        .map(|l| {
            l.replace("{k}", key)
                .split(' ')
                .map(str::to_string)
                .collect()
        })
        .collect();
    cmds.iter()
        .zip(raw.pipeline(&cmds).expect("probes"))
        .filter(|(_, r)| is_error(r))
        .map(|(c, r)| format!("{}: {}", c.join(" "), text(&r)))
        .collect()
}

#[test]
fn restore_of_mutated_dumps_is_an_error_or_a_valid_canonical_value() {
    let fig = Figure::start();
    // Uncompressed DUMPs, so a DUMP shows the module's bytes verbatim.
    let server = Server::start(&["--rdbcompression", "no"]);
    let mut con = server.client();
    let keys = make_every_kind(&mut con, "src");
    let (mut type_and_id, mut version) = (Vec::new(), Vec::new());
    let mut payloads = Vec::new();
    let mut bodies = Vec::new();
    for k in &keys {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(k).query(&mut con).expect("DUMP");
        let (body, v) = split_dump(&dump);
        assert_eq!(with_trailer(body, v), dump, "trailer rebuilt exactly");
        let (head, payload) =
            unframe(body).unwrap_or_else(|| panic!("{k}: unexpected framing {body:?}"));
        assert_eq!(frame(head, payload), body, "framing rebuilt exactly");
        type_and_id = head.to_vec();
        version = v.to_vec();
        payloads.push(payload.to_vec());
        bodies.push(body.to_vec());
    }

    // The module's bytes mutated, framed correctly: Redis hands each one to
    // the module, which must refuse it or hold exactly those bytes.
    let mutated = mutate(&payloads, 20_000, 0x5eed_0006);
    assert!(mutated.len() >= 10_000, "{} payloads", mutated.len());
    let framed: Vec<Vec<u8>> = mutated
        .iter()
        .map(|(_, p)| frame(&type_and_id, p))
        .collect();
    let mut raw = RawConn::connect(&server);
    let (accepted, errors) = restore_all(&mut raw, "dst", &framed, &version);
    assert!(server.is_alive(), "the server survived the RESTOREs");
    let truncated_accepted = accepted
        .iter()
        .filter(|&&i| mutated[i].0 == Mutation::Truncated)
        .count();
    let mut not_canonical = Vec::new();
    let mut misbehaving = Vec::new();
    for &idx in &accepted {
        let key = format!("dst:{idx}");
        let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut con).expect("DUMP");
        let stored = frame(&type_and_id, &as_current(&mutated[idx].1));
        if dump != with_trailer(&stored, &version) {
            not_canonical.push(idx);
        }
        misbehaving.extend(probe(&mut raw, &key));
    }

    // The whole DUMP body mutated (Redis's framing included): Redis refuses
    // most itself; whatever is accepted must work.
    let envelope: Vec<Vec<u8>> = mutate(&bodies, 3_000, 0x5eed_e000)
        .into_iter()
        .map(|(_, b)| b)
        .take(3_000)
        .collect();
    let (env_accepted, env_errors) = restore_all(&mut raw, "env", &envelope, &version);
    for &idx in &env_accepted {
        misbehaving.extend(probe(&mut raw, &format!("env:{idx}")));
    }

    // Everything accepted survives an RDB save and load.
    let before = snapshot(&mut con);
    q(&mut con, "DEBUG RELOAD");
    assert_eq!(
        snapshot(&mut con),
        before,
        "DEBUG RELOAD of the accepted values"
    );
    assert!(server.is_alive() && !log_shows_crash(&server));

    let count = |m: Mutation| mutated.iter().filter(|p| p.0 == m).count();
    fig.record(
        "6. Corrupt and truncated RESTORE payloads",
        &format!(
            "DUMPs of {} kinds of value (bucket, huge bucket, strikes, timed/manual box, offenses, sliding/exact/fixed window, leases, all in one); the module bytes mutated ({} truncations, {} bit flips, {} byte sets, {} random edits), framed and CRC fixed, RESTOREd; accepted ones re-DUMPed and used by {} commands; plus {} mutations of the whole envelope; then DEBUG RELOAD",
            keys.len(),
            count(Mutation::Truncated),
            count(Mutation::BitFlip),
            count(Mutation::ByteSet),
            count(Mutation::Random),
            PROBES.len(),
            envelope.len()
        ),
        &format!(
            "{} module payloads: {errors} errors, {} accepted, every one canonical (non-canonical {}, truncations accepted {truncated_accepted}); envelope: {env_errors} errors, {} accepted; accepted values failing a command {}; crashes 0",
            mutated.len(),
            accepted.len(),
            not_canonical.len(),
            env_accepted.len(),
            misbehaving.len()
        ),
    );
    assert_eq!(truncated_accepted, 0, "a truncated payload was accepted");
    assert!(
        not_canonical.is_empty(),
        "{} accepted non-canonical payloads, e.g. {:?}",
        not_canonical.len(),
        not_canonical
            .iter()
            .take(3)
            .map(|&i| &mutated[i])
            .collect::<Vec<_>>()
    );
    assert!(
        misbehaving.is_empty(),
        "{} failures, e.g. {:#?}",
        misbehaving.len(),
        &misbehaving[..misbehaving.len().min(10)]
    );
    assert!(errors > mutated.len() / 2, "most mutations are errors");
}

// ---------------------------------------------------------------------------
// A fake master: serves RDBs (whole or cut short) and a command stream to a
// real replica.
// ---------------------------------------------------------------------------

struct FakeMaster {
    listener: TcpListener,
}

impl FakeMaster {
    fn new() -> FakeMaster {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind fake master");
        listener.set_nonblocking(true).expect("nonblocking");
        FakeMaster { listener }
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().expect("addr").port()
    }

    /// Accepts the replica's next connection (bounded, 20 s) and answers
    /// its handshake up to `PSYNC` with `+FULLRESYNC`.
    fn handshake(&self) -> TcpStream {
        let deadline = Instant::now() + Duration::from_secs(20);
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(Instant::now() < deadline, "the replica did not connect");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("accept: {e}"),
            }
        };
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
fn transfer(rdb: &[u8], diskless: bool, cut: Option<usize>) -> Vec<u8> {
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
fn rdb_of(server: &Server) -> Vec<u8> {
    q(&mut server.client(), "SAVE");
    std::fs::read(server.dir.join("dump.rdb")).expect("read dump.rdb")
}

/// Serves `rdb` cut after each of `cuts` bytes (diskless or with a
/// length), waiting for the replica to reconnect after each; returns how
/// many cuts the replica survived with `expect_digest`.
fn serve_cuts(
    master: &FakeMaster,
    replica: &Server,
    rdb: &[u8],
    cuts: &[(bool, usize)],
    expect_digest: &str,
) -> usize {
    let mut survived = 0;
    for &(diskless, cut) in cuts {
        let mut link = master.handshake();
        link.write_all(&transfer(rdb, diskless, Some(cut)))
            .expect("send a cut RDB");
        drop(link);
        // The next handshake proves the replica noticed and retried.
        let next = master.handshake();
        assert!(
            replica.is_alive(),
            "the replica died after a cut at {cut}/{} (diskless {diskless})",
            rdb.len()
        );
        assert_eq!(
            digest(&mut replica.client()),
            expect_digest,
            "the replica's dataset after a sync cut at {cut}/{} (diskless {diskless})",
            rdb.len()
        );
        survived += 1;
        drop(next);
    }
    survived
}

/// Serves the whole `rdb` and waits until the replica has loaded it.
fn serve_whole(master: &FakeMaster, replica: &Server, rdb: &[u8]) -> TcpStream {
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

#[test]
fn a_diskless_sync_cut_short_leaves_the_replica_alive_with_its_data() {
    let fig = Figure::start();
    // A dataset of every kind of value (RDB strings uncompressed, so cut
    // points can be placed inside chosen values).
    let source = Server::start(&["--rdbcompression", "no"]);
    let mut src = source.client();
    make_every_kind(&mut src, "b");
    mixed_workload(&mut src, 90);
    for i in 0..2000 {
        q(
            &mut src,
            &format!("RL.LEASE ACQUIRE more:{i} 3 600 ID lease-{i}"),
        );
    }
    let rdb = rdb_of(&source);
    let digest_full = digest(&mut src);
    let empty_digest = digest(&mut Server::start(&[]).client());

    // `on-empty-db`: an empty replica loads straight from the socket, so the
    // module's rdb_load reads the cut stream itself.
    let master = FakeMaster::new();
    let replica = Server::launch(
        &[],
        Flavor::Module,
        &[
            "--replicaof",
            "127.0.0.1",
            &master.port().to_string(),
            "--repl-diskless-load",
            "on-empty-db",
        ],
    );
    let n = rdb.len();
    // Cuts inside chosen module values: in the module id, in the string
    // length, inside the module's own bytes.
    let value_at = |key: &str| -> usize {
        rdb.windows(key.len())
            .position(|w| w == key.as_bytes())
            .unwrap_or_else(|| panic!("{key} in the RDB"))
            + key.len()
    };
    let (lease, all) = (value_at("more:1000"), value_at("b:everything"));
    let cuts: Vec<(bool, usize)> = vec![
        (true, lease + 4),
        (true, lease + 11),
        (true, lease + 20),
        (true, all + 30),
        (true, 9),
        (true, n / 7),
        (true, n / 3),
        (true, n / 2),
        (true, 4 * n / 5),
        (true, n - 9),
        (true, n - 1),
        (false, n / 3),
        (false, 2 * n / 3),
    ];
    let on_socket = serve_cuts(&master, &replica, &rdb, &cuts, &empty_digest);
    let loads_from_socket = replica.log().matches("Loading DB in memory").count();
    // Then the whole RDB loads.
    let link = serve_whole(&master, &replica, &rdb);
    assert_eq!(
        digest(&mut replica.client()),
        digest_full,
        "the whole RDB loaded after the cuts"
    );
    drop(link);

    // Now the replica holds data: Redis loads through a temp file (no
    // diskless load over a non-empty db); a cut keeps the dataset.
    let on_disk = serve_cuts(&master, &replica, &rdb, &cuts[4..8], &digest_full);
    let log = replica.log();
    assert!(replica.is_alive() && !log_shows_crash(&replica));
    assert!(
        !log.contains(
            "Skipping diskless-load because there are modules that don't handle read errors"
        ),
        "the module declares it handles read errors"
    );
    fig.record(
        "6. A diskless replica sync cut short",
        &format!(
            "a fake master serves a real replica (repl-diskless-load on-empty-db) an RDB of {n} bytes ({} keys of every kind) cut at {} points (4 inside chosen module values, 7 more spread out EOF-marked, 2 with a length), then the whole RDB, then 4 more cuts over the loaded dataset",
            int(&mut src, "DBSIZE"),
            cuts.len()
        ),
        &format!(
            "replica crashes 0; {on_socket} cuts loaded from the socket (empty dataset afterwards, {loads_from_socket} socket loads started), whole RDB then equal; {on_disk} cuts over a loaded dataset kept it intact"
        ),
    );
}

#[test]
fn rl_apply_of_mutated_payloads_on_the_replication_link_is_refused() {
    let fig = Figure::start();
    // Valid effect payloads of every kind, read off a real master's stream.
    let source = Server::start(&[]);
    let mut tap = ReplicationTap::sync(&source);
    let mut src = source.client();
    make_every_kind(&mut src, "p");
    q(&mut src, "SET mark:done 1");
    let mut payloads: Vec<Vec<u8>> = tap
        .until_marker("mark:done")
        .into_iter()
        .filter(|c| c[0].eq_ignore_ascii_case(b"RL.APPLY"))
        .map(|c| c[2].clone())
        .collect();
    payloads.sort();
    payloads.dedup();
    assert!(payloads.len() >= 11, "{} payloads", payloads.len());
    let mutated = mutate(&payloads, 6000, 0x5eed_a991);
    let empty_rdb = rdb_of(&Server::start(&[]));

    let master = FakeMaster::new();
    let replica = Server::launch(
        &[],
        Flavor::Module,
        &[
            "--replicaof",
            "127.0.0.1",
            &master.port().to_string(),
            "--rdbcompression",
            "no",
        ],
    );
    // Like a real master, stream commands only once the RDB is loaded.
    let mut link = serve_whole(&master, &replica, &empty_rdb);
    // The valid payloads (controls), then every mutation, then a marker.
    let mut stream = Vec::new();
    for (i, p) in payloads.iter().enumerate() {
        stream.extend(resp_command(&[
            b"RL.APPLY",
            format!("ok:{i}").as_bytes(),
            p,
        ]));
    }
    for (i, (_, p)) in mutated.iter().enumerate() {
        stream.extend(resp_command(&[
            b"RL.APPLY",
            format!("bad:{i}").as_bytes(),
            p,
        ]));
    }
    stream.extend(resp_command(&[b"SET", b"applied", b"1"]));
    link.write_all(&stream).expect("stream");
    let mut rep = replica.client();
    wait_until(Duration::from_secs(30), "the stream applied", || {
        int(&mut rep, "EXISTS applied") == 1
    });
    assert!(replica.is_alive() && !log_shows_crash(&replica));
    let controls = (0..payloads.len())
        .filter(|i| int(&mut rep, &format!("EXISTS ok:{i}")) == 1)
        .count();
    let mut accepted = 0;
    let mut not_verbatim = Vec::new();
    let mut truncated_accepted = 0;
    for (i, (m, p)) in mutated.iter().enumerate() {
        let key = format!("bad:{i}");
        if int(&mut rep, &format!("EXISTS {key}")) == 1 {
            accepted += 1;
            if *m == Mutation::Truncated {
                truncated_accepted += 1;
            }
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut rep).expect("DUMP");
            let p = as_current(p);
            if !dump.windows(p.len()).any(|w| w == &p[..]) {
                not_verbatim.push(i);
            }
        }
    }
    let refused = mutated.len() - accepted;
    fig.record(
        "6. Corrupt RL.APPLY on the replication link",
        &format!(
            "a fake master streams {} valid effect payloads and {} mutations of them (truncations, bit flips, byte sets, random edits) as RL.APPLY to a real replica",
            payloads.len(),
            mutated.len()
        ),
        &format!(
            "valid applied {controls}/{}; mutations refused {refused}, accepted {accepted} (all canonical: {}; truncations accepted {truncated_accepted}); replica crashes 0",
            payloads.len(),
            not_verbatim.is_empty()
        ),
    );
    assert_eq!(controls, payloads.len(), "every valid payload applied");
    assert_eq!(truncated_accepted, 0);
    assert!(
        not_verbatim.is_empty(),
        "stored other bytes than given: {not_verbatim:?}"
    );
    assert!(refused > 0, "no mutation was refused");
}
