//! What a command declares to the server's ACLs beyond its flags: its
//! categories (`RM_SetCommandACLCategories`, Redis 7.2+ and Valkey 8+),
//! the module's own category (`RM_AddACLCategory`, Redis 7.4+ and Valkey
//! 8+) and read-only key specs (`RM_SetCommandInfo`, Redis 7.0+). Each API
//! is looked up when the module loads and skipped where the server lacks
//! it; `commands.md` gives the ACL rules to write by name there.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};

use redis_module::commands::{get_redis_key_spec, BeginSearch, FindKeys, KeySpec, KeySpecFlags};
use redis_module::raw;

use crate::adapter::ffi::Ctx;

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
pub fn set_categories(command: *mut raw::RedisModuleCommand, categories: &str) {
    let (Some(set), Ok(categories)) = (
        // SAFETY: written once by `RedisModule_Init` at load (null where the
        // server lacks the API), only read afterwards; a copy.
        unsafe { raw::RedisModule_SetCommandACLCategories },
        CString::new(categories),
    ) else {
        return;
    };
    // SAFETY: `command` is a handle Redis gave back for a command of this
    // module while it loads; `categories` is NUL-terminated.
    unsafe { set(command, categories.as_ptr()) };
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
pub fn set_read_only_key(command: *mut raw::RedisModuleCommand, pos: c_int) {
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
    // module while it loads; `info` and the key specs it points to (held
    // by `key_specs`, terminated by an empty spec) outlive the call, which
    // copies them; `INFO_VERSION` gives the sizes this build filled in.
    unsafe { set_info(command, &info) };
}
