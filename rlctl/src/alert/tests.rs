//! The unit tests of alert bodies, templates and dedup markers.

use super::*;

#[test]
fn the_offender_is_read_from_the_hash_tag() {
    assert_eq!(
        offender("ledger:{ip:203.0.113.50}:stuffing-ip"),
        Some(("ip", "203.0.113.50"))
    );
    assert_eq!(
        offender("ledger:{subject:dave}:stuffing-subject"),
        Some(("subject", "dave"))
    );
    assert_eq!(
        offender("rl:{auth:ip:198.51.100.7}"),
        Some(("ip", "198.51.100.7"))
    );
    assert_eq!(offender("rl:{auth:sub:eve}"), Some(("subject", "eve")));
    assert_eq!(offender("rl:{t:t-200}:key:k-2"), None);
    assert_eq!(offender("plain"), None);
}

#[test]
fn templates_know_their_placeholders() {
    assert!(check_template("key {key} level {level} {", &["key", "level"]).is_ok());
    let e = check_template("{nope}", &["key"]).unwrap_err();
    assert!(e.contains("{nope}"), "{e}");
    let v = BTreeMap::from([("key", "k".to_string())]);
    assert_eq!(render("a {key} b {key} {other} {", &v), "a k b k {other} {");
    let tricky = BTreeMap::from([("key", "{level}".to_string()), ("level", "2".to_string())]);
    assert_eq!(
        render("{key}/{level}", &tricky),
        "{level}/2",
        "values are not expanded again"
    );
}

#[test]
fn signature_is_hmac_sha256_of_time_dot_body() {
    // RFC 4231 style check through the same crates: recomputed here.
    let s = signature("secret", 1700000000, b"{}");
    let mut mac = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
    mac.update(b"1700000000.{}");
    assert_eq!(
        s,
        format!(
            "t=1700000000,v1={}",
            hex::encode(mac.finalize().into_bytes())
        )
    );
}

#[test]
fn a_box_alert_names_its_key_its_tenant_or_the_key_name() {
    let owner = |tenant: Option<&str>, key_id: Option<&str>| Owner {
        tenant_id: tenant.map(String::from),
        tenant: None,
        key_id: key_id.map(String::from),
        tier: "free".into(),
    };
    assert_eq!(
        box_subject("rl:{t:acme}:key:k-2", &owner(Some("acme"), Some("k-2"))),
        "API key k-2 of acme"
    );
    assert_eq!(
        box_subject("rl:{t:acme}:tenant", &owner(Some("acme"), None)),
        "Every API key of acme"
    );
    assert_eq!(
        box_subject("rl:{ip:192.0.2.1}:login", &owner(None, None)),
        "Key rl:{ip:192.0.2.1}:login"
    );
}

#[test]
fn time_left_rounds_up_and_names_manual_boxes() {
    assert_eq!(time_left(-1), "until released by hand");
    assert_eq!(time_left(1), "1s");
    assert_eq!(time_left(3_600_000), "1h");
}
