//! Prometheus metrics under envoyproxy/ratelimit's names, as its default
//! statsd mapping exposes them: `ratelimit.service.rate_limit.<domain>.
//! <key1>[.<key2>...].<stat>` becomes `ratelimit_service_rate_limit_<stat>`
//! with the labels `domain`, `key1` and, for deeper keys, `key2`. The
//! number of distinct stat keys is bounded: past the bound, a new key's
//! stats go to the series `key1="_overflow"` of its domain, and
//! `ratelimit_service_stat_overflow` counts the requests so folded.

use std::collections::HashSet;
use std::sync::RwLock;

use prometheus::{Encoder, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

/// The per-limit counters of the peer.
#[derive(Clone, Copy, Debug)]
pub enum Stat {
    /// Every hit (points) asked for.
    TotalHits,
    /// Hits refused (or that would be, in shadow mode).
    OverLimit,
    /// Admitted hits past 80% of the limit.
    NearLimit,
    /// Admitted hits.
    WithinLimit,
    /// Over-limit hits let through by shadow mode.
    ShadowMode,
}

const STATS: [(Stat, &str); 5] = [
    (Stat::TotalHits, "total_hits"),
    (Stat::OverLimit, "over_limit"),
    (Stat::NearLimit, "near_limit"),
    (Stat::WithinLimit, "within_limit"),
    (Stat::ShadowMode, "shadow_mode"),
];

/// The most distinct stat keys [`Metrics::new`] keeps apart.
pub const MAX_STAT_KEYS: usize = 10_000;

/// The `key1` label of the series that takes the stats of keys past the bound.
const OVERFLOW: &str = "_overflow";

/// Every metric of the service.
pub struct Metrics {
    registry: Registry,
    /// The stat keys that have their own series.
    stat_keys: RwLock<HashSet<String>>,
    /// How many stat keys may have their own series.
    max_stat_keys: usize,
    /// `ratelimit_service_stat_overflow`: requests whose stats went to an
    /// overflow series.
    pub stat_overflow: IntCounter,
    /// Per stat, in `Stat` order: labels domain, key1, key2.
    per_limit: Vec<IntCounterVec>,
    /// `ratelimit_service_should_rate_limit_error{err_type}`.
    pub errors: IntCounterVec,
    /// `ratelimit_service_refund_error`: refusals whose refund of the
    /// admitting checks failed (the refusal stands).
    pub refund_errors: IntCounter,
    /// `ratelimit_service_config_load_success`.
    pub config_load_success: IntCounter,
    /// `ratelimit_service_config_load_error`.
    pub config_load_error: IntCounter,
    /// `ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}`
    /// (resolved once: no label lookup per request).
    pub should_rate_limit_requests: IntCounter,
}

impl Metrics {
    /// Registers every metric, with at most [`MAX_STAT_KEYS`] stat keys.
    pub fn new() -> Metrics {
        Metrics::with_max_stat_keys(MAX_STAT_KEYS)
    }

    /// Registers every metric, with at most `max_stat_keys` stat keys.
    pub fn with_max_stat_keys(max_stat_keys: usize) -> Metrics {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let v = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(v.clone()))
                .expect("unique metric");
            v
        };
        let mut per_limit = Vec::new();
        for (_, stat) in STATS {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            let help = format!("ratelimit.service.rate_limit.<domain>.<key>.{stat}");
            // one label set per name: key2 is empty for two-segment keys
            per_limit.push(counter_vec(&name, &help, &["domain", "key1", "key2"]));
        }
        let errors = counter_vec(
            "ratelimit_service_should_rate_limit_error",
            "ShouldRateLimit calls answered with an error, by cause",
            &["err_type"],
        );
        let total_requests = counter_vec(
            "ratelimit_service_total_requests",
            "gRPC calls served",
            &["grpc_method"],
        );
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        Metrics {
            stat_keys: RwLock::new(HashSet::new()),
            max_stat_keys,
            stat_overflow: counter(
                "ratelimit_service_stat_overflow",
                "requests whose per-limit stats went to the _overflow series (too many stat keys)",
            ),
            config_load_success: counter(
                "ratelimit_service_config_load_success",
                "configuration loads that succeeded",
            ),
            config_load_error: counter(
                "ratelimit_service_config_load_error",
                "configuration loads that failed (the previous one stays)",
            ),
            refund_errors: counter(
                "ratelimit_service_refund_error",
                "refusals whose refund of the admitting checks failed (the refusal stands)",
            ),
            should_rate_limit_requests: total_requests.with_label_values(&["ShouldRateLimit"]),
            registry,
            per_limit,
            errors,
        }
    }

    /// Adds `n` to `stat` of the limit whose stat key is `stat_key`
    /// (`domain.key1[.key2...]`), stopping at the counter's largest value
    /// (a request's hits can be as large as 2^64 - 1).
    pub fn add(&self, stat_key: &str, stat: Stat, n: u64) {
        if n == 0 {
            return;
        }
        let mut parts = stat_key.splitn(4, '.');
        let domain = parts.next().unwrap_or("");
        let (key1, key2) = if self.known(stat_key) {
            (parts.next().unwrap_or(""), parts.next().unwrap_or(""))
        } else {
            if matches!(stat, Stat::TotalHits) {
                self.stat_overflow.inc();
            }
            (OVERFLOW, "")
        };
        let counter = self.per_limit[stat as usize].with_label_values(&[domain, key1, key2]);
        counter.inc_by(n.min(u64::MAX - counter.get()));
    }

    /// Whether `stat_key` has its own series (given one while there is room).
    fn known(&self, stat_key: &str) -> bool {
        if self
            .stat_keys
            .read()
            .is_ok_and(|keys| keys.contains(stat_key))
        {
            return true;
        }
        let Ok(mut keys) = self.stat_keys.write() else {
            return false;
        };
        if keys.len() >= self.max_stat_keys {
            return keys.contains(stat_key);
        }
        keys.insert(stat_key.to_string());
        true
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for these metric types.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Huge hits stop at the counter's largest value, never wrap.
    #[test]
    fn counters_saturate() {
        let m = Metrics::new();
        m.add("d.k", Stat::TotalHits, u64::MAX);
        m.add("d.k", Stat::TotalHits, 5);
        let c = m.per_limit[Stat::TotalHits as usize].with_label_values(&["d", "k", ""]);
        assert_eq!(c.get(), u64::MAX);
    }

    /// Past the bound, new stat keys share their domain's overflow series.
    #[test]
    fn stat_keys_are_bounded() {
        let m = Metrics::with_max_stat_keys(2);
        for i in 0..50 {
            m.add(&format!("d.k{i}"), Stat::TotalHits, 1);
            m.add(&format!("d.k{i}"), Stat::WithinLimit, 1);
        }
        m.add("d.k0", Stat::TotalHits, 1);
        let total = &m.per_limit[Stat::TotalHits as usize];
        assert_eq!(total.with_label_values(&["d", "k0", ""]).get(), 2);
        assert_eq!(total.with_label_values(&["d", "k1", ""]).get(), 1);
        assert_eq!(total.with_label_values(&["d", OVERFLOW, ""]).get(), 48);
        assert_eq!(m.stat_overflow.get(), 48);
        let text = m.render();
        assert!(!text.contains("k2"), "{text}");
    }
}
