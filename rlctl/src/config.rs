//! The TOML configuration: destinations, tiers, tenants, templates.
//!
//! `Config::load` parses and validates; every error names the field at
//! fault (`tiers.growth.level2: ...`). Secrets are never in the file: the
//! file names environment variables (`*_env` fields) and `Secrets::from_env`
//! reads them (only `rlctl watch` needs them).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// A destination an alert can go to (the names used in `tiers.*.level2` etc.).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Dest {
    /// The tenant's own webhook (`tenants.<id>.webhook_url`), HMAC-signed.
    TenantWebhook,
    /// An email to the tenant's `contacts` over SMTP (`[email]`).
    Email,
    /// The internal webhook (`[internal]`).
    Internal,
    /// A PagerDuty Events API v2 event to on-call (`[pager]`).
    Page,
    /// A page to the account owner: added by `human_review` tiers, never
    /// listed by hand.
    PageAccountOwner,
}

impl Dest {
    /// The name used in the configuration, markers and the audit trail.
    pub fn name(self) -> &'static str {
        match self {
            Dest::TenantWebhook => "tenant_webhook",
            Dest::Email => "email",
            Dest::Internal => "internal",
            Dest::Page => "page",
            Dest::PageAccountOwner => "page_account_owner",
        }
    }
    /// Whether the destination needs a known tenant.
    fn needs_tenant(self) -> bool {
        matches!(self, Dest::TenantWebhook | Dest::Email)
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where Redis is.
    pub redis: RedisConf,
    /// rlctl's own keys (audit stream, dedup state, quota stream).
    #[serde(default)]
    pub keys: KeysConf,
    /// Queues, rate limits and retries of the senders.
    #[serde(default)]
    pub delivery: DeliveryConf,
    /// How a box's key names its owner.
    #[serde(default)]
    pub identity: IdentityConf,
    /// Tenants by id (the `<tenant>` of a key pattern).
    #[serde(default)]
    pub tenants: BTreeMap<String, Tenant>,
    /// Tiers by name; `unowned` (keys of no known tenant) is always there.
    #[serde(default)]
    pub tiers: BTreeMap<String, Tier>,
    /// The internal webhook.
    pub internal: Option<WebhookConf>,
    /// The pager (PagerDuty Events API v2 shape).
    pub pager: Option<PagerConf>,
    /// SMTP for the tenant emails.
    pub email: Option<EmailConf>,
    /// Texts of emails and pages.
    #[serde(default)]
    pub templates: Templates,
    /// Monthly quota alerts.
    #[serde(default)]
    pub quota: QuotaConf,
}

/// `[redis]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConf {
    /// One server's URL, or a cluster's seed nodes.
    pub urls: Vec<String>,
    /// Whether `urls` are the seed nodes of a Redis Cluster.
    #[serde(default)]
    pub cluster: bool,
    /// Environment variable holding the Redis password (optional).
    pub password_env: Option<String>,
    /// Add `E` and `d` to `notify-keyspace-events` on each primary
    /// (`CONFIG SET`); turn off where CONFIG is not allowed and set it yourself.
    #[serde(default = "yes")]
    pub set_notify_config: bool,
    /// How often the cluster topology is read again (ms).
    #[serde(default = "default_topology_ms")]
    pub topology_refresh_ms: u64,
    /// `SCAN ... COUNT` of the reconciliation.
    #[serde(default = "default_scan_count")]
    pub scan_count: u64,
    /// Timeout of a connection attempt and of one command (ms).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

/// `[keys]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeysConf {
    /// The audit trail's stream.
    pub audit_stream: String,
    /// Approximate cap of the audit stream (`XADD MAXLEN ~`).
    pub audit_maxlen: u64,
    /// Prefix of the trip records and delivery markers.
    pub state_prefix: String,
    /// The stream the gateway appends quota usage to (see README).
    pub quota_stream: String,
    /// The consumer group rlctl reads the quota stream with.
    pub quota_group: String,
}

impl Default for KeysConf {
    fn default() -> Self {
        KeysConf {
            audit_stream: "rlctl:audit".into(),
            audit_maxlen: 100_000,
            state_prefix: "rlctl:".into(),
            quota_stream: "rl:events:quota".into(),
            quota_group: "rlctl".into(),
        }
    }
}

/// `[delivery]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeliveryConf {
    /// Capacity of each destination's queue (and of the observation queue).
    pub queue: usize,
    /// Sends started per second, per destination.
    pub rate_per_second: u32,
    /// Sends in flight at once, per destination.
    pub concurrency: usize,
    /// Attempts per delivery, the first included.
    pub attempts: u32,
    /// Delay before the first retry (ms); doubled each retry.
    pub backoff_ms: u64,
    /// Longest delay between retries (ms).
    pub backoff_max_ms: u64,
    /// Timeout of one HTTP request or SMTP session (ms).
    pub timeout_ms: u64,
}

impl Default for DeliveryConf {
    fn default() -> Self {
        DeliveryConf {
            queue: 1000,
            rate_per_second: 20,
            concurrency: 4,
            attempts: 5,
            backoff_ms: 500,
            backoff_max_ms: 30_000,
            timeout_ms: 5000,
        }
    }
}

/// `[identity]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IdentityConf {
    /// Key name patterns with `<tenant>` and optionally `<key_id>`, tried in order.
    pub key_patterns: Vec<String>,
}

impl Default for IdentityConf {
    fn default() -> Self {
        IdentityConf {
            key_patterns: vec![
                "rl:{t:<tenant>}:key:<key_id>".into(),
                "rl:{t:<tenant>}:tenant".into(),
            ],
        }
    }
}

/// `[tenants.<id>]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    /// Display name (defaults to the id).
    pub name: Option<String>,
    /// The tier (a key of `[tiers]`).
    pub tier: String,
    /// Technical contacts (email addresses).
    #[serde(default)]
    pub contacts: Vec<String>,
    /// The tenant's webhook URL.
    pub webhook_url: Option<String>,
    /// Environment variable holding the tenant's webhook signing secret.
    pub webhook_secret_env: Option<String>,
    /// The account owner, named in Enterprise pages.
    pub account_owner: Option<String>,
}

/// `[tiers.<name>]`: which destinations each level goes to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// Destinations of a level-1 box (none by default: a soft cool-off).
    #[serde(default)]
    pub level1: Vec<Dest>,
    /// Destinations of a level-2 box.
    #[serde(default = "default_level2")]
    pub level2: Vec<Dest>,
    /// Destinations of a level-3 box.
    #[serde(default = "default_level3")]
    pub level3: Vec<Dest>,
    /// The Enterprise rule: a level-3 page also goes to the account owner,
    /// and says that nothing is suspended automatically.
    #[serde(default)]
    pub human_review: bool,
    /// Destinations of a quota threshold alert.
    #[serde(default = "default_quota_dests")]
    pub quota: Vec<Dest>,
}

/// `[internal]`: a signed webhook.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConf {
    /// Where to POST.
    pub webhook_url: String,
    /// Environment variable holding the signing secret.
    pub secret_env: String,
}

/// `[pager]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PagerConf {
    /// Events API v2 endpoint (`https://events.pagerduty.com/v2/enqueue`).
    pub url: String,
    /// Environment variable holding on-call's routing key.
    pub routing_key_env: String,
    /// Environment variable holding the account owners' routing key
    /// (needed when a tier has `human_review`).
    pub account_owner_routing_key_env: Option<String>,
}

/// TLS of the SMTP connection.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SmtpTls {
    /// Plain SMTP (a local relay only).
    None,
    /// STARTTLS, required.
    Starttls,
    /// TLS from the first byte (SMTPS).
    Tls,
}

/// `[email]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConf {
    /// SMTP server host.
    pub smtp_host: String,
    /// SMTP server port.
    #[serde(default = "default_smtp_port")]
    pub smtp_port: u16,
    /// `none`, `starttls` or `tls`.
    #[serde(default = "default_tls")]
    pub tls: SmtpTls,
    /// The From header (`Name <address>`).
    pub from: String,
    /// Environment variable holding the SMTP user name (optional).
    pub username_env: Option<String>,
    /// Environment variable holding the SMTP password (with `username_env`).
    pub password_env: Option<String>,
}

/// `[templates]`: `{placeholder}` texts (see README for the placeholders).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Templates {
    /// Subject of a box email.
    pub box_subject: String,
    /// Body of a box email.
    pub box_body: String,
    /// Summary of a page.
    pub page_summary: String,
    /// Subject of a quota email.
    pub quota_subject: String,
    /// Body of a quota email.
    pub quota_body: String,
    /// Link to the client backoff guidelines, in every box alert.
    pub guidelines_url: String,
}

impl Default for Templates {
    fn default() -> Self {
        Templates {
            box_subject: "[rl] API key {key_id} of {tenant_name} is blocked (level {level})".into(),
            box_body:
                "API key {key_id} of {tenant_name} was put in the penalty box at level {level} \
                       after repeated requests before their Retry-After.\n\
                       Time left: {time_left}. Offenses in the last 24 h: {offenses}.\n\
                       Please make your client wait for Retry-After: {guidelines_url}\n"
                    .into(),
            page_summary: "rl level-{level} box on {key} (tenant {tenant}, tier {tier})".into(),
            quota_subject: "[rl] {tenant_name} has used {threshold}% of its {quota} quota".into(),
            quota_body:
                "{tenant_name} has used {used} of {limit} ({threshold}%) of its {quota} quota \
                         for {period}.\n"
                    .into(),
            guidelines_url: "https://example.com/docs/backoff".into(),
        }
    }
}

/// `[quota]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaConf {
    /// Whether `rlctl watch` reads the quota stream.
    pub enabled: bool,
    /// Percentages of the quota that alert, each once per period.
    pub thresholds: Vec<u32>,
}

impl Default for QuotaConf {
    fn default() -> Self {
        QuotaConf {
            enabled: true,
            thresholds: vec![80, 90, 100],
        }
    }
}

fn yes() -> bool {
    true
}
fn default_topology_ms() -> u64 {
    1000
}
fn default_scan_count() -> u64 {
    1000
}
fn default_timeout_ms() -> u64 {
    2000
}
fn default_smtp_port() -> u16 {
    587
}
fn default_tls() -> SmtpTls {
    SmtpTls::Starttls
}
fn default_level2() -> Vec<Dest> {
    vec![Dest::TenantWebhook, Dest::Email, Dest::Internal]
}
fn default_level3() -> Vec<Dest> {
    vec![Dest::Page, Dest::Internal]
}
fn default_quota_dests() -> Vec<Dest> {
    vec![Dest::TenantWebhook, Dest::Email]
}

/// The tier of keys whose owner is unknown.
pub const UNOWNED_TIER: &str = "unowned";

/// Placeholders a box template may use.
pub const BOX_PLACEHOLDERS: &[&str] = &[
    "key",
    "key_id",
    "tenant",
    "tenant_name",
    "tier",
    "level",
    "time_left",
    "ttl_ms",
    "offenses",
    "guidelines_url",
    "trip_id",
];
/// Placeholders a quota template may use.
pub const QUOTA_PLACEHOLDERS: &[&str] = &[
    "tenant",
    "tenant_name",
    "tier",
    "quota",
    "used",
    "limit",
    "threshold",
    "period",
];

impl Config {
    /// Reads, parses and validates the file.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses and validates a configuration text.
    pub fn parse(text: &str) -> Result<Config, String> {
        let mut conf: Config = toml::from_str(text).map_err(|e| e.to_string())?;
        // The default unowned tier uses the internal destinations configured.
        let internal: Vec<Dest> = conf.internal.iter().map(|_| Dest::Internal).collect();
        let page: Vec<Dest> = conf
            .pager
            .iter()
            .map(|_| Dest::Page)
            .chain(internal.clone())
            .collect();
        conf.tiers
            .entry(UNOWNED_TIER.into())
            .or_insert_with(|| Tier {
                level1: vec![],
                level2: internal,
                level3: page,
                human_review: false,
                quota: vec![],
            });
        conf.validate()?;
        Ok(conf)
    }

    fn validate(&self) -> Result<(), String> {
        if self.redis.urls.is_empty() {
            return Err("redis.urls: give at least one URL".into());
        }
        for (i, url) in self.redis.urls.iter().enumerate() {
            redis::parse_redis_url(url)
                .ok_or_else(|| format!("redis.urls[{i}]: not a redis:// URL: {url:?}"))?;
        }
        if !self.redis.cluster && self.redis.urls.len() > 1 {
            return Err(
                "redis.urls: several URLs need `cluster = true` (one server has one URL)".into(),
            );
        }
        positive("redis.topology_refresh_ms", self.redis.topology_refresh_ms)?;
        positive("redis.scan_count", self.redis.scan_count)?;
        positive("redis.timeout_ms", self.redis.timeout_ms)?;
        positive("keys.audit_maxlen", self.keys.audit_maxlen)?;
        for (field, v) in [
            ("keys.audit_stream", &self.keys.audit_stream),
            ("keys.state_prefix", &self.keys.state_prefix),
            ("keys.quota_stream", &self.keys.quota_stream),
            ("keys.quota_group", &self.keys.quota_group),
        ] {
            if v.is_empty() {
                return Err(format!("{field}: must not be empty"));
            }
        }
        let d = &self.delivery;
        positive("delivery.queue", d.queue as u64)?;
        positive("delivery.rate_per_second", u64::from(d.rate_per_second))?;
        positive("delivery.concurrency", d.concurrency as u64)?;
        positive("delivery.attempts", u64::from(d.attempts))?;
        positive("delivery.timeout_ms", d.timeout_ms)?;
        if d.backoff_max_ms < d.backoff_ms {
            return Err("delivery.backoff_max_ms: below delivery.backoff_ms".into());
        }
        for (i, p) in self.identity.key_patterns.iter().enumerate() {
            crate::owner::KeyPattern::parse(p)
                .map_err(|e| format!("identity.key_patterns[{i}]: {e}"))?;
        }
        for (name, tier) in &self.tiers {
            self.validate_tier(name, tier)?;
        }
        for (id, t) in &self.tenants {
            let f = |field: &str| format!("tenants.{id}.{field}");
            let tier = self
                .tiers
                .get(&t.tier)
                .ok_or_else(|| format!("{}: unknown tier {:?}", f("tier"), t.tier))?;
            let all: Vec<Dest> = [&tier.level1, &tier.level2, &tier.level3, &tier.quota]
                .into_iter()
                .flatten()
                .copied()
                .collect();
            if all.contains(&Dest::TenantWebhook)
                && (t.webhook_url.is_none() || t.webhook_secret_env.is_none())
            {
                return Err(format!(
                    "{}: tier {:?} sends to tenant_webhook: give webhook_url and webhook_secret_env",
                    f("webhook_url"),
                    t.tier
                ));
            }
            if let Some(url) = &t.webhook_url {
                http_url(&f("webhook_url"), url)?;
            }
            if all.contains(&Dest::Email) && t.contacts.is_empty() {
                return Err(format!(
                    "{}: tier {:?} sends email: give at least one address",
                    f("contacts"),
                    t.tier
                ));
            }
            for (i, c) in t.contacts.iter().enumerate() {
                c.parse::<lettre::Address>()
                    .map_err(|e| format!("{}[{i}]: {c:?}: {e}", f("contacts")))?;
            }
            if tier.human_review && t.account_owner.is_none() {
                return Err(format!(
                    "{}: tier {:?} has human_review: name the account owner",
                    f("account_owner"),
                    t.tier
                ));
            }
        }
        if let Some(w) = &self.internal {
            http_url("internal.webhook_url", &w.webhook_url)?;
        }
        if let Some(p) = &self.pager {
            http_url("pager.url", &p.url)?;
        }
        if let Some(e) = &self.email {
            e.from
                .parse::<lettre::message::Mailbox>()
                .map_err(|err| format!("email.from: {:?}: {err}", e.from))?;
            if e.username_env.is_some() != e.password_env.is_some() {
                return Err(
                    "email.password_env: give both username_env and password_env, or neither"
                        .into(),
                );
            }
        }
        let t = &self.templates;
        for (field, text) in [
            ("templates.box_subject", &t.box_subject),
            ("templates.box_body", &t.box_body),
            ("templates.page_summary", &t.page_summary),
        ] {
            crate::alert::check_template(text, BOX_PLACEHOLDERS)
                .map_err(|e| format!("{field}: {e}"))?;
        }
        for (field, text) in [
            ("templates.quota_subject", &t.quota_subject),
            ("templates.quota_body", &t.quota_body),
        ] {
            crate::alert::check_template(text, QUOTA_PLACEHOLDERS)
                .map_err(|e| format!("{field}: {e}"))?;
        }
        for (i, th) in self.quota.thresholds.iter().enumerate() {
            if *th == 0 || *th > 100 {
                return Err(format!(
                    "quota.thresholds[{i}]: a percentage from 1 to 100, got {th}"
                ));
            }
        }
        Ok(())
    }

    fn validate_tier(&self, name: &str, tier: &Tier) -> Result<(), String> {
        for (level, dests) in [
            ("level1", &tier.level1),
            ("level2", &tier.level2),
            ("level3", &tier.level3),
            ("quota", &tier.quota),
        ] {
            let field = format!("tiers.{name}.{level}");
            for d in dests {
                let missing = match d {
                    Dest::Internal if self.internal.is_none() => Some("[internal]"),
                    Dest::Page if self.pager.is_none() => Some("[pager]"),
                    Dest::Email if self.email.is_none() => Some("[email]"),
                    Dest::PageAccountOwner => {
                        return Err(format!(
                            "{field}: page_account_owner is added by human_review, do not list it"
                        ))
                    }
                    _ => None,
                };
                if let Some(section) = missing {
                    return Err(format!("{field}: {:?} needs a {section} section", d.name()));
                }
                if name == UNOWNED_TIER && d.needs_tenant() {
                    return Err(format!(
                        "{field}: {:?} needs a tenant; the unowned tier has none",
                        d.name()
                    ));
                }
            }
        }
        if tier.human_review {
            let field = format!("tiers.{name}.human_review");
            if !tier.level3.contains(&Dest::Page) {
                return Err(format!("{field}: needs \"page\" in tiers.{name}.level3"));
            }
            if self
                .pager
                .as_ref()
                .and_then(|p| p.account_owner_routing_key_env.as_ref())
                .is_none()
            {
                return Err(format!(
                    "{field}: needs pager.account_owner_routing_key_env"
                ));
            }
        }
        Ok(())
    }
}

fn positive(field: &str, v: u64) -> Result<(), String> {
    if v == 0 {
        return Err(format!("{field}: must be greater than 0"));
    }
    Ok(())
}

fn http_url(field: &str, url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{field}: {url:?}: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{field}: {url:?}: not an http(s) URL"));
    }
    Ok(())
}

/// Secrets read from the environment, by the variable names of the file.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    /// Redis password.
    pub redis_password: Option<String>,
    /// Tenant webhook secrets by tenant id.
    pub tenant_webhook: BTreeMap<String, String>,
    /// Internal webhook secret.
    pub internal: Option<String>,
    /// On-call routing key.
    pub pager_routing_key: Option<String>,
    /// Account owners' routing key.
    pub pager_account_owner_routing_key: Option<String>,
    /// SMTP user name and password.
    pub smtp_credentials: Option<(String, String)>,
}

fn env_var(field: &str, name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{field}: environment variable {name} is not set"))
}

impl Secrets {
    /// Reads the Redis password only (what the operator commands need).
    pub fn redis_only(conf: &Config) -> Result<Secrets, String> {
        let redis_password = conf
            .redis
            .password_env
            .as_ref()
            .map(|n| env_var("redis.password_env", n))
            .transpose()?;
        Ok(Secrets {
            redis_password,
            ..Secrets::default()
        })
    }

    /// Reads every secret the file names; a missing variable is an error
    /// naming its field.
    pub fn from_env(conf: &Config) -> Result<Secrets, String> {
        let mut s = Secrets::redis_only(conf)?;
        for (id, t) in &conf.tenants {
            if let Some(name) = &t.webhook_secret_env {
                s.tenant_webhook.insert(
                    id.clone(),
                    env_var(&format!("tenants.{id}.webhook_secret_env"), name)?,
                );
            }
        }
        if let Some(w) = &conf.internal {
            s.internal = Some(env_var("internal.secret_env", &w.secret_env)?);
        }
        if let Some(p) = &conf.pager {
            s.pager_routing_key = Some(env_var("pager.routing_key_env", &p.routing_key_env)?);
            if let Some(n) = &p.account_owner_routing_key_env {
                s.pager_account_owner_routing_key =
                    Some(env_var("pager.account_owner_routing_key_env", n)?);
            }
        }
        if let Some(e) = &conf.email {
            if let (Some(u), Some(p)) = (&e.username_env, &e.password_env) {
                s.smtp_credentials = Some((
                    env_var("email.username_env", u)?,
                    env_var("email.password_env", p)?,
                ));
            }
        }
        Ok(s)
    }
}
