//! Reliability, item 6: corrupt and truncated payloads. `RESTORE` of
//! mutated `DUMP`s of every kind of value (CRC fixed, so Redis hands them
//! to the module). The replication link's share (`RL.APPLY` of mutated
//! payloads, a diskless sync cut short) is in `reliability_corrupt_link.rs`.

mod common;

use common::*;

/// An error reply other than the documented refusal of a quota counted
/// the other way (a plain call on a key holding regional components, a
/// regional call on a plain count or another period kind).
fn is_error(r: &Resp) -> bool {
    match r {
        Resp::Error(e) => {
            !(e.starts_with(b"ERR REGION: the key counts")
                || e.starts_with(b"ERR period: the key counts"))
        }
        _ => false,
    }
}

fn text(r: &Resp) -> String {
    format!("{r:?}")
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
    "RL.QUOTA {k} 10 MONTH REGION",
    "RL.REGION READ {k}",
    "CL.THROTTLE {k} 9 1 100",
    "RL.BOX RELEASE {k}",
];

/// RESTOREs `bodies` (with a valid trailer) as `{prefix}:{i}`; returns
/// the indexes accepted and the error count.
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

    // Everything accepted survives an RDB save and load (but what ends on
    // its own within the minute the comparison allows).
    let cutoff = server_time_us(&mut con) / 1000 + 60_000;
    let before = snapshot_lasting_past(&mut con, cutoff);
    assert!(
        before.len() + 10 >= snapshot(&mut con).len(),
        "nearly every key outlasts the cutoff"
    );
    call_ok(&mut con, "DEBUG RELOAD");
    assert_eq!(
        snapshot_lasting_past(&mut con, cutoff),
        before,
        "DEBUG RELOAD of the accepted values"
    );
    assert!(server.is_alive() && !log_shows_crash(&server));

    let count = |m: Mutation| mutated.iter().filter(|p| p.0 == m).count();
    fig.record(
        "6. Corrupt and truncated RESTORE payloads",
        &format!(
            "DUMPs of {} kinds of value (bucket, huge bucket, strikes, timed/manual box, offenses, sliding/exact/fixed window, leases, regional quota, all in one); the module bytes mutated ({} truncations, {} bit flips, {} byte sets, {} random edits), framed and CRC fixed, RESTOREd; accepted ones re-DUMPed and used by {} commands; plus {} mutations of the whole envelope; then DEBUG RELOAD",
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
