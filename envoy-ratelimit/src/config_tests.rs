use super::*;

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::load(&[("config.test".to_string(), text.to_string())])
}

const NESTED: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: remote_address
    rate_limit:
      unit: MINUTE
      requests_per_unit: 10
  - key: to_number
    value: "1*"
    descriptors:
      - key: from_number
        rate_limit:
          unit: hour
          requests_per_unit: 3
          name: per_pair
  - key: header_match
    value: "api*"
    detailed_metric: true
    rate_limit:
      unit: day
      requests_per_unit: 7
"#;

#[test]
fn lookup_follows_the_peer() {
    let c = load(NESTED).unwrap();
    let f = c.get_limit("mongo_cps", &[("database", "users")]).unwrap();
    assert_eq!(f.stat_key, "mongo_cps.database_users");
    assert_eq!(f.limit.rules[0].requests_per_unit, 500);
    // a key without value matches any value
    let f = c
        .get_limit("mongo_cps", &[("remote_address", "10.0.0.1")])
        .unwrap();
    assert_eq!(f.stat_key, "mongo_cps.remote_address");
    assert_eq!(f.limit.rules[0].unit, Unit::Minute);
    // deeper than the config: no limit
    assert!(c
        .get_limit("mongo_cps", &[("remote_address", "a"), ("x", "y")])
        .is_none());
    // unknown value, unknown domain
    assert!(c.get_limit("mongo_cps", &[("database", "other")]).is_none());
    assert!(c.get_limit("nope", &[("database", "users")]).is_none());
    // a wildcard value, nested
    let f = c
        .get_limit("mongo_cps", &[("to_number", "1555"), ("from_number", "2")])
        .unwrap();
    assert_eq!(f.stat_key, "mongo_cps.to_number_1*.from_number");
    assert_eq!(f.limit.name, "per_pair");
    assert!(c
        .get_limit("mongo_cps", &[("to_number", "2555"), ("from_number", "2")])
        .is_none());
    // detailed_metric appends the value
    let f = c
        .get_limit("mongo_cps", &[("header_match", "api-v2")])
        .unwrap();
    assert_eq!(f.stat_key, "mongo_cps.header_match_api*_api-v2");
}

#[test]
fn rl_fields() {
    let c = load(
        r#"
domain: d
descriptors:
  - key: k
    rate_limit:
      unit: minute
      requests_per_unit: 60
      algorithm: token_bucket
      burst: 10
      strikes: {threshold: 3, window: 60, box: [10, 20, 30]}
      also:
        - unit: hour
          requests_per_unit: 1000
          algorithm: sliding_window
"#,
    )
    .unwrap();
    let f = c.get_limit("d", &[("k", "v")]).unwrap();
    assert_eq!(f.limit.rules.len(), 2);
    assert_eq!(f.limit.rules[0].algorithm, Algorithm::TokenBucket);
    assert_eq!(f.limit.rules[0].burst, 10);
    assert_eq!(
        f.limit.rules[0].strikes.as_ref().unwrap().boxes,
        [10, 20, 30]
    );
    assert_eq!(f.limit.rules[1].algorithm, Algorithm::SlidingWindow);
    assert_eq!(f.limit.rules[1].burst, 1000);
}

fn error_of(text: &str) -> String {
    load(text).unwrap_err().0
}

#[test]
fn the_peers_errors() {
    assert_eq!(
        error_of("descriptors: []"),
        "config.test: config file cannot have empty domain"
    );
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - value: v\n"),
        "config.test: descriptor has empty key"
    );
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n  - key: k\n"),
        "config.test: duplicate descriptor composite key 'd.k'"
    );
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"),
        "config.test: invalid rate limit unit 'fortnight'"
    );
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unlimited: true}\n"),
        "config.test: should not specify rate limit unit when unlimited"
    );
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n"),
        "config.test: replaces should not contain name of same descriptor"
    );
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n"),
        "config.test: should not have an empty replaces entry"
    );
    assert_eq!(
        error_of("domain: d\nbogus: 1\n"),
        "config.test: config error, unknown key 'bogus'"
    );
    assert!(error_of("domain: [").starts_with("config.test: error loading config file: "));
    let dup = Config::load(&[
        ("config.a".into(), "domain: d\n".into()),
        ("config.b".into(), "domain: d\n".into()),
    ])
    .unwrap_err();
    assert_eq!(dup.0, "config.b: duplicate domain 'd' in config file");
}

#[test]
fn rl_field_errors() {
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n"),
        "config.test: burst requires algorithm token_bucket"
    );
    assert!(error_of(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}\n"
    )
    .starts_with("config.test: invalid algorithm 'leaky'"));
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, algorithm: token_bucket, burst: 101}\n"),
        "config.test: token_bucket refills from empty in at most 100 years (burst x unit / requests_per_unit)"
    );
    assert!(load("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, algorithm: token_bucket, burst: 100}\n").is_ok());
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: calendar}\n"),
        "config.test: algorithm calendar needs unit day, week or month"
    );
    assert_eq!(
        error_of("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0, algorithm: token_bucket}\n"),
        "config.test: token_bucket needs requests_per_unit of at least 1"
    );
}

#[test]
fn units() {
    for (name, proto, secs) in [
        ("second", 1, 1),
        ("minute", 2, 60),
        ("hour", 3, 3600),
        ("day", 4, 86_400),
        ("month", 5, 2_592_000),
        ("year", 6, 31_536_000),
        ("week", 7, 604_800),
    ] {
        let u = Unit::parse(name).unwrap();
        assert_eq!(u.proto(), proto);
        assert_eq!(Unit::from_proto(proto), Some(u));
        assert_eq!(u.seconds(), secs);
    }
    assert_eq!(Unit::parse("unknown"), None);
    assert_eq!(Unit::from_proto(0), None);
}
