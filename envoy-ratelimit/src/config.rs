//! envoyproxy/ratelimit's YAML configuration, read unchanged, plus rl's
//! optional fields (`algorithm`, `burst`, `also`, `strikes`), with the
//! peer's validation errors (`<name>: <error>`, `name` = `config.<file stem>`)
//! and its lookup of a request descriptor (nested keys, `key_value` before
//! `key`, wildcard values ending in `*`).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde_yaml::Value;

/// A time unit of the peer's API and YAML, with its length in seconds as the
/// peer counts it (a month is 30 days, a year 365).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// The unit named `s` (any case), as the peer accepts it.
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    /// The unit of the API's enum value (`envoy.type.v3.RateLimitUnit` and
    /// `RateLimitResponse.RateLimit.Unit` share the numbers).
    pub fn from_proto(v: i32) -> Option<Unit> {
        Some(match v {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }

    /// The API's enum value.
    pub fn proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// Length in seconds (the peer's divider).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }
}

/// How a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The peer's fixed window, aligned to the unit since the Unix epoch
    /// (the default).
    Fixed,
    /// rl's sliding window counter (`RL.WINDOW`).
    SlidingWindow,
    /// rl's exact sliding log (`RL.WINDOW ... EXACT`, at most 10000 a window).
    Exact,
    /// rl's token bucket (`RL.TAKE`): `requests_per_unit` per unit, up to
    /// `burst` at once.
    TokenBucket,
    /// rl's calendar quota (`RL.QUOTA`): per UTC day, ISO week or calendar month.
    Calendar,
}

/// The penalty box in front of a limit (`RL.TAKE`/`RL.WINDOW` `STRIKES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strikes {
    /// Early retries that trip the box.
    pub threshold: u64,
    /// Seconds in which they count.
    pub window: u64,
    /// Box durations in seconds for levels 1, 2, 3.
    pub boxes: [u64; 3],
}

/// One counted limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Requests (points) per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
    /// How it counts.
    pub algorithm: Algorithm,
    /// A token bucket's capacity (`requests_per_unit` unless given).
    pub burst: u64,
    /// The penalty box, if any.
    pub strikes: Option<Strikes>,
}

/// A descriptor's limit: the peer's fields and rl's rules (the first is
/// `rate_limit` itself, then each of `also`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// `domain.key_value.key...`: the stat and storage key.
    pub full_key: String,
    /// `name` (empty when not given).
    pub name: String,
    /// Names of the limits this one replaces.
    pub replaces: Vec<String>,
    /// No counting at all.
    pub unlimited: bool,
    /// Counted and reported, never refusing.
    pub shadow_mode: bool,
    /// Stats per value (`detailed_metric`).
    pub detailed_metric: bool,
    /// What is counted (empty when unlimited).
    pub rules: Vec<Rule>,
}

/// A configuration error: `<config name>: <error>`, as the peer words it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err(name: &str, text: impl fmt::Display) -> ConfigError {
    ConfigError(format!("{name}: {text}"))
}

/// rl's longest refill from empty, in seconds (100 years).
const MAX_REFILL_S: u128 = 3_153_600_000;

/// The peer's keys, then rl's.
const VALID_KEYS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "name",
    "replaces",
    "detailed_metric",
    "algorithm",
    "burst",
    "also",
    "strikes",
    "threshold",
    "window",
    "box",
];

#[derive(Deserialize, Default)]
struct YamlReplaces {
    #[serde(default)]
    name: String,
}

#[derive(Deserialize, Default)]
struct YamlStrikes {
    threshold: u64,
    window: u64,
    #[serde(rename = "box", default)]
    boxes: Option<Vec<u64>>,
}

#[derive(Deserialize, Default)]
struct YamlRule {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default)]
    unit: String,
    #[serde(default)]
    algorithm: Option<String>,
    #[serde(default)]
    burst: Option<u64>,
    #[serde(default)]
    strikes: Option<YamlStrikes>,
}

#[derive(Deserialize, Default)]
struct YamlRateLimit {
    #[serde(flatten)]
    rule: YamlRule,
    #[serde(default)]
    unlimited: bool,
    #[serde(default)]
    name: String,
    #[serde(default)]
    replaces: Vec<YamlReplaces>,
    #[serde(default)]
    also: Vec<YamlRule>,
}

#[derive(Deserialize, Default)]
struct YamlDescriptor {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    descriptors: Vec<YamlDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
}

#[derive(Deserialize, Default)]
struct YamlRoot {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<YamlDescriptor>,
}

/// One level of a domain's tree.
#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    /// Keys of `children` ending in `*`, in file order.
    wildcard_keys: Vec<String>,
    limit: Option<Arc<Limit>>,
}

/// Every domain of a directory's files.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Node>,
}

/// The limit a request descriptor gets, with its stat key (the limit's
/// `full_key`, or with the value appended under `detailed_metric`).
#[derive(Clone, Debug)]
pub struct Found {
    /// The limit.
    pub limit: Arc<Limit>,
    /// `domain.key_value...` for the stats.
    pub stat_key: String,
}

impl Config {
    /// Loads files given as `(config name, YAML text)`, in order.
    pub fn load(files: &[(String, String)]) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        for (name, text) in files {
            let root = parse_file(name, text)?;
            if root.domain.is_empty() {
                return Err(err(name, "config file cannot have empty domain"));
            }
            if config.domains.contains_key(&root.domain) {
                return Err(err(
                    name,
                    format!("duplicate domain '{}' in config file", root.domain),
                ));
            }
            let mut node = Node::default();
            load_descriptors(
                name,
                &mut node,
                &format!("{}.", root.domain),
                &root.descriptors,
            )?;
            config.domains.insert(root.domain, node);
        }
        Ok(config)
    }

    /// Whether `domain` has a configuration.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The peer's lookup: walks the entries level by level (`key_value`,
    /// then a wildcard `key_prefix*`, then `key`); a limit counts only when
    /// found at the request's last entry.
    pub fn get_limit(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Found> {
        let mut node = self.domains.get(domain)?;
        let mut found: Option<Found> = None;
        for (i, (key, value)) in entries.iter().enumerate() {
            let key_value = format!("{key}_{value}");
            let mut next = node.children.get(&key_value);
            if next.is_none() {
                next = node
                    .wildcard_keys
                    .iter()
                    .find(|w| key_value.starts_with(w.trim_end_matches('*')))
                    .and_then(|w| node.children.get(w));
            }
            if next.is_none() {
                next = node.children.get(*key);
            }
            if let Some(n) = next {
                if let (Some(limit), true) = (&n.limit, i == entries.len() - 1) {
                    found = Some(Found {
                        limit: limit.clone(),
                        stat_key: limit.full_key.clone(),
                    });
                }
            }
            match next {
                Some(n) if !n.children.is_empty() => node = n,
                _ => {
                    if let Some(f) = found.as_mut().filter(|f| f.limit.detailed_metric) {
                        f.stat_key = format!("{}_{value}", f.limit.full_key);
                    }
                    break;
                }
            }
        }
        found
    }
}

fn parse_file(name: &str, text: &str) -> Result<YamlRoot, ConfigError> {
    let any: Value = serde_yaml::from_str(text)
        .map_err(|e| err(name, format!("error loading config file: {e}")))?;
    match &any {
        Value::Mapping(m) => validate_keys(name, m)?,
        Value::Null => {}
        _ => {
            return Err(err(
                name,
                "error loading config file: the document is not a mapping",
            ))
        }
    }
    serde_yaml::from_value(any).map_err(|e| err(name, format!("error loading config file: {e}")))
}

/// The peer's check of every map key at every depth.
fn validate_keys(name: &str, map: &serde_yaml::Mapping) -> Result<(), ConfigError> {
    for (k, v) in map {
        let Value::String(k) = k else {
            return Err(err(
                name,
                format!("config error, key is not of type string: {k:?}"),
            ));
        };
        if !VALID_KEYS.contains(&k.as_str()) {
            return Err(err(name, format!("config error, unknown key '{k}'")));
        }
        match v {
            Value::Sequence(items) => {
                for item in items {
                    match item {
                        Value::Mapping(m) => validate_keys(name, m)?,
                        // rl's `box: [300, 3600, 86400]`
                        Value::Number(_) if k == "box" => {}
                        other => {
                            return Err(err(
                                name,
                                format!(
                                    "config error, yaml file contains list of type other than map: {other:?}"
                                ),
                            ))
                        }
                    }
                }
            }
            Value::Mapping(m) => validate_keys(name, m)?,
            Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null => {}
            Value::Tagged(_) => return Err(err(name, "error checking config")),
        }
    }
    Ok(())
}

fn load_descriptors(
    name: &str,
    node: &mut Node,
    parent_key: &str,
    descriptors: &[YamlDescriptor],
) -> Result<(), ConfigError> {
    for d in descriptors {
        if d.key.is_empty() {
            return Err(err(name, "descriptor has empty key"));
        }
        let final_key = if d.value.is_empty() {
            d.key.clone()
        } else {
            format!("{}_{}", d.key, d.value)
        };
        let full_key = format!("{parent_key}{final_key}");
        if node.children.contains_key(&final_key) {
            return Err(err(
                name,
                format!("duplicate descriptor composite key '{full_key}'"),
            ));
        }
        let limit = match &d.rate_limit {
            Some(rl) => Some(Arc::new(load_limit(name, d, rl, &full_key)?)),
            None => None,
        };
        let mut child = Node {
            limit,
            ..Node::default()
        };
        load_descriptors(name, &mut child, &format!("{full_key}."), &d.descriptors)?;
        if final_key.ends_with('*') {
            node.wildcard_keys.push(final_key.clone());
        }
        node.children.insert(final_key, child);
    }
    Ok(())
}

fn load_limit(
    name: &str,
    d: &YamlDescriptor,
    rl: &YamlRateLimit,
    full_key: &str,
) -> Result<Limit, ConfigError> {
    let unit = Unit::parse(&rl.rule.unit);
    let mut rules = Vec::new();
    if rl.unlimited {
        if unit.is_some() {
            return Err(err(
                name,
                "should not specify rate limit unit when unlimited",
            ));
        }
    } else {
        rules.push(load_rule(name, &rl.rule)?);
        for also in &rl.also {
            rules.push(load_rule(name, also)?);
        }
    }
    for r in &rl.replaces {
        if r.name.is_empty() {
            return Err(err(name, "should not have an empty replaces entry"));
        }
        if r.name == rl.name {
            return Err(err(
                name,
                "replaces should not contain name of same descriptor",
            ));
        }
    }
    Ok(Limit {
        full_key: full_key.to_string(),
        name: rl.name.clone(),
        replaces: rl.replaces.iter().map(|r| r.name.clone()).collect(),
        unlimited: rl.unlimited,
        shadow_mode: d.shadow_mode,
        detailed_metric: d.detailed_metric,
        rules,
    })
}

fn load_rule(name: &str, y: &YamlRule) -> Result<Rule, ConfigError> {
    let unit = Unit::parse(&y.unit)
        .ok_or_else(|| err(name, format!("invalid rate limit unit '{}'", y.unit)))?;
    let algorithm = match y.algorithm.as_deref() {
        None | Some("fixed") => Algorithm::Fixed,
        Some("sliding_window") => Algorithm::SlidingWindow,
        Some("exact") => Algorithm::Exact,
        Some("token_bucket") => Algorithm::TokenBucket,
        Some("calendar") => Algorithm::Calendar,
        Some(other) => {
            return Err(err(
                name,
                format!(
                    "invalid algorithm '{other}' (fixed, sliding_window, exact, token_bucket or calendar)"
                ),
            ))
        }
    };
    if algorithm == Algorithm::Calendar && !matches!(unit, Unit::Day | Unit::Week | Unit::Month) {
        return Err(err(
            name,
            "algorithm calendar needs unit day, week or month",
        ));
    }
    let per_unit = u64::from(y.requests_per_unit);
    let burst = match (y.burst, algorithm) {
        (None, _) => per_unit,
        (Some(b), Algorithm::TokenBucket) if (1..=1_000_000_000_000_000).contains(&b) => b,
        (Some(_), Algorithm::TokenBucket) => {
            return Err(err(name, "burst must be 1 to 1000000000000000"));
        }
        (Some(_), _) => return Err(err(name, "burst requires algorithm token_bucket")),
    };
    if algorithm == Algorithm::TokenBucket {
        if per_unit == 0 {
            return Err(err(
                name,
                "token_bucket needs requests_per_unit of at least 1",
            ));
        }
        // rl's bound: a bucket refills from empty in at most 100 years
        if u128::from(burst) * u128::from(unit.seconds()) > u128::from(per_unit) * MAX_REFILL_S {
            return Err(err(
                name,
                "token_bucket refills from empty in at most 100 years (burst x unit / requests_per_unit)",
            ));
        }
    }
    if algorithm == Algorithm::Exact && per_unit > 10_000 {
        return Err(err(
            name,
            "algorithm exact counts at most 10000 requests_per_unit",
        ));
    }
    let strikes = match &y.strikes {
        None => None,
        Some(s) => {
            if s.threshold == 0 || s.window == 0 {
                return Err(err(
                    name,
                    "strikes needs threshold and window of at least 1",
                ));
            }
            let boxes = match s.boxes.as_deref() {
                None => [300, 3600, 86_400],
                Some([a, b, c]) => [*a, *b, *c],
                Some(_) => return Err(err(name, "box needs three durations in seconds")),
            };
            Some(Strikes {
                threshold: s.threshold,
                window: s.window,
                boxes,
            })
        }
    };
    Ok(Rule {
        requests_per_unit: y.requests_per_unit,
        unit,
        algorithm,
        burst,
        strikes,
    })
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
