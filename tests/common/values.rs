//! Reply helpers: a `redis::Value` as integers, strings, arrays and
//! pairs; error texts; `INFO` fields; the tail of a log.

use std::fmt::Debug;

use redis::{RedisError, RedisResult, Value};

/// An integer reply, or a string that parses as one; panics otherwise.
pub fn value_i64(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an integer: {v:?}")),
        Value::SimpleString(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("not an integer: {s:?}")),
        other => panic!("not an integer: {other:?}"),
    }
}

/// A string-ish reply (bulk, simple, OK, verbatim, integer, double) as text;
/// panics on arrays, nil and errors.
pub fn value_str(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_string(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::Int(i) => i.to_string(),
        Value::Double(d) => d.to_string(),
        other => panic!("not a string reply: {other:?}"),
    }
}

/// The elements of an array (or set) reply; panics otherwise.
pub fn array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(items) | Value::Set(items) => items,
        other => panic!("not an array reply: {other:?}"),
    }
}

/// An array reply of integers (or numeric strings) as `Vec<i64>`.
pub fn int_array(v: Value) -> Vec<i64> {
    array(v).iter().map(value_i64).collect()
}

/// An array reply of strings as `Vec<String>` (see [`value_str`]).
pub fn str_array(v: Value) -> Vec<String> {
    array(v).iter().map(value_str).collect()
}

/// A flat `[k1, v1, k2, v2, ...]` array or a RESP3 map, as `(key, value)`
/// pairs with string keys.
pub fn pairs(v: Value) -> Vec<(String, Value)> {
    match v {
        Value::Map(m) => m.into_iter().map(|(k, v)| (value_str(&k), v)).collect(),
        other => {
            let items = array(other);
            assert!(
                items.len().is_multiple_of(2),
                "odd-length key/value array: {items:?}"
            );
            let mut out = Vec::with_capacity(items.len() / 2);
            let mut it = items.into_iter();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((value_str(&k), v));
            }
            out
        }
    }
}

/// Asserts that `r` is an error whose text (code + detail) contains `needle`
/// (case-sensitive), and returns the error.
pub fn expect_err<T: Debug>(r: RedisResult<T>, needle: &str) -> RedisError {
    match r {
        Ok(v) => panic!("expected an error containing {needle:?}, got Ok({v:?})"),
        Err(e) => {
            let text = err_text(&e);
            assert!(
                text.contains(needle),
                "expected an error containing {needle:?}, got {text:?}"
            );
            e
        }
    }
}

/// An error as the server sent it: `CODE detail` (e.g. `CROSSSLOT Keys in
/// request don't hash to the same slot`), falling back to `Display`.
pub fn err_text(e: &RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The value of `field` in `INFO` output (`field:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (k, v) = line.trim_end().split_once(':')?;
        (k == field).then(|| v.to_string())
    })
}
