//! Who owns a boxed key: the tenant and API key id read from the key name
//! (the gateway names keys `rl:{t:<tenant>}:key:<key_id>`), then the
//! tenant's tier and contacts from the configuration.

use crate::config::{Config, Tenant, UNOWNED_TIER};

/// A key name pattern: literal text with a `<tenant>` and optionally a
/// `<key_id>` placeholder, each matching one or more characters other
/// than the literal that follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPattern {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Tenant,
    KeyId,
}

impl KeyPattern {
    /// Parses `rl:{t:<tenant>}:key:<key_id>`.
    pub fn parse(pattern: &str) -> Result<KeyPattern, String> {
        let mut parts = Vec::new();
        let mut rest = pattern;
        while !rest.is_empty() {
            match rest.find('<') {
                Some(0) => {
                    let end = rest.find('>').ok_or("a `<` without its `>`")?;
                    let part = match &rest[1..end] {
                        "tenant" => Part::Tenant,
                        "key_id" => Part::KeyId,
                        other => {
                            return Err(format!(
                                "unknown placeholder <{other}> (use <tenant> and <key_id>)"
                            ))
                        }
                    };
                    if parts.contains(&part) {
                        return Err(format!("placeholder <{}> given twice", &rest[1..end]));
                    }
                    if matches!(parts.last(), Some(Part::Tenant | Part::KeyId)) {
                        return Err("two placeholders need literal text between them".into());
                    }
                    parts.push(part);
                    rest = &rest[end + 1..];
                }
                Some(i) => {
                    parts.push(Part::Literal(rest[..i].to_string()));
                    rest = &rest[i..];
                }
                None => {
                    parts.push(Part::Literal(rest.to_string()));
                    rest = "";
                }
            }
        }
        if !parts.contains(&Part::Tenant) {
            return Err("no <tenant> placeholder".into());
        }
        Ok(KeyPattern { parts })
    }

    /// `(tenant, key_id)` when `key` matches.
    pub fn matches(&self, key: &str) -> Option<(String, Option<String>)> {
        let mut rest = key;
        let (mut tenant, mut key_id) = (None, None);
        for (i, part) in self.parts.iter().enumerate() {
            match part {
                Part::Literal(lit) => rest = rest.strip_prefix(lit.as_str())?,
                Part::Tenant | Part::KeyId => {
                    let value = match self.parts.get(i + 1) {
                        Some(Part::Literal(next)) => &rest[..rest.find(next.as_str())?],
                        _ => rest,
                    };
                    if value.is_empty() {
                        return None;
                    }
                    rest = &rest[value.len()..];
                    if *part == Part::Tenant {
                        tenant = Some(value.to_string());
                    } else {
                        key_id = Some(value.to_string());
                    }
                }
            }
        }
        if !rest.is_empty() {
            return None;
        }
        Some((tenant?, key_id))
    }
}

/// The owner of a key, as alerts need it.
#[derive(Debug, Clone)]
pub struct Owner {
    /// Tenant id, when the key names a tenant.
    pub tenant_id: Option<String>,
    /// The tenant's configuration, when the tenant is known.
    pub tenant: Option<Tenant>,
    /// The API key id, when the key names one.
    pub key_id: Option<String>,
    /// The tier whose rules apply (`unowned` for unknown owners).
    pub tier: String,
}

impl Owner {
    /// Display name of the tenant (its id, or `unknown`).
    pub fn tenant_name(&self) -> String {
        match (&self.tenant, &self.tenant_id) {
            (Some(Tenant { name: Some(n), .. }), _) => n.clone(),
            (_, Some(id)) => id.clone(),
            _ => "unknown".into(),
        }
    }
}

/// Looks `key` up: the first matching pattern names the tenant; a tenant
/// missing from `[tenants]` makes the key unowned (its id is still shown).
pub fn lookup(conf: &Config, key: &str) -> Owner {
    for pattern in &conf.identity.key_patterns {
        let Ok(p) = KeyPattern::parse(pattern) else {
            continue;
        };
        if let Some((tenant_id, key_id)) = p.matches(key) {
            return Owner {
                key_id,
                ..of_tenant(conf, &tenant_id)
            };
        }
    }
    Owner {
        tenant_id: None,
        tenant: None,
        key_id: None,
        tier: UNOWNED_TIER.into(),
    }
}

/// The owner of a tenant's own alerts (quota alerts): its configuration
/// when known, else unowned (its id still shown).
pub fn of_tenant(conf: &Config, tenant_id: &str) -> Owner {
    let tenant = conf.tenants.get(tenant_id).cloned();
    let tier = tenant
        .as_ref()
        .map_or(UNOWNED_TIER.to_string(), |t| t.tier.clone());
    Owner {
        tenant_id: Some(tenant_id.to_string()),
        tenant,
        key_id: None,
        tier,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_the_gateway_key_names() {
        let p = KeyPattern::parse("rl:{t:<tenant>}:key:<key_id>").unwrap();
        assert_eq!(
            p.matches("rl:{t:t-200}:key:k-2"),
            Some(("t-200".into(), Some("k-2".into())))
        );
        assert_eq!(p.matches("rl:{t:t-200}:tenant"), None);
        assert_eq!(p.matches("rl:{ip:1.2.3.4}:login"), None);
        assert_eq!(p.matches("rl:{t:}:key:k"), None);
        let t = KeyPattern::parse("rl:{t:<tenant>}:tenant").unwrap();
        assert_eq!(t.matches("rl:{t:9}:tenant"), Some(("9".into(), None)));
        assert_eq!(t.matches("rl:{t:9}:tenantx"), None);
        // A rule policy's key (the ledger example's tier rule).
        let r = KeyPattern::parse("ledger:{tenant:<tenant>}:tier-key:key_id=<key_id>").unwrap();
        assert_eq!(
            r.matches("ledger:{tenant:t-42}:tier-key:key_id=k-7"),
            Some(("t-42".into(), Some("k-7".into())))
        );
        assert!(KeyPattern::parse("rl:<key_id>").is_err());
        assert!(KeyPattern::parse("rl:<tenant><key_id>").is_err());
        assert!(KeyPattern::parse("rl:<who>").is_err());
        assert!(KeyPattern::parse("rl:<tenant").is_err());
    }
}
