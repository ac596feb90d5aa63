//! What an alert says and where it goes: the deliveries of a box trip or a
//! quota threshold, by level and tier, with their bodies (JSON webhooks,
//! PagerDuty Events API v2 events, emails) and their dedup markers.

use crate::config::{Config, Dest};
use crate::owner::Owner;
use crate::retry::Source;
use crate::secrets::Secrets;
use crate::store::BoxStatus;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use std::collections::BTreeMap;

/// The body of one delivery.
#[derive(Debug, Clone)]
pub enum Payload {
    /// A JSON POST, signed with `secret` when given.
    Http {
        /// Where to POST.
        url: String,
        /// The JSON body.
        body: Vec<u8>,
        /// The HMAC-SHA256 key of the `X-Rlctl-Signature` header.
        secret: Option<String>,
    },
    /// An email.
    Email {
        /// Recipients.
        to: Vec<String>,
        /// Subject line.
        subject: String,
        /// Plain-text body.
        body: String,
    },
}

/// One alert to one destination.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The alert (a trip id, or a quota threshold id).
    pub alert_id: String,
    /// Where it goes.
    pub dest: Dest,
    /// What it says.
    pub payload: Payload,
    /// The Redis key recording that it was sent (or finally failed).
    pub marker: String,
    /// How long the marker is kept (ms).
    pub marker_ttl_ms: i64,
    /// The audit field naming what the alert is about (`key`, or `tenant`
    /// for quota alerts) and its value.
    pub subject: (&'static str, String),
    /// What the alert is about: its deliveries are made again from it
    /// for each retry (kept in Redis while pending; never a secret).
    pub source: Source,
    /// When its first attempt was made (ms since the epoch; 0: not yet).
    pub first_ms: i64,
    /// Attempts made so far.
    pub attempts: u32,
}

/// A box seen on a key.
#[derive(Debug, Clone)]
pub struct BoxAlert {
    /// Stable id of this trip (README, "Deduplication").
    pub trip_id: String,
    /// The boxed key.
    pub key: String,
    /// Its status when read.
    pub status: BoxStatus,
    /// Its owner.
    pub owner: Owner,
    /// How long the trip record and markers are kept (ms).
    pub keep_ms: i64,
    /// Who tripped it by hand, when `rlctl trip` did.
    pub operator: Option<Operator>,
}

/// The note `rlctl trip` leaves for the worker: who and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Operator {
    /// `--by`.
    pub by: String,
    /// `--reason`.
    pub reason: String,
    /// When the note was written (ms since the epoch).
    pub at_ms: i64,
}

/// A new trip id: 128 random bits in hex. Opaque: a tenant who sees it
/// (webhook bodies, `X-Rlctl-Delivery`) cannot map it to a Redis key name;
/// the trip record keeps it, so it is the same after a restart.
pub fn new_trip_id() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(hex::encode(bytes))
}

/// The key of the note `rlctl trip` leaves for `key`'s next trip.
pub fn note_key(conf: &Config, key: &str) -> String {
    format!("{}note:{key}", conf.keys.state_prefix)
}

/// A quota threshold crossed.
#[derive(Debug, Clone)]
pub struct QuotaAlert {
    /// `quota:<tenant>:<quota>:<period>:<threshold>`.
    pub alert_id: String,
    /// Its owner (a tenant).
    pub owner: Owner,
    /// Quota name (`requests`, `egress_bytes`, ...).
    pub quota: String,
    /// Period (`2026-12`).
    pub period: String,
    /// Used so far.
    pub used: u64,
    /// The quota.
    pub limit: u64,
    /// The percentage crossed.
    pub threshold: u32,
}

/// Checks that every `{name}` of `text` is one of `allowed`.
pub fn check_template(text: &str, allowed: &[&str]) -> Result<(), String> {
    for name in placeholders(text) {
        if !allowed.contains(&name) {
            return Err(format!(
                "unknown placeholder {{{name}}} (known: {})",
                allowed.join(", ")
            ));
        }
    }
    Ok(())
}

fn placeholders(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(close) = rest.find('}') {
            let name = &rest[..close];
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                out.push(name);
                rest = &rest[close + 1..];
            }
        }
    }
    out
}

/// Replaces each `{name}` by its value (names checked at load time).
/// One pass: a value that itself contains `{name}` is not expanded again.
pub fn render(text: &str, values: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let value = after
            .find('}')
            .and_then(|close| Some((values.get(&after[..close])?, close)));
        match value {
            Some((value, close)) => {
                out.push_str(value);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `X-Rlctl-Signature`: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`.
pub fn signature(secret: &str, unix_secs: u64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(unix_secs.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "t={unix_secs},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// How a box's time left reads in a message.
pub fn time_left(ttl_ms: i64) -> String {
    if ttl_ms < 0 {
        return "until released by hand".into();
    }
    let secs = u64::try_from(ttl_ms).unwrap_or(0).div_ceil(1000);
    humantime::format_duration(std::time::Duration::from_secs(secs)).to_string()
}

/// What a box alert is about, as the subject of a sentence: "API key k-2
/// of Acme" for a key of one API key, "Every API key of Acme" for a
/// tenant's own key, "Key rl:{ip:...}:login" for a key with no owner.
pub fn box_subject(key: &str, o: &Owner) -> String {
    match (&o.key_id, &o.tenant_id) {
        (Some(id), _) => format!("API key {id} of {}", o.tenant_name()),
        (None, Some(_)) => format!("Every API key of {}", o.tenant_name()),
        (None, None) => format!("Key {key}"),
    }
}

fn box_values(conf: &Config, a: &BoxAlert) -> BTreeMap<&'static str, String> {
    let o = &a.owner;
    BTreeMap::from([
        ("subject", box_subject(&a.key, o)),
        ("key", a.key.clone()),
        ("key_id", o.key_id.clone().unwrap_or_else(|| "-".into())),
        ("tenant", o.tenant_id.clone().unwrap_or_else(|| "-".into())),
        ("tenant_name", o.tenant_name()),
        ("tier", o.tier.clone()),
        ("level", a.status.level.to_string()),
        ("time_left", time_left(a.status.ttl_ms)),
        ("ttl_ms", a.status.ttl_ms.to_string()),
        ("offenses", a.status.offenses.to_string()),
        ("guidelines_url", conf.templates.guidelines_url.clone()),
        ("trip_id", a.trip_id.clone()),
    ])
}

/// The source a key is about, from its hash tag: the gateway's rule keys
/// `<prefix>:{ip:<ip>}:...` and `<prefix>:{subject:<subject>}:...` (and
/// `rl:{auth:ip:<ip>}`, `rl:{auth:sub:<subject>}`) give `("ip", ip)` or
/// `("subject", subject)`.
pub fn offender(key: &str) -> Option<(&'static str, &str)> {
    let tag = key.split_once('{')?.1.split_once('}')?.0;
    let tag = tag.strip_prefix("auth:").unwrap_or(tag);
    let (attr, value) = tag.split_once(':')?;
    let attr = match attr {
        "ip" => "ip",
        "subject" | "sub" => "subject",
        _ => return None,
    };
    (!value.is_empty()).then_some((attr, value))
}

fn offender_json(key: &str) -> Value {
    offender(key).map_or(Value::Null, |(attr, value)| json!({ attr: value }))
}

/// The destinations of a box at `level` for `tier` (the Enterprise rule
/// adds the account owner's page to a level-3 page).
pub fn box_dests(conf: &Config, tier: &str, level: i64) -> Vec<Dest> {
    let Some(t) = conf.tiers.get(tier) else {
        return Vec::new();
    };
    let mut dests = match level {
        1 => t.level1.clone(),
        2 => t.level2.clone(),
        3 => t.level3.clone(),
        _ => Vec::new(),
    };
    if level == 3 && t.human_review && dests.contains(&Dest::Page) {
        dests.push(Dest::PageAccountOwner);
    }
    dests.sort();
    dests.dedup();
    dests
}

/// The marker key of (alert, destination).
pub fn marker_key(conf: &Config, alert_id: &str, dest: Dest) -> String {
    format!("{}sent:{alert_id}:{}", conf.keys.state_prefix, dest.name())
}

/// The deliveries of a box alert. A destination whose details are missing
/// (an unknown tenant's webhook) is left out; the caller logs `skipped`.
pub fn plan_box(
    conf: &Config,
    secrets: &Secrets,
    a: &BoxAlert,
) -> (Vec<Delivery>, Vec<(Dest, String)>) {
    let values = box_values(conf, a);
    let o = &a.owner;
    let human_review = conf.tiers.get(&o.tier).is_some_and(|t| t.human_review);
    let common = json!({
        "type": "rl.box",
        "trip_id": a.trip_id,
        "level": a.status.level,
        "ttl_ms": a.status.ttl_ms,
        "manual": a.status.ttl_ms < 0,
        "offenses": a.status.offenses,
        "tenant": o.tenant_id,
        "key_id": o.key_id,
        "tier": o.tier,
        "guidelines_url": conf.templates.guidelines_url,
    });
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for dest in box_dests(conf, &o.tier, a.status.level) {
        let payload = match dest {
            Dest::TenantWebhook => tenant_webhook(secrets, o, common.clone()),
            Dest::Email => email(
                o,
                render(&conf.templates.box_subject, &values),
                render(&conf.templates.box_body, &values),
            ),
            Dest::Internal => {
                let body = with(common.clone(), "key", json!(a.key));
                let body = with(body, "offender", offender_json(&a.key));
                internal(conf, secrets, with(body, "tripped_by", json!(a.operator)))
            }
            Dest::Page | Dest::PageAccountOwner => page(
                conf,
                secrets,
                a,
                dest,
                render(&conf.templates.page_summary, &values),
                human_review,
            ),
        };
        match payload {
            Ok(payload) => out.push(Delivery {
                alert_id: a.trip_id.clone(),
                dest,
                payload,
                marker: marker_key(conf, &a.trip_id, dest),
                marker_ttl_ms: a.keep_ms,
                subject: ("key", a.key.clone()),
                source: Source::of_box(a),
                first_ms: 0,
                attempts: 0,
            }),
            Err(why) => skipped.push((dest, why)),
        }
    }
    (out, skipped)
}

/// The deliveries of a quota alert.
pub fn plan_quota(
    conf: &Config,
    secrets: &Secrets,
    q: &QuotaAlert,
    keep_ms: i64,
) -> (Vec<Delivery>, Vec<(Dest, String)>) {
    let o = &q.owner;
    let values: BTreeMap<&str, String> = BTreeMap::from([
        ("tenant", o.tenant_id.clone().unwrap_or_default()),
        ("tenant_name", o.tenant_name()),
        ("tier", o.tier.clone()),
        ("quota", q.quota.clone()),
        ("used", q.used.to_string()),
        ("limit", q.limit.to_string()),
        ("threshold", q.threshold.to_string()),
        ("period", q.period.clone()),
    ]);
    let common = json!({
        "type": "rl.quota",
        "alert_id": q.alert_id,
        "tenant": o.tenant_id,
        "tier": o.tier,
        "quota": q.quota,
        "period": q.period,
        "used": q.used,
        "limit": q.limit,
        "threshold": q.threshold,
    });
    let dests = conf
        .tiers
        .get(&o.tier)
        .map(|t| t.quota.clone())
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for dest in dests {
        let payload = match dest {
            Dest::TenantWebhook => tenant_webhook(secrets, o, common.clone()),
            Dest::Email => email(
                o,
                render(&conf.templates.quota_subject, &values),
                render(&conf.templates.quota_body, &values),
            ),
            Dest::Internal => internal(conf, secrets, common.clone()),
            Dest::Page | Dest::PageAccountOwner => {
                Err("pages are for boxes, not quotas".to_string())
            }
        };
        match payload {
            Ok(payload) => out.push(Delivery {
                alert_id: q.alert_id.clone(),
                dest,
                payload,
                marker: marker_key(conf, &q.alert_id, dest),
                marker_ttl_ms: keep_ms,
                subject: ("tenant", o.tenant_id.clone().unwrap_or_default()),
                source: Source::of_quota(q, keep_ms),
                first_ms: 0,
                attempts: 0,
            }),
            Err(why) => skipped.push((dest, why)),
        }
    }
    (out, skipped)
}

fn with(mut v: Value, field: &str, value: Value) -> Value {
    if let Value::Object(m) = &mut v {
        m.insert(field.to_string(), value);
    }
    v
}

fn tenant_webhook(secrets: &Secrets, o: &Owner, body: Value) -> Result<Payload, String> {
    let t = o
        .tenant
        .as_ref()
        .ok_or("the key's tenant is not in [tenants]")?;
    let url = t
        .webhook_url
        .clone()
        .ok_or("the tenant has no webhook_url")?;
    let id = o.tenant_id.clone().unwrap_or_default();
    let secret = secrets
        .tenant_webhook
        .get(&id)
        .cloned()
        .ok_or("the tenant has no webhook secret")?;
    Ok(Payload::Http {
        url,
        body: body.to_string().into_bytes(),
        secret: Some(secret),
    })
}

fn email(o: &Owner, subject: String, body: String) -> Result<Payload, String> {
    let t = o
        .tenant
        .as_ref()
        .ok_or("the key's tenant is not in [tenants]")?;
    if t.contacts.is_empty() {
        return Err("the tenant has no contacts".into());
    }
    Ok(Payload::Email {
        to: t.contacts.clone(),
        subject,
        body,
    })
}

/// The internal webhook's payload of `body`.
pub fn internal(conf: &Config, secrets: &Secrets, body: Value) -> Result<Payload, String> {
    let w = conf.internal.as_ref().ok_or("no [internal] section")?;
    Ok(Payload::Http {
        url: w.webhook_url.clone(),
        body: body.to_string().into_bytes(),
        secret: secrets.internal.clone(),
    })
}

/// A PagerDuty Events API v2 `trigger` event.
fn page(
    conf: &Config,
    secrets: &Secrets,
    a: &BoxAlert,
    dest: Dest,
    summary: String,
    human_review: bool,
) -> Result<Payload, String> {
    let p = conf.pager.as_ref().ok_or("no [pager] section")?;
    let (routing_key, notify) = if dest == Dest::PageAccountOwner {
        let owner = a
            .owner
            .tenant
            .as_ref()
            .and_then(|t| t.account_owner.clone())
            .ok_or("the tenant has no account_owner")?;
        (
            secrets
                .pager_account_owner_routing_key
                .clone()
                .ok_or("no account owner routing key")?,
            owner,
        )
    } else {
        (
            secrets
                .pager_routing_key
                .clone()
                .ok_or("no on-call routing key")?,
            "on-call".to_string(),
        )
    };
    let o = &a.owner;
    let offender = offender(&a.key);
    let action = if human_review {
        "human decision required: nothing is suspended automatically (Enterprise rule)".into()
    } else if a.status.ttl_ms < 0 {
        "suspended pending review: the box stays until released by hand (rlctl release)".into()
    } else if let Some(("ip", ip)) = offender {
        format!(
            "ban source IP {ip} for {} (a WAF IP set); the box ends by itself",
            time_left(a.status.ttl_ms)
        )
    } else {
        "review the key; the box ends by itself when its time runs out".to_string()
    };
    let event = json!({
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": format!("{}:{}", a.trip_id, dest.name()),
        "payload": {
            "summary": summary,
            "source": "rlctl",
            "severity": "critical",
            "component": a.key,
            "group": o.tenant_id,
            "class": format!("rl.box.level{}", a.status.level),
            "custom_details": {
                "trip_id": a.trip_id,
                "key": a.key,
                "tenant": o.tenant_id,
                "tier": o.tier,
                "level": a.status.level,
                "ttl_ms": a.status.ttl_ms,
                "offenses": a.status.offenses,
                "notify": notify,
                "account_owner": o.tenant.as_ref().and_then(|t| t.account_owner.clone()),
                "automatic_suspension": !human_review && a.status.ttl_ms < 0,
                "offender": offender_json(&a.key),
                "tripped_by": a.operator,
                "action": action,
            }
        }
    });
    Ok(Payload::Http {
        url: p.url.clone(),
        body: event.to_string().into_bytes(),
        secret: None,
    })
}

#[cfg(test)]
mod tests;
