//! ACLs: what a user with only some permissions may run. A user allowed to
//! read keys only (`%R~`) may read a box or a lease set; on servers where
//! modules declare ACL categories and add their own (Redis 7.4+, Valkey
//! 8+) every command carries its categories, `-@write` users are refused
//! every writer, `+@read` users get the readers and `+@ratelimit` names the
//! module's commands; on Redis 7.0 the rules by command name that
//! `commands.md` gives do the same. Which of the two a server is comes from
//! its version (`INFO server`), not from what the module declared, so a
//! server that should carry the categories and does not fails.

mod common;

use common::*;

/// Every command of the module that writes, as a call a test can send.
const WRITERS: [&str; 11] = [
    "RL.TAKE rl:acl 5 5 60",
    "RL.WINDOW rl:acl:w 5 60",
    "RL.QUOTA rl:acl:q 5 DAY",
    "CL.THROTTLE rl:acl:c 5 5 60",
    "RL.BOX TRIP rl:acl 3 0",
    "RL.BOX RELEASE rl:acl",
    "RL.LEASE ACQUIRE rl:acl:l 2 60",
    "RL.LEASE RELEASE rl:acl:l x",
    "RL.LEASE RENEW rl:acl:l x 60",
    "RL.APPLY rl:acl p",
    "RL.REGION MERGE rl:acl:q DAY 0 us 1 0",
];

/// The readers.
const READERS: [&str; 3] = [
    "RL.BOX STATUS rl:acl",
    "RL.LEASE LIST rl:acl:l",
    "RL.REGION READ rl:acl:q",
];

/// A connection as `user` (password `pw`).
fn connect_as(server: &Server, user: &str) -> redis::Connection {
    let url = format!("redis://{user}:pw@{}/", server.addr());
    let client = redis::Client::open(url).expect("valid redis URL");
    client
        .get_connection_with_timeout(std::time::Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect as {user}: {e}"))
}

fn set_user(con: &mut redis::Connection, user: &str, rules: &str) {
    let line = format!("ACL SETUSER {user} on >pw {rules}");
    call(con, &line).unwrap_or_else(|e| panic!("{line}: {e}"));
}

fn is_noperm(result: &redis::RedisResult<redis::Value>) -> bool {
    matches!(result, Err(e) if err_text(e).starts_with("NOPERM"))
}

/// A version of the server as `(major, minor)`, from `INFO server`:
/// Valkey's own (`valkey_version`; Valkey also reports the Redis version it
/// is compatible with), else Redis's.
fn server_version(con: &mut redis::Connection) -> (String, (u32, u32)) {
    let info = value_str(&call(con, "INFO server").expect("INFO server"));
    let (name, version) = match info_field(&info, "valkey_version") {
        Some(version) => ("valkey", version),
        None => (
            "redis",
            info_field(&info, "redis_version").expect("redis_version in INFO server"),
        ),
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (name.to_string(), (major, minor))
}

/// Whether this server lets a module declare its commands' ACL categories
/// and add its own (Redis 7.4 and later, Valkey 8 and later), by version.
fn declares_categories(con: &mut redis::Connection) -> bool {
    match server_version(con) {
        (name, version) if name == "valkey" => version >= (8, 0),
        (_, version) => version >= (7, 4),
    }
}

/// Every command and subcommand of the module, with the categories each
/// declares besides `@ratelimit`.
const CATEGORIES: [(&str, &[&str]); 15] = [
    ("rl.take", &["write", "fast"]),
    ("rl.window", &["write"]),
    ("rl.quota", &["write", "fast"]),
    ("cl.throttle", &["write", "fast"]),
    ("rl.distinct", &["write"]),
    ("rl.apply", &["write", "dangerous"]),
    ("rl.box|status", &["read", "fast"]),
    ("rl.box|trip", &["write", "fast"]),
    ("rl.box|release", &["write", "fast"]),
    ("rl.lease|acquire", &["write"]),
    ("rl.lease|release", &["write"]),
    ("rl.lease|renew", &["write"]),
    ("rl.lease|list", &["read"]),
    ("rl.region|read", &["read", "fast"]),
    ("rl.region|merge", &["write", "fast"]),
];

#[test]
fn a_read_only_key_user_reads_boxes_and_leases_and_changes_nothing() {
    let server = Server::start(&[]);
    let mut admin = server.client();
    ints(&mut admin, "RL.BOX TRIP rl:acl 1 60");
    call(&mut admin, "RL.LEASE ACQUIRE rl:acl:l 2 60 ID job").expect("ACQUIRE");
    set_user(&mut admin, "reader", "%R~rl:* +@all");
    let mut reader = connect_as(&server, "reader");
    let status = ints(&mut reader, "RL.BOX STATUS rl:acl");
    assert_eq!(status[0], 1, "the box is readable: {status:?}");
    let leases = call(&mut reader, "RL.LEASE LIST rl:acl:l").expect("LIST");
    assert_eq!(array(leases).len(), 1);
    for line in WRITERS {
        assert!(
            is_noperm(&call(&mut reader, line)),
            "{line} allowed to a read-only key user"
        );
    }
    assert_eq!(
        ints(&mut admin, "RL.BOX STATUS rl:acl")[0],
        1,
        "the box is unchanged"
    );
}

#[test]
fn write_and_read_permissions_follow_the_categories_or_the_documented_rules() {
    let server = Server::start(&[]);
    let mut admin = server.client();
    call(&mut admin, "RL.LEASE ACQUIRE rl:acl:l 2 60 ID job").expect("ACQUIRE");
    if declares_categories(&mut admin) {
        set_user(&mut admin, "nowrite", "~* +@all -@write -@dangerous");
        set_user(&mut admin, "reader", "~* +@read");
        set_user(&mut admin, "limiter", "~* +@ratelimit -@dangerous");
    } else {
        // Redis 7.0: modules cannot declare categories; commands.md's rules
        // by name.
        set_user(
            &mut admin,
            "nowrite",
            "~* +@all -rl.take -rl.window -rl.quota -cl.throttle -rl.box|trip -rl.box|release \
             -rl.lease|acquire -rl.lease|release -rl.lease|renew -rl.region|merge -rl.apply",
        );
        set_user(
            &mut admin,
            "reader",
            "~* +@read +rl.box|status +rl.lease|list +rl.region|read",
        );
        set_user(
            &mut admin,
            "limiter",
            "~* +rl.take +rl.window +rl.quota +cl.throttle +rl.box +rl.lease",
        );
    }
    let mut nowrite = connect_as(&server, "nowrite");
    let mut reader = connect_as(&server, "reader");
    let mut limiter = connect_as(&server, "limiter");
    for line in WRITERS {
        assert!(
            is_noperm(&call(&mut nowrite, line)),
            "{line} allowed without write"
        );
        assert!(
            is_noperm(&call(&mut reader, line)),
            "{line} allowed to a reader"
        );
    }
    for line in READERS {
        assert!(
            !is_noperm(&call(&mut reader, line)),
            "{line} refused to a reader"
        );
        assert!(
            !is_noperm(&call(&mut nowrite, line)),
            "{line} refused without write"
        );
    }
    // The module's own commands, and not the internal RL.APPLY.
    assert_eq!(ints(&mut limiter, "RL.TAKE rl:acl 5 5 60")[0], 1);
    assert!(!is_noperm(&call(&mut limiter, "RL.BOX STATUS rl:acl")));
    assert!(is_noperm(&call(&mut limiter, "RL.APPLY rl:acl p")));
    assert!(
        is_noperm(&call(&mut limiter, "SET rl:acl:s 1")),
        "only rl commands"
    );
}

#[test]
fn key_specs_and_flags_say_who_reads_and_who_writes() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let info = format!(
        "{:?}",
        call(&mut con, "COMMAND INFO rl.box|status rl.lease|list").expect("COMMAND INFO")
    );
    assert!(info.contains("RO"), "read-only key specs: {info}");
    assert!(
        !info.contains("RW"),
        "no read-write key spec on a reader: {info}"
    );
    let take = format!(
        "{:?}",
        call(&mut con, "COMMAND INFO rl.take").expect("COMMAND INFO")
    );
    assert!(take.contains("fast") && take.contains("denyoom"), "{take}");
    let trip = format!(
        "{:?}",
        call(&mut con, "COMMAND INFO rl.box|trip").expect("COMMAND INFO")
    );
    assert!(trip.contains("denyoom"), "TRIP creates keys: {trip}");
    let acquire = format!(
        "{:?}",
        call(&mut con, "COMMAND INFO rl.lease|acquire rl.window").expect("COMMAND INFO")
    );
    assert!(
        !acquire.contains("fast"),
        "work grows with the set or log: {acquire}"
    );
}

/// The ACL categories `COMMAND INFO` gives for `command` (its seventh
/// field), e.g. `["@write", "@fast", "@ratelimit"]`.
fn command_categories(con: &mut redis::Connection, command: &str) -> Vec<String> {
    let line = format!("COMMAND INFO {command}");
    let reply = array(call(con, &line).unwrap_or_else(|e| panic!("{line}: {e}")));
    let info = array(reply.into_iter().next().expect("one command"));
    str_array(info.into_iter().nth(6).expect("the ACL categories field"))
}

#[test]
fn every_command_carries_its_categories_where_the_server_lets_modules_declare_them() {
    let server = Server::start(&[]);
    let mut con = server.client();
    let cats = str_array(call(&mut con, "ACL CAT").expect("ACL CAT"));
    if !declares_categories(&mut con) {
        // Redis 7.0: no category of the module's, and none on its commands.
        assert!(!cats.iter().any(|c| c == "ratelimit"), "{cats:?}");
        for (command, _) in CATEGORIES {
            let declared = command_categories(&mut con, command);
            assert!(declared.is_empty(), "{command}: {declared:?}");
        }
        return;
    }
    assert!(
        cats.iter().any(|c| c == "ratelimit"),
        "no @ratelimit in {cats:?}"
    );
    // `COMMAND INFO` (Redis leaves module commands out of `ACL CAT name`;
    // Valkey lists them): exactly the declared categories and `@ratelimit`.
    for (command, categories) in CATEGORIES {
        let mut declared = command_categories(&mut con, command);
        declared.sort();
        let mut expected: Vec<String> = categories
            .iter()
            .chain(&["ratelimit"])
            .map(|c| format!("@{c}"))
            .collect();
        expected.sort();
        assert_eq!(declared, expected, "the categories of {command}");
    }
}
