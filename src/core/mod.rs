//! The pure core: every algorithm as plain data and functions of
//! `(state, parameters, now)`, with no Redis types. Time is always an
//! argument (milliseconds since the epoch), so everything here is tested
//! with explicit times.

pub mod bucket;
pub mod cell;
pub mod codec;
mod codec_direct;
pub mod decision;
pub mod distinct;
pub mod lease;
pub mod limiter;
pub mod limits;
pub mod packed;
pub mod part;
pub mod patch;
pub mod patch_plan;
pub mod payload;
pub mod penalty;
pub mod quota;
pub mod record;
pub mod region;
pub mod take;
pub mod time;
pub mod window;

#[cfg(test)]
mod bucket_proptests;
#[cfg(test)]
mod codec_proptests;
#[cfg(test)]
mod distinct_proptests;
#[cfg(test)]
mod penalty_proptests;
#[cfg(test)]
mod region_proptests;
#[cfg(test)]
mod settle_proptests;
#[cfg(test)]
mod shaping_proptests;
#[cfg(test)]
mod take_proptests;
#[cfg(test)]
pub(crate) mod testkit;
