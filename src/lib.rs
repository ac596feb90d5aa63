//! rl: rate limiting as a native Redis module. The pure algorithms live in
//! [`core`]; [`adapter`] connects them to Redis. This file only declares
//! the module to Redis.
//!
//! Every `unsafe` block says why it is sound in a `// SAFETY:` comment,
//! and every `unsafe fn` has a `# Safety` section: both are denied here.

#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod adapter;
pub mod core;

/// Declare the module with the given global allocator: Redis's in the
/// server (so `used_memory` counts rl's values), the system one in
/// benchmarks, which run without Redis, and in unit tests the system one
/// counting live bytes (which the value tests compare with the memory a
/// value reports).
macro_rules! declare_module {
    ($alloc:ty, $init:expr) => {
        redis_module::redis_module! {
            name: "rl",
            version: 1,
            allocator: ($alloc, $init),
            data_types: [],
            init: init,
            // (the macro needs every kind listed to read load arguments)
            configurations: [
                i64: [],
                string: [
                    ["region", &adapter::regions::LOCAL, "", ConfigurationFlags::DEFAULT, None],
                    ["regions", &adapter::regions::ALL, "", ConfigurationFlags::DEFAULT, None],
                ],
                bool: [],
                enum: [],
                module_args_as_configuration: true,
            ]
        }
    };
}

use adapter::init;
use redis_module::configuration::ConfigurationFlags;

#[cfg(not(any(test, feature = "system-alloc")))]
declare_module!(
    redis_module::alloc::RedisAlloc,
    redis_module::alloc::RedisAlloc
);
#[cfg(all(not(test), feature = "system-alloc"))]
declare_module!(std::alloc::System, std::alloc::System);
#[cfg(test)]
declare_module!(adapter::value::Counting, adapter::value::Counting);
