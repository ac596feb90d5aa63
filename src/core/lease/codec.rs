//! The stored form of [`Leases`]: a MessagePack map from id (`bin`) to
//! deadline in increasing id order, refused in any other shape, with the
//! deadline index rebuilt on decoding.

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::*;

/// An id serialized as MessagePack `bin`.
pub(super) struct IdRef<'a>(pub(super) &'a [u8]);

impl Serialize for IdRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// An id read from `bin` (a string or an array of integers is refused, so
/// decoding accepts only what encoding makes).
pub(super) struct IdBuf(pub(super) Box<[u8]>);

impl<'de> Deserialize<'de> for IdBuf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = IdBuf;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a lease id as bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<IdBuf, E> {
                Ok(IdBuf(v.into()))
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<IdBuf, E> {
                Ok(IdBuf(v.into_boxed_slice()))
            }
        }
        deserializer.deserialize_byte_buf(IdVisitor)
    }
}

impl Serialize for Leases {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.by_id.len()))?;
        for (id, deadline) in &self.by_id {
            map.serialize_entry(&IdRef(id), deadline)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Leases {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LeasesVisitor;
        impl<'de> Visitor<'de> for LeasesVisitor {
            type Value = Leases;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of lease ids to deadlines, in increasing id order")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Leases, A::Error> {
                let mut leases = Leases::default();
                while let Some((IdBuf(id), deadline)) = map.next_entry::<IdBuf, Millis>()? {
                    if leases.by_id.len() >= MAX_LEASES_USIZE {
                        return Err(de::Error::custom("too many leases"));
                    }
                    if !valid_id(&id) || deadline > MAX_DEADLINE {
                        return Err(de::Error::custom("invalid lease"));
                    }
                    if leases
                        .by_id
                        .last_key_value()
                        .is_some_and(|(last, _)| **last >= *id)
                    {
                        return Err(de::Error::custom("lease ids not in increasing order"));
                    }
                    leases.by_deadline.insert((deadline, id.clone()));
                    leases.by_id.insert(id, deadline);
                }
                Ok(leases)
            }
        }
        deserializer.deserialize_map(LeasesVisitor)
    }
}
