//! Reliability, item 6 (continued): corrupt and truncated payloads on the
//! replication link. A diskless replica sync cut short at several points,
//! and `RL.APPLY` of mutated payloads streamed by a fake master to a real
//! replica.

mod common;

use std::io::Write;
use std::time::Duration;

use common::*;

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
        call_ok(
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
    let replica = master.replica(&["--repl-diskless-load", "on-empty-db"]);
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
    call_ok(&mut src, "SET mark:done 1");
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
    let replica = master.replica(&["--rdbcompression", "no"]);
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
            // A patch onto a missing key stores the parts it carries.
            let verbatim = p[0] == PATCH_MARKER || dump.windows(p.len()).any(|w| w == &p[..]);
            if !verbatim {
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
