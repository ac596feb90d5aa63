//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`: from a
//! request's descriptors to rl checks, and from their outcomes to the
//! response (codes, statuses, headers) and the peer's stats.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as PbUnit, Code, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

use crate::config::{Algorithm, Config, Found, Limit, Rule, Unit};
use crate::decide::{decide, Check, Outcome, Store};
use crate::headers::{self, Policy};
use crate::keys::{self, HashTag};
use crate::metrics::{Metrics, Stat};

/// Settings of the service.
#[derive(Clone, Debug)]
pub struct Options {
    /// Prefix of every Redis key.
    pub key_prefix: String,
    /// How keys are tagged for cluster slots.
    pub hash_tag: HashTag,
    /// The longest wait for Redis before answering with an error.
    pub redis_timeout: Duration,
    /// More descriptors in one request are refused (`INVALID_ARGUMENT`).
    pub max_descriptors: usize,
    /// Also send `X-RateLimit-Limit` / `-Remaining` / `-Reset`.
    pub legacy_headers: bool,
}

/// The gRPC service.
pub struct RateLimiter {
    /// The configuration in force (replaced whole on reload).
    pub config: Arc<RwLock<Arc<Config>>>,
    /// The Redis connection.
    pub store: Store,
    /// The stats.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub options: Options,
}

/// The peer's near-limit ratio: admitted hits past 80% of a limit count as near.
const NEAR_LIMIT_RATIO: f64 = 0.8;

/// The limit that applies to one request descriptor.
struct Applied {
    limit: Arc<Limit>,
    stat_key: String,
    hits: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn algorithm_letter(a: Algorithm) -> char {
    match a {
        Algorithm::Fixed => 'f',
        Algorithm::SlidingWindow => 's',
        Algorithm::Exact => 'e',
        Algorithm::TokenBucket => 't',
        Algorithm::Calendar => 'c',
    }
}

/// The policy name of rule `i` of a limit: its `name` (else its key in the
/// configuration, which holds no value the request chose, unlike a
/// `detailed_metric` stat key), `#i` appended after the first rule.
fn policy_name(a: &Applied, i: usize) -> String {
    let base = if a.limit.name.is_empty() {
        &a.limit.full_key
    } else {
        &a.limit.name
    };
    if i == 0 {
        base.clone()
    } else {
        format!("{base}#{i}")
    }
}

impl RateLimiter {
    /// The limits of the request's descriptors (`None`: not limited), with
    /// the peer's rules: a per-descriptor override wins, `unlimited` and
    /// replaced limits count nothing.
    fn applied(
        &self,
        config: &Config,
        req: &RateLimitRequest,
    ) -> Result<Vec<Option<Applied>>, String> {
        let request_hits = u64::from(req.hits_addend.max(1));
        let mut out = Vec::with_capacity(req.descriptors.len());
        for d in &req.descriptors {
            let entries: Vec<(&str, &str)> = d
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()))
                .collect();
            let hits = d.hits_addend.map(|h| h.value).unwrap_or(request_hits);
            let found = match (&d.limit, config.has_domain(&req.domain)) {
                (_, false) => None,
                (Some(o), true) => {
                    let unit = Unit::from_proto(o.unit).ok_or_else(|| {
                        format!("descriptor limit override has an unknown unit {}", o.unit)
                    })?;
                    // the entries' keys only: values come from the
                    // request, and each stat key is a metric series
                    let mut stat_key = req.domain.clone();
                    for (k, _) in &entries {
                        stat_key.push('.');
                        stat_key.push_str(k);
                    }
                    Some(Found {
                        limit: Arc::new(Limit {
                            full_key: stat_key.clone(),
                            name: String::new(),
                            replaces: Vec::new(),
                            unlimited: false,
                            shadow_mode: false,
                            detailed_metric: false,
                            rules: vec![Rule {
                                requests_per_unit: o.requests_per_unit,
                                unit,
                                algorithm: Algorithm::Fixed,
                                burst: u64::from(o.requests_per_unit),
                                strikes: None,
                            }],
                        }),
                        stat_key,
                    })
                }
                (None, true) => config.get_limit(&req.domain, &entries),
            };
            out.push(found.filter(|f| !f.limit.unlimited).map(|f| Applied {
                limit: f.limit,
                stat_key: f.stat_key,
                hits,
            }));
        }
        if out.iter().flatten().all(|a| a.limit.replaces.is_empty()) {
            return Ok(out);
        }
        let replaced: HashSet<String> = out
            .iter()
            .flatten()
            .flat_map(|a| a.limit.replaces.iter().cloned())
            .collect();
        for slot in out.iter_mut() {
            if slot
                .as_ref()
                .is_some_and(|a| !a.limit.name.is_empty() && replaced.contains(&a.limit.name))
            {
                *slot = None;
            }
        }
        Ok(out)
    }

    fn checks(&self, req: &RateLimitRequest, applied: &[Option<Applied>], now: u64) -> Vec<Check> {
        use std::fmt::Write;
        let mut checks = Vec::with_capacity(applied.len());
        let mut entries: Vec<(&str, &str)> = Vec::new();
        let mut id = String::new();
        for (i, a) in applied.iter().enumerate() {
            let Some(a) = a else { continue };
            entries.clear();
            entries.extend(
                req.descriptors[i]
                    .entries
                    .iter()
                    .map(|e| (e.key.as_str(), e.value.as_str())),
            );
            let tag = keys::tag(self.options.hash_tag, &req.domain, &entries);
            for (n, rule) in a.limit.rules.iter().enumerate() {
                id.clear();
                let _ = write!(
                    id,
                    "{n}{}{}",
                    algorithm_letter(rule.algorithm),
                    rule.unit.seconds()
                );
                let base = keys::base_key(
                    &self.options.key_prefix,
                    self.options.hash_tag,
                    &tag,
                    &entries,
                    &id,
                );
                let (key, fixed_reset_ms) = if rule.algorithm == Algorithm::Fixed {
                    let start = keys::window_start(now, rule.unit);
                    (
                        keys::aligned_key(&base, start, rule.unit),
                        Some(keys::until_window_end(now, rule.unit)),
                    )
                } else {
                    (base, None)
                };
                checks.push(Check {
                    desc: i,
                    rule: rule.clone(),
                    key,
                    tag: tag.clone(),
                    cost: a.hits,
                    shadow: a.limit.shadow_mode,
                    fixed_reset_ms,
                });
            }
        }
        checks
    }

    fn count(&self, a: &Applied, rule: &Rule, o: &Outcome) {
        let m = &self.metrics;
        m.add(&a.stat_key, Stat::TotalHits, a.hits);
        if o.over {
            m.add(&a.stat_key, Stat::OverLimit, a.hits);
            if a.limit.shadow_mode {
                m.add(&a.stat_key, Stat::ShadowMode, a.hits);
            }
            return;
        }
        m.add(&a.stat_key, Stat::WithinLimit, a.hits);
        let limit = u64::from(rule.requests_per_unit);
        let near = (limit as f64 * NEAR_LIMIT_RATIO).floor() as u64;
        let used = limit.saturating_sub(o.remaining);
        if used > near {
            m.add(&a.stat_key, Stat::NearLimit, (used - near).min(a.hits));
        }
    }

    /// Decides a request (the body of `ShouldRateLimit`).
    pub async fn answer(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        if req.domain.is_empty() {
            return Err(Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if req.descriptors.is_empty() {
            return Err(Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        if req.descriptors.len() > self.options.max_descriptors {
            return Err(Status::invalid_argument(format!(
                "too many descriptors: {} (at most {})",
                req.descriptors.len(),
                self.options.max_descriptors
            )));
        }
        let config = self
            .config
            .read()
            .map(|c| c.clone())
            .map_err(|_| Status::internal("configuration lock poisoned"))?;
        let applied = self
            .applied(&config, req)
            .map_err(Status::invalid_argument)?;
        let now = now_ms();
        let checks = self.checks(req, &applied, now);
        let decided = decide(&self.store, &checks, self.options.redis_timeout)
            .await
            .map_err(|e| {
                self.metrics
                    .errors
                    .with_label_values(&["redis_error"])
                    .inc();
                tracing::warn!(error = %e, domain = %req.domain, "redis failed");
                // the details (they may name keys) go to the log only
                Status::unavailable("redis unavailable")
            })?;
        if let Some(e) = &decided.refund_error {
            self.metrics.refund_errors.inc();
            tracing::warn!(error = %e, domain = %req.domain, "refund after a refusal failed; the refusal stands");
        }
        let outcomes = decided.outcomes;
        let response = self.response(&applied, &checks, &outcomes);
        tracing::debug!(
            domain = %req.domain,
            descriptors = req.descriptors.len(),
            checks = checks.len(),
            over_limit = response.overall_code == Code::OverLimit as i32,
            "decided"
        );
        Ok(response)
    }

    fn response(
        &self,
        applied: &[Option<Applied>],
        checks: &[Check],
        outcomes: &[Outcome],
    ) -> RateLimitResponse {
        let mut statuses: Vec<DescriptorStatus> = applied
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            })
            .collect();
        let mut policies = Vec::new();
        // the binding policy: (over, retry or remaining, index in
        // `policies`, remaining, reset)
        let mut binding: Option<(bool, u64, usize, u64, Option<u64>)> = None;
        let mut over_all = false;
        let mut rule_no = vec![0usize; applied.len()];
        let mut desc_best: Vec<Option<(bool, u64, usize)>> = vec![None; applied.len()];
        for (ci, (c, o)) in checks.iter().zip(outcomes).enumerate() {
            let Some(a) = &applied[c.desc] else { continue };
            let n = rule_no[c.desc];
            rule_no[c.desc] += 1;
            if n == 0 {
                self.count(a, &c.rule, o);
            }
            let window = c.rule.unit.seconds();
            policies.push(Policy {
                name: policy_name(a, n),
                quota: u64::from(c.rule.requests_per_unit),
                window,
            });
            let counts = o.over && !a.limit.shadow_mode;
            over_all |= counts;
            // a descriptor's status describes its rule that refuses with
            // the longest wait, else the one with the fewest points left
            let key = if counts { o.retry_ms } else { o.remaining };
            if desc_best[c.desc].is_none_or(|(bo, bk, _)| binds(counts, key, bo, bk)) {
                desc_best[c.desc] = Some((counts, key, ci));
            }
            let reset = if o.boxed {
                None
            } else if matches!(
                c.rule.algorithm,
                Algorithm::TokenBucket | Algorithm::Calendar
            ) {
                Some(headers::seconds(o.reset_ms))
            } else {
                Some(headers::seconds(o.reset_ms).min(window))
            };
            let b = (counts, key, policies.len() - 1, o.remaining, reset);
            if binding
                .as_ref()
                .is_none_or(|(bo, bk, ..)| binds(counts, key, *bo, *bk))
            {
                binding = Some(b);
            }
        }
        for (d, best) in desc_best.iter().enumerate() {
            let Some((counts, _, ci)) = best else {
                continue;
            };
            let (c, o) = (&checks[*ci], &outcomes[*ci]);
            let name = applied[d]
                .as_ref()
                .map(|a| a.limit.name.clone())
                .unwrap_or_default();
            statuses[d] = DescriptorStatus {
                code: if *counts { Code::OverLimit } else { Code::Ok } as i32,
                current_limit: Some(PbRateLimit {
                    name,
                    requests_per_unit: c.rule.requests_per_unit,
                    unit: PbUnit::try_from(c.rule.unit.proto()).unwrap_or(PbUnit::Unknown) as i32,
                }),
                limit_remaining: u32::try_from(o.remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(prost_types_duration(o.reset_ms)),
                ..Default::default()
            };
        }
        let mut headers_out = Vec::new();
        if let Some((_, _, p, remaining, reset)) = binding {
            let name = &policies[p].name;
            let mut add = |k: &str, v: String| {
                headers_out.push(HeaderValue {
                    key: k.to_string(),
                    value: v,
                    ..Default::default()
                })
            };
            add("RateLimit-Policy", headers::policy_field(&policies));
            add(
                "RateLimit",
                headers::ratelimit_field(name, remaining, reset),
            );
            if over_all {
                let retry = binding_retry(checks, outcomes, applied);
                add("Retry-After", headers::seconds(retry).to_string());
            }
            if self.options.legacy_headers {
                if let Some(p) = policies.iter().find(|p| &p.name == name) {
                    add(
                        "X-RateLimit-Limit",
                        format!("{}, {};w={}", p.quota, p.quota, p.window),
                    );
                }
                add("X-RateLimit-Remaining", remaining.to_string());
                add("X-RateLimit-Reset", reset.unwrap_or(0).to_string());
            }
        }
        RateLimitResponse {
            overall_code: if over_all { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers_out,
            ..Default::default()
        }
    }
}

/// Whether a check that refuses (`over`) with `key` (its wait when over,
/// else its points left) describes the request better than the one so far:
/// a refusal beats an admission, a longer wait a shorter one, fewer points
/// left more.
fn binds(over: bool, key: u64, best_over: bool, best_key: u64) -> bool {
    match (over, best_over) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => key > best_key,
        (false, false) => key < best_key,
    }
}

/// The longest wait among the checks that refuse the request.
fn binding_retry(checks: &[Check], outcomes: &[Outcome], applied: &[Option<Applied>]) -> u64 {
    checks
        .iter()
        .zip(outcomes)
        .filter(|(c, o)| {
            o.over
                && applied[c.desc]
                    .as_ref()
                    .is_some_and(|a| !a.limit.shadow_mode)
        })
        .map(|(_, o)| o.retry_ms)
        .max()
        .unwrap_or(0)
}

fn prost_types_duration(ms: u64) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.metrics.should_rate_limit_requests.inc();
        self.answer(request.get_ref()).await.map(Response::new)
    }
}
