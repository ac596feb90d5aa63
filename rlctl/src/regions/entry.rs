//! What travels between regions: one region's component of one quota key
//! for one period, as a stream entry; the replies of `RL.REGION READ` and
//! `XREADGROUP` read without trusting them.

use super::config::legal_region_name;
use redis::{RedisError, Value};

/// One region's component of a key: `(added, refunded)` in the period
/// ending at `period_end_ms`. Both grow only; a merge keeps the maximum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The quota key (any bytes).
    pub key: Vec<u8>,
    /// `DAY`, `WEEK` or `MONTH`.
    pub period: String,
    /// When the period ends (ms since the epoch; the key's expiry).
    pub period_end_ms: i64,
    /// Whose component this is.
    pub region: String,
    /// Points counted by that region.
    pub added: u64,
    /// Points that region gave back (never above `added`).
    pub refunded: u64,
}

/// The entry fields, in order.
const FIELDS: [&str; 6] = [
    "key",
    "period",
    "period_end_ms",
    "region",
    "added",
    "refunded",
];

fn legal_period(p: &str) -> bool {
    matches!(p, "DAY" | "WEEK" | "MONTH")
}

/// A decimal integer without sign, spaces or leading `+`.
fn parse_u64(field: &str, raw: &[u8]) -> Result<u64, String> {
    let text = std::str::from_utf8(raw).map_err(|_| format!("field {field:?} is not text"))?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("field {field:?} is not a non-negative integer"));
    }
    text.parse()
        .map_err(|_| format!("field {field:?} is out of range"))
}

impl Change {
    /// The `XADD` field/value pairs.
    pub fn fields(&self) -> Vec<(&'static str, Vec<u8>)> {
        let values = [
            self.key.clone(),
            self.period.clone().into_bytes(),
            self.period_end_ms.to_string().into_bytes(),
            self.region.clone().into_bytes(),
            self.added.to_string().into_bytes(),
            self.refunded.to_string().into_bytes(),
        ];
        FIELDS.into_iter().zip(values).collect()
    }

    /// Reads an entry's fields: every field once, each legal (unknown
    /// fields are ignored). The error names the field.
    pub fn parse(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Change, String> {
        let get = |name: &str| -> Result<&[u8], String> {
            let mut found = fields
                .iter()
                .filter(|(f, _)| f.as_slice() == name.as_bytes());
            let value = found
                .next()
                .ok_or_else(|| format!("field {name:?} missing"))?;
            if found.next().is_some() {
                return Err(format!("field {name:?} given twice"));
            }
            Ok(&value.1)
        };
        let text = |name: &str| -> Result<String, String> {
            String::from_utf8(get(name)?.to_vec())
                .map_err(|_| format!("field {name:?} is not text"))
        };
        let key = get("key")?.to_vec();
        if key.is_empty() {
            return Err("field \"key\" is empty".into());
        }
        let period = text("period")?;
        if !legal_period(&period) {
            return Err(format!(
                "field \"period\": {period:?} is not DAY, WEEK or MONTH"
            ));
        }
        let end = parse_u64("period_end_ms", get("period_end_ms")?)?;
        let period_end_ms = i64::try_from(end)
            .map_err(|_| "field \"period_end_ms\" is out of range".to_string())?;
        let region = text("region")?;
        if !legal_region_name(&region) {
            return Err(format!("field \"region\": {region:?} is not a region name"));
        }
        let added = parse_u64("added", get("added")?)?;
        let refunded = parse_u64("refunded", get("refunded")?)?;
        if refunded > added {
            return Err(format!(
                "field \"refunded\": {refunded} is above added {added}"
            ));
        }
        Ok(Change {
            key,
            period,
            period_end_ms,
            region,
            added,
            refunded,
        })
    }

    /// `RL.REGION MERGE key period period_end_ms region added refunded`.
    pub fn merge_cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("RL.REGION");
        cmd.arg("MERGE")
            .arg(&self.key)
            .arg(&self.period)
            .arg(self.period_end_ms)
            .arg(&self.region)
            .arg(self.added)
            .arg(self.refunded);
        cmd
    }

    /// `RL.REGION READ key`.
    pub fn read_cmd(key: &[u8]) -> redis::Cmd {
        let mut cmd = redis::cmd("RL.REGION");
        cmd.arg("READ").arg(key);
        cmd
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// `region`'s component in a reply of `RL.REGION READ key`
/// (`nil`, or `[period_end_ms, period, [[region, added, refunded], ...]]`):
/// `None` when the key has no component of `region`.
pub fn component_of(key: &[u8], reply: &Value, region: &str) -> Result<Option<Change>, String> {
    let bad = |what: &str| format!("RL.REGION READ: unexpected reply ({what}): {reply:?}");
    let parts = match reply {
        Value::Nil => return Ok(None),
        Value::Array(parts) => parts,
        _ => return Err(bad("not an array")),
    };
    let [end, period, components] = parts.as_slice() else {
        return Err(bad("not 3 elements"));
    };
    let period_end_ms = int(end).ok_or_else(|| bad("period end"))?;
    let period = text(period)
        .filter(|p| legal_period(p))
        .ok_or_else(|| bad("period"))?;
    let Value::Array(components) = components else {
        return Err(bad("components"));
    };
    for c in components {
        let Value::Array(c) = c else {
            return Err(bad("component"));
        };
        let [name, added, refunded] = c.as_slice() else {
            return Err(bad("component"));
        };
        if text(name).as_deref() != Some(region) {
            continue;
        }
        let count = |v: &Value| int(v).and_then(|i| u64::try_from(i).ok());
        let (Some(added), Some(refunded)) = (count(added), count(refunded)) else {
            return Err(bad("component values"));
        };
        return Ok(Some(Change {
            key: key.to_vec(),
            period,
            period_end_ms,
            region: region.to_string(),
            added,
            refunded,
        }));
    }
    Ok(None)
}

/// One entry of an `XREADGROUP` reply: its id, and its fields (`None` for
/// a pending entry the stream no longer holds: trimmed or deleted).
pub type StreamEntry = (String, Option<Vec<(Vec<u8>, Vec<u8>)>>);

/// The entries of an `XREADGROUP` reply on one stream (nil: none).
pub fn stream_entries(reply: &Value) -> Result<Vec<StreamEntry>, String> {
    let bad = |what: &str| format!("XREADGROUP: unexpected reply ({what})");
    let streams: Vec<&Value> = match reply {
        Value::Nil => return Ok(vec![]),
        Value::Array(s) => s
            .iter()
            .map(|s| match s {
                Value::Array(pair) if pair.len() == 2 => Ok(&pair[1]),
                _ => Err(bad("stream")),
            })
            .collect::<Result<_, _>>()?,
        Value::Map(m) => m.iter().map(|(_, v)| v).collect(),
        _ => return Err(bad("not an array")),
    };
    let mut out = Vec::new();
    for entries in streams {
        let Value::Array(entries) = entries else {
            return Err(bad("entries"));
        };
        for e in entries {
            let Value::Array(e) = e else {
                return Err(bad("entry"));
            };
            let [id, fields] = e.as_slice() else {
                return Err(bad("entry"));
            };
            let id = text(id).ok_or_else(|| bad("entry id"))?;
            let fields = match fields {
                Value::Nil => None,
                Value::Array(flat) => Some(
                    flat.chunks(2)
                        .map(|kv| match kv {
                            [Value::BulkString(k), Value::BulkString(v)] => {
                                Some((k.clone(), v.clone()))
                            }
                            _ => None,
                        })
                        .collect::<Option<Vec<_>>>()
                        .unwrap_or_default(),
                ),
                _ => Some(vec![]),
            };
            out.push((id, fields));
        }
    }
    Ok(out)
}

/// Whether the server refused the command for good (its arguments or the
/// key: `ERR ...`, `WRONGTYPE ...`), as opposed to a failure worth trying
/// again (connection, timeout, failover, loading, memory, permissions).
pub fn is_refusal(e: &RedisError) -> bool {
    match e.kind() {
        redis::ErrorKind::ResponseError => true,
        redis::ErrorKind::ExtensionError => !matches!(
            e.code(),
            Some("NOPERM" | "NOAUTH" | "OOM" | "BUSY" | "MISCONF" | "NOREPLICAS")
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn sample() -> Change {
        Change {
            key: b"rl:{t:1}:month".to_vec(),
            period: "MONTH".into(),
            period_end_ms: 1_798_761_600_000,
            region: "us".into(),
            added: 120,
            refunded: 20,
        }
    }

    fn owned(fields: Vec<(&str, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
        fields
            .into_iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v))
            .collect()
    }

    #[test]
    fn an_entry_reads_back_what_was_written() {
        let c = sample();
        assert_eq!(Change::parse(&owned(c.fields())).unwrap(), c);
        let mut extra = owned(c.fields());
        extra.push((b"note".to_vec(), b"from a newer worker".to_vec()));
        assert_eq!(Change::parse(&extra).unwrap(), c, "unknown fields ignored");
    }

    #[test]
    fn a_bad_entry_names_its_field() {
        let c = sample();
        for (field, value, says) in [
            ("added", "-1", "\"added\""),
            ("added", "+5", "\"added\""),
            ("added", "99999999999999999999", "\"added\""),
            ("refunded", "121", "\"refunded\""),
            ("period", "YEAR", "\"period\""),
            ("region", "e u", "\"region\""),
            ("period_end_ms", "x", "\"period_end_ms\""),
            ("key", "", "\"key\""),
        ] {
            let mut f = owned(c.fields());
            for (k, v) in f.iter_mut() {
                if k.as_slice() == field.as_bytes() {
                    *v = value.as_bytes().to_vec();
                }
            }
            let e = Change::parse(&f).unwrap_err();
            assert!(e.contains(says), "{field}={value}: {e}");
        }
        let mut missing = owned(c.fields());
        missing.retain(|(k, _)| k.as_slice() != b"refunded");
        assert!(Change::parse(&missing).unwrap_err().contains("missing"));
        let mut twice = owned(c.fields());
        twice.push((b"added".to_vec(), b"999".to_vec()));
        assert!(Change::parse(&twice).unwrap_err().contains("twice"));
        let mut binary = owned(c.fields());
        binary[3].1 = vec![0xff, 0xfe];
        assert!(Change::parse(&binary).unwrap_err().contains("not text"));
    }

    #[test]
    fn the_local_component_is_taken_from_a_read() {
        let reply = Value::Array(vec![
            Value::Int(1_798_761_600_000),
            bulk("MONTH"),
            Value::Array(vec![
                Value::Array(vec![bulk("eu"), Value::Int(7), Value::Int(0)]),
                Value::Array(vec![bulk("us"), Value::Int(120), Value::Int(20)]),
            ]),
        ]);
        let key = b"rl:{t:1}:month";
        assert_eq!(component_of(key, &reply, "us").unwrap(), Some(sample()));
        assert_eq!(component_of(key, &reply, "ap").unwrap(), None);
        assert_eq!(component_of(key, &Value::Nil, "us").unwrap(), None);
        assert!(component_of(key, &Value::Int(3), "us").is_err());
        let negative = Value::Array(vec![
            Value::Int(1),
            bulk("DAY"),
            Value::Array(vec![Value::Array(vec![
                bulk("us"),
                Value::Int(-1),
                Value::Int(0),
            ])]),
        ]);
        assert!(component_of(key, &negative, "us").is_err());
    }

    #[test]
    fn stream_replies_keep_trimmed_entries_apart() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("rl:region:changes"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("1-0"),
                    Value::Array(vec![bulk("key"), bulk("k")]),
                ]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
                Value::Array(vec![bulk("3-0"), Value::Array(vec![bulk("odd")])]),
            ]),
        ])]);
        let entries = stream_entries(&reply).unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].1.as_ref().unwrap()[0].1, b"k");
        assert_eq!(entries[1].1, None);
        assert_eq!(
            entries[2].1,
            Some(vec![]),
            "an odd field list reads as empty"
        );
        assert!(stream_entries(&Value::Nil).unwrap().is_empty());
    }

    #[test]
    fn refusals_are_told_from_failures_worth_retrying() {
        let err = RedisError::from((
            redis::ErrorKind::ResponseError,
            "An error was signalled by the server",
            "REGION: unknown region".to_string(),
        ));
        assert!(is_refusal(&err));
        assert!(!is_refusal(&RedisError::from(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset
        ))));
        assert!(!is_refusal(&RedisError::from((
            redis::ErrorKind::TryAgain,
            "TRYAGAIN"
        ))));
        let ext = |code: &str| {
            let reply = format!("-{code} some text\r\n");
            redis::parse_redis_value(reply.as_bytes())
                .and_then(Value::extract_error)
                .expect_err("an error reply")
        };
        assert!(is_refusal(&ext("ERR")));
        assert!(!is_refusal(&ext("NOPERM")));
        assert!(is_refusal(&ext("WRONGTYPE")));
    }
}
