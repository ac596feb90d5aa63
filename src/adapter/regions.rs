//! The module configs `rl.region` (this server's region; empty: regions
//! are off) and `rl.regions` (every region, comma-separated), declared to
//! the server as module string configs (load arguments `region <name>`,
//! `regions <list>`, `CONFIG GET`/`CONFIG SET`). A value is checked when
//! set; whether the region is one of the list is checked by each call
//! that needs both ([`local`], [`current`]), as the two are set one at a
//! time.

use std::sync::Mutex;

use arrayvec::ArrayVec;
use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{RedisError, RedisString};

use crate::adapter::errors::ArgError;
use crate::core::region::{parse_region_list, RegionListError, RegionName, MAX_REGIONS};

/// The config `rl.region`: this server's region, if any.
pub struct LocalRegion;

/// The config `rl.regions`: every region.
pub struct AllRegions;

/// `rl.region`, as registered.
pub static LOCAL: LocalRegion = LocalRegion;

/// `rl.regions`, as registered.
pub static ALL: AllRegions = AllRegions;

/// Both configs' values, in one place so that a call reads them with one
/// lock (commands and config changes run on the server's main thread).
struct Config {
    local: Option<RegionName>,
    all: ArrayVec<RegionName, MAX_REGIONS>,
}

static CONFIG: Mutex<Config> = Mutex::new(Config {
    local: None,
    all: ArrayVec::new_const(),
});

/// The regions as a call sees them: its own, and every one.
#[derive(Clone, Debug)]
pub struct Regions {
    /// This server's region (one of `all`).
    pub local: RegionName,
    /// Every region, `local` included.
    pub all: ArrayVec<RegionName, MAX_REGIONS>,
}

/// This server's region, when regions are on and it is one of
/// `rl.regions`.
pub fn local() -> Result<RegionName, ArgError> {
    let config = CONFIG.lock().map_err(|_| ArgError::RegionsOff)?;
    checked_local(&config)
}

/// The regions, when they are on (see [`local`]).
pub fn current() -> Result<Regions, ArgError> {
    let config = CONFIG.lock().map_err(|_| ArgError::RegionsOff)?;
    let local = checked_local(&config)?;
    Ok(Regions {
        local,
        all: config.all.clone(),
    })
}

fn checked_local(config: &Config) -> Result<RegionName, ArgError> {
    let local = config.local.ok_or(ArgError::RegionsOff)?;
    if config.all.contains(&local) {
        Ok(local)
    } else {
        Err(ArgError::LocalNotListed {
            name: local.as_str().to_string(),
        })
    }
}

fn refused(text: &'static str) -> RedisError {
    RedisError::Str(text)
}

/// Change the values under the lock.
fn update(change: impl FnOnce(&mut Config)) -> Result<(), RedisError> {
    let mut config = CONFIG
        .lock()
        .map_err(|_| refused("the rl region configs are unavailable"))?;
    change(&mut config);
    Ok(())
}

impl ConfigurationValue<RedisString> for LocalRegion {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        let name = CONFIG.lock().ok().and_then(|c| c.local);
        RedisString::create(None, name.as_ref().map_or("", RegionName::as_str))
    }

    fn set(&self, _: &ConfigurationContext, value: RedisString) -> Result<(), RedisError> {
        let bytes = value.as_slice();
        let name = if bytes.is_empty() {
            None
        } else {
            Some(RegionName::new(bytes).ok_or(refused(
                "rl.region must be empty or 1 to 32 bytes of A-Z a-z 0-9 _ -",
            ))?)
        };
        update(|c| c.local = name)
    }
}

impl ConfigurationValue<RedisString> for AllRegions {
    fn get(&self, _: &ConfigurationContext) -> RedisString {
        let names = CONFIG.lock().map(|c| c.all.clone()).unwrap_or_default();
        let text: Vec<&str> = names.iter().map(RegionName::as_str).collect();
        RedisString::create(None, text.join(",").as_str())
    }

    fn set(&self, _: &ConfigurationContext, value: RedisString) -> Result<(), RedisError> {
        let names = parse_region_list(value.as_slice()).map_err(|e| match e {
            RegionListError::BadName => {
                refused("rl.regions: each name must be 1 to 32 bytes of A-Z a-z 0-9 _ -")
            }
            RegionListError::TooMany => refused("rl.regions: at most 16 regions"),
            RegionListError::Repeated => refused("rl.regions: a region is given more than once"),
        })?;
        update(|c| c.all = names)
    }
}
