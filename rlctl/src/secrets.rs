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

    /// Reads every secret the file names; the missing variables are one
    /// error naming each one's field.
    pub fn from_env(conf: &Config) -> Result<Secrets, String> {
        let mut missing = Vec::new();
        let mut read = |field: &str, name: &str| match env_var(field, name) {
            Ok(v) => Some(v),
            Err(e) => {
                missing.push(e);
                None
            }
        };
        let mut s = Secrets {
            redis_password: conf
                .redis
                .password_env
                .as_ref()
                .and_then(|n| read("redis.password_env", n)),
            ..Secrets::default()
        };
        for (id, t) in &conf.tenants {
            if let Some(name) = &t.webhook_secret_env {
                if let Some(v) = read(&format!("tenants.{id}.webhook_secret_env"), name) {
                    s.tenant_webhook.insert(id.clone(), v);
                }
            }
        }
        if let Some(w) = &conf.internal {
            s.internal = read("internal.secret_env", &w.secret_env);
        }
        if let Some(p) = &conf.pager {
            s.pager_routing_key = read("pager.routing_key_env", &p.routing_key_env);
            if let Some(n) = &p.account_owner_routing_key_env {
                s.pager_account_owner_routing_key = read("pager.account_owner_routing_key_env", n);
            }
        }
        if let Some(e) = &conf.email {
            if let (Some(u), Some(p)) = (&e.username_env, &e.password_env) {
                let user = read("email.username_env", u);
                let password = read("email.password_env", p);
                s.smtp_credentials = user.zip(password);
            }
        }
        if missing.is_empty() {
            Ok(s)
        } else {
            Err(missing.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Secrets;
    use crate::config::Config;

    #[test]
    fn every_missing_variable_is_named_at_once() {
        let conf = Config::parse(
            "[redis]\nurls = [\"redis://127.0.0.1:6379\"]\n\
             [internal]\nwebhook_url = \"https://hooks.example/rl\"\n\
             secret_env = \"RLCTL_TEST_UNSET_INTERNAL\"\n\
             [pager]\nurl = \"https://events.example/v2/enqueue\"\n\
             routing_key_env = \"RLCTL_TEST_UNSET_PAGER\"\n",
        )
        .expect("the configuration loads");
        let err = Secrets::from_env(&conf).expect_err("two variables are unset");
        assert_eq!(
            err,
            "internal.secret_env: environment variable RLCTL_TEST_UNSET_INTERNAL is not set; \
             pager.routing_key_env: environment variable RLCTL_TEST_UNSET_PAGER is not set"
        );
    }
}
