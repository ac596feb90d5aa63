//! Validation of a parsed configuration: every error names its field.

use crate::config::{
    Config, Dest, RedisConf, Tier, BOX_PLACEHOLDERS, QUOTA_PLACEHOLDERS, UNOWNED_TIER,
};

impl Config {
    /// Checks every field and the consistency between sections.
    pub(crate) fn validate(&self) -> Result<(), String> {
        validate_redis("redis", &self.redis)?;
        if let Some(r) = &self.regions {
            r.validate()?;
        }
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
        positive("delivery.retry_for_ms", d.retry_for_ms)?;
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

/// Checks a Redis section (`[redis]`, `[regions.remote.<name>]`); errors
/// name the field under `section`.
pub(crate) fn validate_redis(section: &str, r: &RedisConf) -> Result<(), String> {
    if r.urls.is_empty() {
        return Err(format!("{section}.urls: give at least one URL"));
    }
    for (i, url) in r.urls.iter().enumerate() {
        let parsed = redis::parse_redis_url(url)
            .ok_or_else(|| format!("{section}.urls[{i}]: not a redis:// URL: {url:?}"))?;
        if parsed.scheme() != "redis" {
            return Err(format!(
                "{section}.urls[{i}]: {url:?}: only redis:// (this build has no TLS to Redis)"
            ));
        }
    }
    if !r.cluster && r.urls.len() > 1 {
        return Err(format!(
            "{section}.urls: several URLs need `cluster = true` (one server has one URL)"
        ));
    }
    positive(
        &format!("{section}.topology_refresh_ms"),
        r.topology_refresh_ms,
    )?;
    positive(&format!("{section}.scan_count"), r.scan_count)?;
    positive(&format!("{section}.timeout_ms"), r.timeout_ms)
}

pub(crate) fn positive(field: &str, v: u64) -> Result<(), String> {
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
