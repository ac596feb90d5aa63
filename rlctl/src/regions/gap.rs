//! Gaps in a remote stream: entries the remote region appended and then
//! trimmed away (`XADD MAXLEN ~`) before the local region's group read
//! them, after a partition or a stop longer than the stream holds.
//!
//! Detection: every read of new entries is sent in one pipeline after
//! `XINFO STREAM` and `XINFO GROUPS`, so the check sees the stream as the
//! read does. Entries were lost when fewer were read than were trimmed
//! (`entries-added - length` against the group's `entries-read`, which
//! Redis 7.0+ and Valkey report; where the counter is unknown, when the
//! stream's oldest entry is past the group's last-delivered id; older
//! servers are not checked). A pending entry found trimmed when it is read
//! again (read, not yet applied) is a gap too: the consumer resyncs the
//! region before it acknowledges it.
//!
//! Recovery: components merge by maximum, so reading the remote region's
//! current component of every key and merging it here restores exactly
//! what the lost entries carried. The group is first set back just before
//! the oldest entry (its read counter unknown, so a failed recovery is
//! found again), the remote's primaries are scanned (`RL.REGION READ`) and
//! merged, and only then the group's read counter is set to the entries
//! before that point: the gap is closed.

use super::entry::{component_of, is_refusal, Change};
use crate::store::{self, Store, Target};
use redis::Value;
use std::collections::HashMap;
use std::time::Duration;

/// A stream entry id, `ms-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntryId(u64, u64);

impl EntryId {
    fn parse(v: &Value) -> Option<EntryId> {
        let text = match v {
            Value::BulkString(b) => std::str::from_utf8(b).ok()?,
            Value::SimpleString(s) => s.as_str(),
            _ => return None,
        };
        let (ms, seq) = text.split_once('-')?;
        Some(EntryId(ms.parse().ok()?, seq.parse().ok()?))
    }

    /// The largest id below this one.
    fn before(self) -> Option<EntryId> {
        match self {
            EntryId(ms, 0) => Some(EntryId(ms.checked_sub(1)?, u64::MAX)),
            EntryId(ms, seq) => Some(EntryId(ms, seq - 1)),
        }
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// The remote stream and the local region's group on it, as `XINFO`
/// reports them (a field the server does not report is `None`).
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    length: u64,
    entries_added: Option<u64>,
    first: Option<EntryId>,
    last_generated: Option<EntryId>,
    last_delivered: Option<EntryId>,
    entries_read: Option<u64>,
}

/// Entries trimmed from the remote stream before the group read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// How many: exact when the group's read counter was known, else at
    /// most this many (every entry trimmed so far).
    pub lost: u64,
    /// Where the group resumes: just before the oldest entry the stream holds.
    pub resume: EntryId,
    /// The entries appended before that point (the group's read counter there).
    pub entries_read: u64,
}

fn count(v: Option<&Value>) -> Option<u64> {
    match v {
        Some(Value::Int(i)) => u64::try_from(*i).ok(),
        _ => None,
    }
}

impl Snapshot {
    /// From the replies of `XINFO STREAM` and `XINFO GROUPS`, for `group`.
    pub fn of(
        stream: &HashMap<String, Value>,
        groups: &[HashMap<String, Value>],
        group: &str,
    ) -> Snapshot {
        let first = match stream.get("first-entry") {
            Some(Value::Array(e)) => e.first().and_then(EntryId::parse),
            _ => None,
        };
        let ours = groups.iter().find(|g| {
            matches!(g.get("name"), Some(Value::BulkString(n)) if n.as_slice() == group.as_bytes())
        });
        Snapshot {
            length: count(stream.get("length")).unwrap_or(0),
            entries_added: count(stream.get("entries-added")),
            first,
            last_generated: stream.get("last-generated-id").and_then(EntryId::parse),
            last_delivered: ours
                .and_then(|g| g.get("last-delivered-id"))
                .and_then(EntryId::parse),
            entries_read: ours.and_then(|g| count(g.get("entries-read"))),
        }
    }

    /// The gap before the group's next entry, if entries it has not read
    /// were trimmed. With the group's read counter known, every trimmed
    /// entry it has not counted was never delivered, wherever its
    /// last-delivered id is now (the read sent with the check moves it past
    /// the gap; a recovery that failed before setting it back leaves it
    /// there). Without the counter, a gap is the group's next entry gone.
    pub fn gap(&self) -> Option<Gap> {
        let added = self.entries_added?;
        let delivered = self.last_delivered?;
        let (resume, next_gone) = match self.first {
            Some(first) if self.length > 0 => (first.before()?, first > delivered),
            _ => {
                let last = self.last_generated?;
                (last, last > delivered)
            }
        };
        let trimmed = added.saturating_sub(self.length);
        let lost = match self.entries_read {
            Some(read) => trimmed.saturating_sub(read),
            None if next_gone => trimmed,
            None => 0,
        };
        (lost > 0).then_some(Gap {
            lost,
            resume,
            entries_read: trimmed,
        })
    }
}

/// `XINFO STREAM`, `XINFO GROUPS` and `read` in one pipeline: the gap
/// before this read, if any, and the read's reply.
pub async fn checked_read(
    reader: &Store,
    stream: &str,
    group: &str,
    read: redis::Cmd,
) -> redis::RedisResult<(Option<Gap>, Value)> {
    let mut pipe = redis::pipe();
    pipe.cmd("XINFO").arg("STREAM").arg(stream);
    pipe.cmd("XINFO").arg("GROUPS").arg(stream);
    pipe.add_command(read);
    let (info, groups, reply): (HashMap<String, Value>, Vec<HashMap<String, Value>>, Value) =
        reader.query_pipe(&pipe).await?;
    Ok((Snapshot::of(&info, &groups, group).gap(), reply))
}

/// What a recovery merged: the remote components read, and how many grew here.
#[derive(Debug, Default)]
pub struct Resynced {
    pub components: i64,
    pub grew: i64,
}

/// Merges every current component of region `name` here, closing `gap`
/// in its stream when there is one: the group set back before the oldest
/// entry, the components merged, then the group's read counter set.
/// Without a gap (pending entries found trimmed) the group stays where it is.
pub async fn recover(
    remote: &Target,
    reader: &Store,
    (stream, group): (&str, &str),
    name: &str,
    local: &Store,
    gap: Option<&Gap>,
    (scan_count, limit): (u64, Duration),
) -> Result<Resynced, String> {
    let setid = |gap: &Gap, entries_read: Option<u64>| {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("SETID")
            .arg(stream)
            .arg(group)
            .arg(gap.resume.to_string());
        if let Some(n) = entries_read {
            cmd.arg("ENTRIESREAD").arg(n);
        }
        cmd
    };
    if let Some(gap) = gap {
        reader
            .query::<()>(&setid(gap, None))
            .await
            .map_err(|e| format!("XGROUP SETID: {e}"))?;
    }
    let done = resync(remote, name, local, scan_count, limit).await?;
    if let Some(gap) = gap {
        reader
            .query::<()>(&setid(gap, Some(gap.entries_read)))
            .await
            .map_err(|e| format!("XGROUP SETID ... ENTRIESREAD: {e}"))?;
    }
    Ok(done)
}

/// Reads region `name`'s component of every quota key on each of its
/// primaries (`SCAN ... TYPE rl-record`, `RL.REGION READ`) and merges it
/// here (`RL.REGION MERGE`). A component the module refuses is logged and
/// skipped; any other failure ends the resync (it is tried again).
async fn resync(
    remote: &Target,
    name: &str,
    local: &Store,
    scan_count: u64,
    limit: Duration,
) -> Result<Resynced, String> {
    let mut done = Resynced::default();
    for url in remote.primaries(&mut Vec::new()).await? {
        let mut con = remote.node(&url).await?;
        let mut cursor = 0;
        loop {
            let (next, keys) = store::scan_records(&mut con, cursor, scan_count).await?;
            let page = merge_page(&con, name, local, &keys);
            tokio::time::timeout(limit, page)
                .await
                .map_err(|_| {
                    format!(
                        "{}: a page of the resync timed out",
                        crate::text::redact_url(&url)
                    )
                })??
                .add_to(&mut done);
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(done)
}

impl Resynced {
    fn add_to(self, total: &mut Resynced) {
        total.components += self.components;
        total.grew += self.grew;
    }
}

/// Reads `keys` on one remote node and merges `name`'s components here.
async fn merge_page(
    con: &redis::aio::MultiplexedConnection,
    name: &str,
    local: &Store,
    keys: &[Vec<u8>],
) -> Result<Resynced, String> {
    let reads = futures_util::future::join_all(keys.iter().map(|k| async move {
        Change::read_cmd(k)
            .query_async::<Value>(&mut con.clone())
            .await
    }))
    .await;
    let mut changes = Vec::new();
    for (key, read) in keys.iter().zip(reads) {
        let shown = String::from_utf8_lossy(key);
        let reply = match read {
            Ok(reply) => reply,
            // a key replaced since the scan, say: skipped, as the publisher does
            Err(e) if is_refusal(&e) => {
                tracing::warn!(region = name, key = %shown, reason = %e, "resync: key skipped");
                continue;
            }
            Err(e) => return Err(format!("RL.REGION READ {shown}: {e}")),
        };
        match component_of(key, &reply, name) {
            Ok(Some(change)) => changes.push(change),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(region = name, key = %shown, reason = %e, "resync: key skipped")
            }
        }
    }
    let merges = futures_util::future::join_all(
        changes
            .iter()
            .map(|c| async move { local.query_key::<i64>(&c.merge_cmd(), &c.key).await }),
    )
    .await;
    let mut done = Resynced::default();
    for (change, merged) in changes.iter().zip(merges) {
        match merged {
            Ok(grew) => {
                done.components += 1;
                done.grew += grew;
            }
            Err(e) if is_refusal(&e) => {
                let key = String::from_utf8_lossy(&change.key);
                tracing::warn!(region = name, key = %key, reason = %e, "resync: component refused");
            }
            Err(e) => return Err(format!("RL.REGION MERGE: {e}")),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(
        length: u64,
        added: u64,
        first: u64,
        delivered: u64,
        read: Option<u64>,
    ) -> Snapshot {
        Snapshot {
            length,
            entries_added: Some(added),
            first: (length > 0).then_some(EntryId(first, 0)),
            last_generated: Some(EntryId(first + length, 0)),
            last_delivered: Some(EntryId(delivered, 0)),
            entries_read: read,
        }
    }

    #[test]
    fn a_gap_is_entries_trimmed_before_the_group_read_them() {
        // 405 appended, 105 kept from id 300: the group read 5.
        let gap = snapshot(105, 405, 300, 5, Some(5)).gap().expect("a gap");
        assert_eq!(gap.lost, 295);
        assert_eq!(gap.resume, EntryId(299, u64::MAX));
        assert_eq!(gap.entries_read, 300);
        // The group read up to the oldest entry kept, or past it: no gap.
        assert_eq!(snapshot(105, 405, 300, 300, Some(301)).gap(), None);
        assert_eq!(snapshot(105, 405, 300, 350, Some(351)).gap(), None);
        // Trimmed up to exactly what the group read: nothing lost.
        assert_eq!(snapshot(105, 405, 300, 299, Some(300)).gap(), None);
        // Nothing trimmed: a new group on a new stream.
        assert_eq!(snapshot(10, 10, 1, 0, None).gap(), None);
    }

    #[test]
    fn an_unknown_read_counter_counts_every_trimmed_entry() {
        let gap = snapshot(105, 405, 300, 0, None).gap().expect("a gap");
        assert_eq!(gap.lost, 300);
        // After a recovery set back without its counter: found again.
        let again = snapshot(105, 405, 300, 299, None).gap().expect("a gap");
        assert_eq!(again.resume, EntryId(299, u64::MAX));
    }

    #[test]
    fn an_emptied_stream_resumes_after_its_last_id() {
        let mut s = snapshot(0, 50, 0, 10, Some(10));
        s.last_generated = Some(EntryId(50, 0));
        let gap = s.gap().expect("a gap");
        assert_eq!((gap.lost, gap.resume), (40, EntryId(50, 0)));
        s.last_delivered = Some(EntryId(50, 0));
        s.entries_read = Some(50);
        assert_eq!(s.gap(), None);
    }

    #[test]
    fn a_gap_stays_found_after_a_read_moved_the_group_past_it() {
        // The read sent with the check delivered 20 entries from id 300,
        // then the recovery failed before setting the group back: its
        // counter (5 + 20) still shows 275 trimmed entries never read.
        let gap = snapshot(105, 405, 300, 320, Some(25)).gap().expect("a gap");
        assert_eq!((gap.lost, gap.resume), (275, EntryId(299, u64::MAX)));
        // Without the counter it cannot be told from a group that read them.
        assert_eq!(snapshot(105, 405, 300, 320, None).gap(), None);
    }

    #[test]
    fn servers_without_read_counters_are_not_checked() {
        let mut s = snapshot(105, 405, 300, 5, Some(5));
        s.entries_added = None;
        assert_eq!(s.gap(), None);
    }

    #[test]
    fn ids_step_back_across_milliseconds() {
        assert_eq!(EntryId(7, 3).before(), Some(EntryId(7, 2)));
        assert_eq!(EntryId(7, 0).before(), Some(EntryId(6, u64::MAX)));
        assert_eq!(EntryId(0, 0).before(), None);
        assert_eq!(
            EntryId::parse(&Value::BulkString(b"12-3".to_vec())),
            Some(EntryId(12, 3))
        );
        assert_eq!(EntryId::parse(&Value::BulkString(b"12".to_vec())), None);
    }

    #[test]
    fn a_snapshot_reads_xinfo_replies() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let stream = HashMap::from([
            ("length".to_string(), Value::Int(105)),
            ("entries-added".to_string(), Value::Int(405)),
            ("last-generated-id".to_string(), bulk("900-0")),
            (
                "first-entry".to_string(),
                Value::Array(vec![bulk("300-0"), Value::Array(vec![])]),
            ),
        ]);
        let group = |name: &str, read: Value| {
            HashMap::from([
                ("name".to_string(), bulk(name)),
                ("last-delivered-id".to_string(), bulk("5-0")),
                ("entries-read".to_string(), read),
            ])
        };
        let groups = [group("ap", Value::Int(400)), group("eu", Value::Int(5))];
        assert_eq!(
            Snapshot::of(&stream, &groups, "eu").gap().map(|g| g.lost),
            Some(295)
        );
        let groups = [group("eu", Value::Nil)];
        assert_eq!(
            Snapshot::of(&stream, &groups, "eu").gap().map(|g| g.lost),
            Some(300)
        );
        assert_eq!(
            Snapshot::of(&stream, &groups, "us").gap(),
            None,
            "no such group"
        );
    }
}
