//! The gateway tests' HTTP client ([`agent`], [`get`], [`post`], ...,
//! each answer a [`Resp`] whatever its status) and the assertions they
//! share (a problem body, the `RateLimit` field, a Prometheus counter).
//! Part of `common/gateway.rs`, which re-exports it.

use std::collections::HashMap;
use std::io::Read;
use std::time::Duration;

use serde_json::Value;

use super::HTTP_TIMEOUT;

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

/// One HTTP response, whatever its status.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Resp {
    /// A header's value, if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_lowercase()).map(String::as_str)
    }

    /// A header that must be present.
    pub fn must(&self, name: &str) -> &str {
        self.header(name)
            .unwrap_or_else(|| panic!("header {name} missing in {self:#?}"))
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
}

/// An HTTP client with keep-alive connections (one per thread using it).
pub fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(HTTP_TIMEOUT)
        .max_idle_connections_per_host(4)
        .build()
}

pub fn into_resp(r: Result<ureq::Response, ureq::Error>) -> Resp {
    let resp = match r {
        Ok(resp) => resp,
        Err(ureq::Error::Status(_, resp)) => resp,
        Err(e) => panic!("HTTP request failed: {e}"),
    };
    let status = resp.status();
    let mut headers = HashMap::new();
    for name in resp.headers_names() {
        if let Some(v) = resp.header(&name) {
            headers.insert(name.to_lowercase(), v.to_string());
        }
    }
    let mut body = String::new();
    resp.into_reader()
        .take(1 << 20)
        .read_to_string(&mut body)
        .expect("read body");
    Resp {
        status,
        headers,
        body,
    }
}

/// `GET url` with `headers`.
pub fn get(agent: &ureq::Agent, url: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = agent.get(url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    into_resp(req.call())
}

/// `HEAD url` with `headers`.
pub fn head(agent: &ureq::Agent, url: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = agent.head(url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    into_resp(req.call())
}

/// `POST url` with `headers` and an empty body.
pub fn post(agent: &ureq::Agent, url: &str, headers: &[(&str, &str)]) -> Resp {
    let mut req = agent.post(url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    into_resp(req.send_string(""))
}

/// `POST url` with a form body.
pub fn post_form(
    agent: &ureq::Agent,
    url: &str,
    headers: &[(&str, &str)],
    form: &[(&str, &str)],
) -> Resp {
    let mut req = agent.post(url);
    for (k, v) in headers {
        req = req.set(k, v);
    }
    into_resp(req.send_form(form))
}

/// The Prometheus counter `rl_gateway_requests_total` for `decision` and
/// `route`, summed over tiers, from the /metrics of `base`.
pub fn counter(agent: &ureq::Agent, base: &str, decision: &str, route: &str) -> u64 {
    let m = get(agent, &format!("{base}/metrics"), &[]);
    assert_eq!(m.status, 200, "/metrics: {m:?}");
    let needle = format!("decision=\"{decision}\",route=\"{route}\",");
    m.body
        .lines()
        .filter(|l| l.starts_with("rl_gateway_requests_total{") && l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Polls `cond` every 20 ms until true (the kit's one bounded wait loop);
/// panics with `what` after `timeout`.
pub fn poll(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let step = Duration::from_millis(20);
    let polled = crate::common::poll_for(timeout, step, || cond().then_some(()));
    assert!(polled.is_some(), "timed out after {timeout:?}: {what}");
}

// ---------------------------------------------------------------------------
// Assertions shared by the gateway tests
// ---------------------------------------------------------------------------

pub fn is_request_id(v: &Value) -> bool {
    v.as_str()
        .is_some_and(|s| s.len() == 32 && s.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The problem+json checks every refusal shares; returns the body.
pub fn problem(r: &Resp, status: u16, kind: &str) -> Value {
    assert_eq!(r.status, status, "{r:#?}");
    assert_eq!(r.must("Content-Type"), "application/problem+json");
    let b = r.json();
    assert_eq!(
        b["type"].as_str(),
        Some(format!("https://api.example.com/problems/{kind}").as_str()),
        "{b}"
    );
    assert!(b["title"].as_str().is_some_and(|t| !t.is_empty()), "{b}");
    assert_eq!(b["status"].as_u64(), Some(u64::from(status)), "{b}");
    assert!(b["detail"].as_str().is_some_and(|t| !t.is_empty()), "{b}");
    assert!(
        b["instance"]
            .as_str()
            .is_some_and(|i| i.starts_with("/v1/")),
        "{b}"
    );
    assert!(is_request_id(&b["request_id"]), "{b}");
    // nothing internal: no key names, no Redis, no other tenant
    let lower = r.body.to_lowercase();
    for leak in [
        "rl:", "kong:", "shadow:", "{t:", "redis", "lease:", "bigco", "loadco", "auth:",
    ] {
        assert!(!lower.contains(leak), "body leaks {leak:?}: {}", r.body);
    }
    b
}

/// Checks `RateLimit: "name";r=R;t=T` and returns (name, r, t).
pub fn ratelimit(r: &Resp) -> (String, i64, Option<i64>) {
    let v = r.must("RateLimit");
    let mut parts = v.split(';');
    let name = parts.next().expect("name").trim_matches('"').to_string();
    let (mut rem, mut reset) = (None, None);
    for p in parts {
        if let Some(x) = p.strip_prefix("r=") {
            rem = x.parse().ok();
        } else if let Some(x) = p.strip_prefix("t=") {
            reset = x.parse().ok();
        }
    }
    (name, rem.expect("r= in RateLimit"), reset)
}

/// Live leases on `key`.
pub fn leases(con: &mut redis::Connection, key: &str) -> usize {
    match crate::common::call(con, &format!("RL.LEASE LIST {key}")).expect("RL.LEASE LIST") {
        redis::Value::Array(v) => v.len(),
        other => panic!("RL.LEASE LIST: {other:?}"),
    }
}
