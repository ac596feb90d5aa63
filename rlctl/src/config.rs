//! The TOML configuration: destinations, tiers, tenants, templates.
//!
//! `Config::load` parses and validates; every error names the field at
//! fault (`tiers.growth.level2: ...`). Secrets are never in the file: the
//! file names environment variables (`*_env` fields) and `secrets::Secrets`
//! reads them (only `rlctl watch` needs them).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// A destination an alert can go to (the names used in `tiers.*.level2` etc.).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, Deserialize, PartialOrd, Ord,
)]
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
    pub(crate) fn needs_tenant(self) -> bool {
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
    /// Multi-region quota sync (`rlctl regions sync`); `[redis]` is the
    /// local region.
    pub regions: Option<crate::regions::config::RegionsConf>,
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
    /// How long a delivery is retried (ms from its first attempt); past
    /// it, the delivery is given up (`expired`) and that is alerted.
    pub retry_for_ms: u64,
    /// Delay before the first retry (ms); doubled each retry.
    pub backoff_ms: u64,
    /// Longest delay between retries (ms).
    pub backoff_max_ms: u64,
    /// Timeout of one HTTP request or SMTP session (ms).
    pub timeout_ms: u64,
    /// Read from older configurations and not used: a delivery is now
    /// retried for `retry_for_ms`, however many attempts that takes
    /// (`Config::load` says so on stderr).
    pub attempts: Option<u32>,
}

impl Default for DeliveryConf {
    fn default() -> Self {
        DeliveryConf {
            queue: 1000,
            rate_per_second: 20,
            concurrency: 4,
            retry_for_ms: 86_400_000,
            backoff_ms: 500,
            backoff_max_ms: 300_000,
            timeout_ms: 5000,
            attempts: None,
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
            box_subject: "[rl] {subject} is blocked (level {level})".into(),
            box_body: "{subject} was put in the penalty box at level {level} \
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
    "subject",
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
        let conf = Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if conf.delivery.attempts.is_some() {
            eprintln!(
                "rlctl: {}: delivery.attempts is no longer used: a delivery is retried for \
                 delivery.retry_for_ms (default 24 h); remove the line",
                path.display()
            );
        }
        Ok(conf)
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
}

#[cfg(test)]
mod tests {
    use super::Config;

    #[test]
    fn a_configuration_of_an_older_release_still_loads() {
        let redis = "[redis]\nurls = [\"redis://127.0.0.1:6379\"]\n";
        let old = format!("{redis}[delivery]\nattempts = 5\nbackoff_ms = 100\n");
        let conf = Config::parse(&old).expect("an older [delivery] loads");
        assert_eq!(conf.delivery.attempts, Some(5));
        assert_eq!(conf.delivery.retry_for_ms, 86_400_000);
        let typo = format!("{redis}[delivery]\nattemps = 5\n");
        assert!(
            Config::parse(&typo).is_err(),
            "an unknown field is still refused"
        );
    }
}
