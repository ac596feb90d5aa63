//! `[regions]`: the regions of a multi-region deployment, as seen by the
//! sync worker of one of them (`[redis]` is the local region).

use crate::config::RedisConf;
use crate::validate::{positive, validate_redis};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The most regions a deployment may have (the module's limit).
pub const MAX_REGIONS: usize = 16;

/// `[regions]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegionsConf {
    /// This region's name: the module's `rl.region` on the local servers.
    pub local: String,
    /// The stream each region's changes are appended to (in that region).
    #[serde(default = "default_stream")]
    pub stream: String,
    /// Approximate cap of the local stream (`XADD MAXLEN ~`): the changes
    /// a partition may accumulate before the oldest are dropped.
    #[serde(default = "default_maxlen")]
    pub stream_maxlen: u64,
    /// Entries read from a remote stream at once (`XREADGROUP COUNT`).
    #[serde(default = "default_batch")]
    pub read_count: u64,
    /// Changed keys read and appended to the local stream at once.
    #[serde(default = "default_batch")]
    pub publish_batch: u64,
    /// How long one `XREADGROUP` waits for new entries (ms); below every
    /// remote's `timeout_ms`.
    #[serde(default = "default_block_ms")]
    pub block_ms: u64,
    /// Delay before a failed read, apply or append is tried again (ms).
    #[serde(default = "default_retry_ms")]
    pub retry_ms: u64,
    /// Every other region: its Redis, with the fields of `[redis]`.
    pub remote: BTreeMap<String, RedisConf>,
}

fn default_stream() -> String {
    "rl:region:changes".into()
}
fn default_maxlen() -> u64 {
    1_000_000
}
fn default_batch() -> u64 {
    500
}
fn default_block_ms() -> u64 {
    1000
}
fn default_retry_ms() -> u64 {
    1000
}

/// Whether `name` is a legal region name: 1..32 bytes of `[A-Za-z0-9_-]`.
pub fn legal_region_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl RegionsConf {
    /// Checks every field; errors name it.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if !legal_region_name(&self.local) {
            return Err(format!(
                "regions.local: {:?}: a region name is 1 to 32 of A-Z a-z 0-9 _ -",
                self.local
            ));
        }
        if self.stream.is_empty() {
            return Err("regions.stream: must not be empty".into());
        }
        positive("regions.stream_maxlen", self.stream_maxlen)?;
        positive("regions.read_count", self.read_count)?;
        positive("regions.publish_batch", self.publish_batch)?;
        positive("regions.block_ms", self.block_ms)?;
        positive("regions.retry_ms", self.retry_ms)?;
        if self.remote.is_empty() {
            return Err("regions.remote: name at least one other region".into());
        }
        if self.remote.len() + 1 > MAX_REGIONS {
            return Err(format!(
                "regions.remote: at most {MAX_REGIONS} regions in all"
            ));
        }
        for (name, r) in &self.remote {
            let section = format!("regions.remote.{name}");
            if !legal_region_name(name) {
                return Err(format!(
                    "{section}: a region name is 1 to 32 of A-Z a-z 0-9 _ -"
                ));
            }
            if *name == self.local {
                return Err(format!("{section}: the local region is [redis]"));
            }
            validate_redis(&section, r)?;
            if self.block_ms >= r.timeout_ms {
                return Err(format!(
                    "regions.block_ms: must be below {section}.timeout_ms ({})",
                    r.timeout_ms
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = "[redis]\nurls = [\"redis://127.0.0.1:6379\"]\n";

    fn parse(regions: &str) -> Result<Config, String> {
        Config::parse(&format!("{BASE}{regions}"))
    }

    #[test]
    fn a_regions_section_loads_with_its_defaults() {
        let conf = parse(
            "[regions]\nlocal = \"eu\"\n[regions.remote.us]\nurls = [\"redis://10.0.0.2:6379\"]\n\
             [regions.remote.ap]\nurls = [\"redis://10.0.1.1:7000\", \"redis://10.0.1.2:7000\"]\ncluster = true\n",
        )
        .expect("loads");
        let r = conf.regions.expect("regions");
        assert_eq!(r.local, "eu");
        assert_eq!(r.remote.keys().collect::<Vec<_>>(), ["ap", "us"]);
        assert_eq!(r.stream, "rl:region:changes");
        assert_eq!(r.stream_maxlen, 1_000_000);
        assert!(r.remote["ap"].cluster);
    }

    #[test]
    fn bad_regions_name_their_field() {
        let us = "[regions.remote.us]\nurls = [\"redis://10.0.0.2:6379\"]\n";
        for (text, field) in [
            (format!("[regions]\nlocal = \"e u\"\n{us}"), "regions.local"),
            (
                "[regions]\nlocal = \"eu\"\nremote = {}\n".to_string(),
                "regions.remote",
            ),
            (
                "[regions]\nlocal = \"eu\"\n[regions.remote.eu]\nurls = [\"redis://h:1\"]\n"
                    .to_string(),
                "regions.remote.eu",
            ),
            (
                "[regions]\nlocal = \"eu\"\n[regions.remote.us]\nurls = []\n".to_string(),
                "regions.remote.us.urls",
            ),
            (
                format!("[regions]\nlocal = \"eu\"\nblock_ms = 5000\n{us}"),
                "regions.block_ms",
            ),
            (
                format!("[regions]\nlocal = \"eu\"\nread_count = 0\n{us}"),
                "regions.read_count",
            ),
            (format!("[regions]\nlocal = \"eu\"\nlocl = 1\n{us}"), "locl"),
        ] {
            let e = parse(&text).expect_err(&text);
            assert!(e.contains(field), "{text}: {e}");
        }
    }

    #[test]
    fn region_names_follow_the_module_alphabet() {
        use super::legal_region_name;
        assert!(legal_region_name("eu-west_1"));
        assert!(!legal_region_name(""));
        assert!(!legal_region_name(&"a".repeat(33)));
        assert!(!legal_region_name("eu,us"));
    }
}
