//! What the module registers with the server while it loads: its options,
//! its `INFO` callback ([`InfoCtx`] for the fields), its commands and
//! subcommands ([`Command`]), and what a command declares to the server's
//! ACLs beyond its flags: its categories (`RM_SetCommandACLCategories`,
//! Redis 7.2+ and Valkey 8+), the module's own category
//! (`RM_AddACLCategory`, Redis 7.4+ and Valkey 8+) and read-only key specs
//! (`RM_SetCommandInfo`, Redis 7.0+). Each optional API is read from its
//! pointer (or looked up by name) where it is used, and skipped where the
//! server lacks it.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};

use redis_module::commands::{get_redis_key_spec, BeginSearch, FindKeys, KeySpec, KeySpecFlags};
use redis_module::raw;

use super::{api, Ctx};

/// Set the module's options (`REDISMODULE_OPTIONS_*`), in `OnLoad`.
pub fn set_module_options(ctx: Ctx, options: u32) {
    // SAFETY: `ctx` is the load context Redis passed to `OnLoad`, valid
    // while it runs.
    unsafe { api!(RedisModule_SetModuleOptions)(ctx.ptr(), options as c_int) };
}

/// An `INFO` callback's signature.
pub type InfoFunc = extern "C" fn(*mut raw::RedisModuleInfoCtx, c_int);

/// Register the module's `INFO` callback, in `OnLoad`.
pub fn register_info(ctx: Ctx, info: InfoFunc) {
    // SAFETY: `ctx` is the load context Redis passed to `OnLoad`, valid
    // while it runs; `info` has the signature of an info callback.
    unsafe { api!(RedisModule_RegisterInfoFunc)(ctx.ptr(), Some(info)) };
}

/// The context of an `INFO` callback, valid while it runs: made only from
/// the one Redis passed to it.
#[derive(Clone, Copy)]
pub struct InfoCtx(*mut raw::RedisModuleInfoCtx);

impl InfoCtx {
    /// Wrap the context Redis passed to the `INFO` callback.
    pub(crate) fn new(raw: *mut raw::RedisModuleInfoCtx) -> InfoCtx {
        InfoCtx(raw)
    }

    /// Start the module's section (the empty name: the module's own).
    pub fn add_section(self, name: &CStr) {
        // SAFETY: `self.0` is the info context of the running callback;
        // `name` is NUL-terminated and Redis copies it.
        unsafe { api!(RedisModule_InfoAddSection)(self.0, name.as_ptr()) };
    }

    /// Add a field with an unsigned value to the section.
    pub fn add_u64(self, name: &CStr, value: u64) {
        // SAFETY: as in `add_section`.
        unsafe { api!(RedisModule_InfoAddFieldULongLong)(self.0, name.as_ptr(), value) };
    }
}

/// A command of this module, as Redis gave it back while the module loads.
#[derive(Clone, Copy)]
pub struct Command(*mut raw::RedisModuleCommand);

impl Command {
    /// Create the command `name` (or, with `parent`, its subcommand) with
    /// its entry point, flags and key positions `[first, last, step]`; its
    /// handle, `None` if Redis refused it. Called while the module loads.
    pub fn create(
        ctx: Ctx,
        parent: Option<&CStr>,
        name: &CStr,
        entry: raw::RedisModuleCmdFunc,
        flags: &CStr,
        [first, last, step]: [c_int; 3],
    ) -> Option<Command> {
        // What makes each block below sound: `ctx` is the load context of
        // `OnLoad`, valid while commands are registered; the names and
        // flags are NUL-terminated, and Redis copies them; `entry` has a
        // command's signature.
        let status = match parent {
            // SAFETY: see above.
            None => unsafe {
                api!(RedisModule_CreateCommand)(
                    ctx.ptr(),
                    name.as_ptr(),
                    entry,
                    flags.as_ptr(),
                    first,
                    last,
                    step,
                )
            },
            Some(parent) => {
                let parent = Command::get(ctx, parent)?;
                // SAFETY: see above; `parent.0` is the non-null handle
                // Redis just gave back for the container command.
                unsafe {
                    api!(RedisModule_CreateSubcommand)(
                        parent.0,
                        name.as_ptr(),
                        entry,
                        flags.as_ptr(),
                        first,
                        last,
                        step,
                    )
                }
            }
        };
        if status != raw::REDISMODULE_OK as c_int {
            return None;
        }
        let full = match parent {
            None => name.to_string_lossy().into_owned(),
            Some(parent) => format!("{}|{}", parent.to_string_lossy(), name.to_string_lossy()),
        };
        Command::get(ctx, &CString::new(full).ok()?)
    }

    /// The command named `full` (`container|sub` for a subcommand).
    fn get(ctx: Ctx, full: &CStr) -> Option<Command> {
        // SAFETY: `ctx` is the load context of `OnLoad`; `full` is
        // NUL-terminated.
        let command = unsafe { api!(RedisModule_GetCommand)(ctx.ptr(), full.as_ptr()) };
        (!command.is_null()).then_some(Command(command))
    }
}

/// `RM_AddACLCategory`'s signature.
type AddCategory = unsafe extern "C" fn(*mut raw::RedisModuleCtx, *const c_char) -> c_int;

/// A module API function by name, if the running server has it.
fn lookup(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `RedisModule_GetApi` is written once, by `RedisModule_Init`
    // while the module loads (before this runs), and only read afterwards;
    // this copies the pointer out.
    let get_api = unsafe { raw::RedisModule_GetApi }?;
    let mut function: *mut c_void = std::ptr::null_mut();
    // SAFETY: `name` is NUL-terminated; Redis writes one function pointer
    // into `function` (a pointer-sized place) when it has the function.
    let found = unsafe { get_api(name.as_ptr(), (&mut function as *mut *mut c_void).cast()) };
    (found == raw::REDISMODULE_OK as c_int && !function.is_null()).then_some(function)
}

/// Add the module's ACL category; false where the server cannot.
pub fn add_category(ctx: Ctx, name: &CStr) -> bool {
    let Some(function) = lookup(c"RedisModule_AddACLCategory") else {
        return false;
    };
    // SAFETY: the server hands out, under this name, a non-null function
    // with this signature (redismodule.h's `RedisModule_AddACLCategory`);
    // function and data pointers have one size on the platforms Redis runs.
    let add: AddCategory = unsafe { std::mem::transmute::<*mut c_void, AddCategory>(function) };
    // SAFETY: `ctx` is the load context of `OnLoad` (the only time the
    // server accepts a new category); `name` is NUL-terminated.
    unsafe { add(ctx.ptr(), name.as_ptr()) == raw::REDISMODULE_OK as c_int }
}

/// Declare `categories` (space separated) for `command`, where the server
/// has the API.
pub fn set_categories(command: Command, categories: &str) {
    let (Some(set), Ok(categories)) = (
        // SAFETY: written once by `RedisModule_Init` at load (null where the
        // server lacks the API), only read afterwards; a copy.
        unsafe { raw::RedisModule_SetCommandACLCategories },
        CString::new(categories),
    ) else {
        return;
    };
    // SAFETY: `command` is a handle Redis gave back for a command of this
    // module while it loads (a `Command`'s); `categories` is NUL-terminated.
    unsafe { set(command.0, categories.as_ptr()) };
}

/// The command info version this build fills in.
static INFO_VERSION: raw::RedisModuleCommandInfoVersion = raw::RedisModuleCommandInfoVersion {
    version: 1,
    sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
    sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
    sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
};

/// Declare one key spec for `command`: the key at argument `pos`, only
/// read (`RO ACCESS`), so a user allowed to read the key (`%R~`) may run
/// it.
pub fn set_read_only_key(command: Command, pos: c_int) {
    // SAFETY: written once by `RedisModule_Init` at load (null where the
    // server lacks the API), only read afterwards; a copy.
    let Some(set_info) = (unsafe { raw::RedisModule_SetCommandInfo }) else {
        return;
    };
    let key_specs = get_redis_key_spec(vec![KeySpec::new(
        None,
        KeySpecFlags::READ_ONLY | KeySpecFlags::ACCESS,
        BeginSearch::new_index(pos),
        FindKeys::new_range(0, 1, 0),
    )]);
    let info = raw::RedisModuleCommandInfo {
        version: &INFO_VERSION,
        summary: std::ptr::null(),
        complexity: std::ptr::null(),
        since: std::ptr::null(),
        history: std::ptr::null_mut(),
        tips: std::ptr::null(),
        arity: 0,
        key_specs: key_specs.as_ptr().cast_mut(),
        args: std::ptr::null_mut(),
    };
    // SAFETY: `command` is a handle Redis gave back for a command of this
    // module while it loads (a `Command`'s); `info` and the key specs it points to (held
    // by `key_specs`, terminated by an empty spec) outlive the call, which
    // copies them; `INFO_VERSION` gives the sizes this build filled in.
    unsafe { set_info(command.0, &info) };
}
