//! Secrets: read from the environment variables the configuration names
//! (`*_env` fields), never from the file.

use crate::config::Config;
use std::collections::BTreeMap;

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
