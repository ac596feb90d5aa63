//! The commands, one file each, and their registration with Redis.
//!
//! Commands are registered from one table, [`COMMANDS`], with
//! `RedisModule_CreateCommand` and `RedisModule_CreateSubcommand` (both in
//! Redis 7.0), not with the `#[command]` macro, whose API needs Redis 7.2.
//! Each subcommand has its own entry: Redis routes the call by its word.
//! `RL.TAKE` has keys at positions that depend on its options, so it uses
//! the getkeys API: Redis asks the same parser which arguments are keys.
//! The calls to Redis (registration, ACL categories, key specs) are
//! wrapped in [`super::ffi::command`].

pub mod apply;
pub mod box_cmd;
pub mod distinct;
pub mod lease;
pub mod limiter_call;
pub mod quota;
pub mod region;
pub mod take;
pub mod throttle;
pub mod window;

use std::ffi::CStr;
use std::os::raw::c_int;

use redis_module::raw;

use super::ffi::command::{self, Command};
use super::ffi::{command_entry, Ctx};

use command_entry as entry;

entry!(take_entry, take::run);
entry!(window_entry, window::run);
entry!(quota_entry, quota::run);
entry!(throttle_entry, throttle::run);
entry!(distinct_entry, distinct::run);
entry!(apply_entry, apply::run);
entry!(box_status_entry, box_cmd::status);
entry!(box_trip_entry, box_cmd::trip);
entry!(box_release_entry, box_cmd::release);
entry!(lease_acquire_entry, lease::acquire);
entry!(lease_release_entry, lease::release);
entry!(lease_renew_entry, lease::renew);
entry!(lease_list_entry, lease::list);
entry!(region_read_entry, region::read);
entry!(region_merge_entry, region::merge_cmd);

/// How one command or subcommand is registered.
struct Spec {
    /// `rl.take`, or a subcommand's name under `parent`.
    name: &'static CStr,
    /// The container command of a subcommand.
    parent: Option<&'static CStr>,
    /// The entry point; `None` for a container.
    entry: raw::RedisModuleCmdFunc,
    /// Redis's command flags.
    flags: &'static CStr,
    /// First key, last key (negative: from the end), step.
    keys: [c_int; 3],
    /// ACL categories, where the server lets modules declare them.
    acl: &'static str,
    /// The key spec says the key is only read (where the server takes key
    /// specs from modules), so a user with `%R~` may run it.
    read_only_key: bool,
}

/// A command (or subcommand) with its flags, keys and ACL categories.
const fn spec(
    name: &'static CStr,
    entry: raw::RedisModuleCmdFunc,
    flags: &'static CStr,
    keys: [c_int; 3],
    acl: &'static str,
) -> Spec {
    Spec {
        name,
        parent: None,
        entry,
        flags,
        keys,
        acl,
        read_only_key: false,
    }
}

/// A subcommand of `parent`, its key at argument 2.
const fn sub(
    parent: &'static CStr,
    name: &'static CStr,
    entry: raw::RedisModuleCmdFunc,
    flags: &'static CStr,
    acl: &'static str,
    read_only_key: bool,
) -> Spec {
    Spec {
        name,
        parent: Some(parent),
        entry,
        flags,
        keys: [2, 2, 1],
        acl,
        read_only_key,
    }
}

/// Every command of the module. `fast` only where a call's work is bounded
/// by a constant (at most 16 keys of constant size): an exact log or a
/// lease set is not. Writers are `@write`, readers `@read`; `RL.APPLY`,
/// which only a replication link or an AOF may send, is also
/// `@dangerous`. The module's own category `@ratelimit` is added to each
/// where the server has it.
const COMMANDS: &[Spec] = &[
    spec(
        c"rl.take",
        Some(take_entry),
        c"write deny-oom fast getkeys-api",
        [1, 1, 1],
        "write fast",
    ),
    spec(
        c"rl.window",
        Some(window_entry),
        c"write deny-oom getkeys-api",
        [1, 1, 1],
        "write",
    ),
    spec(
        c"rl.quota",
        Some(quota_entry),
        c"write deny-oom fast getkeys-api",
        [1, 1, 1],
        "write fast",
    ),
    spec(
        c"cl.throttle",
        Some(throttle_entry),
        c"write deny-oom fast",
        [1, 1, 1],
        "write fast",
    ),
    // key member limit window [PEEK] [TRIP level duration]
    spec(
        c"rl.distinct",
        Some(distinct_entry),
        c"write deny-oom",
        [1, 1, 1],
        "write",
    ),
    // key payload expiry [key payload expiry]...
    spec(
        c"rl.apply",
        Some(apply_entry),
        c"write",
        [1, -1, 3],
        "write dangerous",
    ),
    spec(c"rl.box", None, c"", [0, 0, 0], ""),
    sub(
        c"rl.box",
        c"status",
        Some(box_status_entry),
        c"readonly fast",
        "read fast",
        true,
    ),
    sub(
        c"rl.box",
        c"trip",
        Some(box_trip_entry),
        c"write deny-oom fast",
        "write fast",
        false,
    ),
    sub(
        c"rl.box",
        c"release",
        Some(box_release_entry),
        c"write fast",
        "write fast",
        false,
    ),
    spec(c"rl.lease", None, c"", [0, 0, 0], ""),
    sub(
        c"rl.lease",
        c"acquire",
        Some(lease_acquire_entry),
        c"write deny-oom",
        "write",
        false,
    ),
    sub(
        c"rl.lease",
        c"release",
        Some(lease_release_entry),
        c"write",
        "write",
        false,
    ),
    sub(
        c"rl.lease",
        c"renew",
        Some(lease_renew_entry),
        c"write",
        "write",
        false,
    ),
    sub(
        c"rl.lease",
        c"list",
        Some(lease_list_entry),
        c"readonly",
        "read",
        true,
    ),
    spec(c"rl.region", None, c"", [0, 0, 0], ""),
    sub(
        c"rl.region",
        c"read",
        Some(region_read_entry),
        c"readonly fast",
        "read fast",
        true,
    ),
    // key period period_end_ms (region added refunded)... at most 16
    sub(
        c"rl.region",
        c"merge",
        Some(region_merge_entry),
        c"write deny-oom fast",
        "write fast",
        false,
    ),
];

/// The module's ACL category, where the server lets modules add one.
const CATEGORY: &CStr = c"ratelimit";

/// Register every command; false if Redis refused one. ACL categories and
/// key specs are declared where the running server has the API for them
/// (checked here, at load), and skipped on older servers.
pub fn register(ctx: Ctx) -> bool {
    let own_category = command::add_category(ctx, CATEGORY);
    COMMANDS.iter().all(|spec| {
        let Some(command) = Command::create(
            ctx,
            spec.parent,
            spec.name,
            spec.entry,
            spec.flags,
            spec.keys,
        ) else {
            return false;
        };
        if !spec.acl.is_empty() {
            let mut categories = spec.acl.to_string();
            if own_category {
                categories.push(' ');
                categories.push_str(&CATEGORY.to_string_lossy());
            }
            command::set_categories(command, &categories);
        }
        if spec.read_only_key {
            command::set_read_only_key(command, spec.keys[0]);
        }
        true
    })
}
