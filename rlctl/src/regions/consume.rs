//! The consumer of one remote region: reads that region's stream in a
//! consumer group named for the local region, applies each component
//! locally (`RL.REGION MERGE`), and acknowledges on the remote only after
//! the apply.
//!
//! First the entries read before and not acknowledged (a restart, a lost
//! connection), then new ones, each read checked for a gap before it
//! (entries trimmed before they were read, see `gap`), which is closed by
//! merging every current component of the remote region. An entry that does not parse, that carries
//! another region's component, or that the module refuses is logged,
//! counted and acknowledged, never applied and never retried; an entry
//! whose apply failed for another reason (the local Redis unreachable,
//! failing over) is not acknowledged and is read again.

use super::config::RegionsConf;
use super::entry::{is_refusal, stream_entries, Change, StreamEntry};
use super::{gap, Counter};
use crate::store::{self, Store, Target};
use redis::Value;
use std::sync::Arc;
use std::time::Duration;

/// The consumer's name in its group (one worker per region).
const CONSUMER: &str = "sync";

/// What became of one entry.
#[derive(Debug)]
enum Outcome {
    /// Merged; the number of components that grew (0 for a repeat).
    Applied(i64),
    /// The entry is not a component (reason).
    Malformed(String),
    /// A component this consumer or the module refuses (reason).
    Refused(String),
    /// A pending entry the stream no longer holds (trimmed).
    Trimmed,
    /// Not applied for a reason that may pass: read it again.
    Retry(String),
}

/// Follows region `name`'s stream until aborted.
pub async fn run(
    regions: Arc<RegionsConf>,
    name: String,
    remote: Target,
    local: Store,
    limit: Duration,
) {
    let retry = Duration::from_millis(regions.retry_ms);
    // XREADGROUP BLOCK holds a connection: acknowledgements use another.
    let reader = remote.store_with_retry().await;
    let acker = remote.store_with_retry().await;
    let group = regions.local.as_str();
    let stream = regions.stream.as_str();
    while let Err(e) = store::create_group(&reader, stream, group).await {
        tracing::warn!(region = %name, reason = %e, "cannot create the consumer group; trying again");
        tokio::time::sleep(retry).await;
    }
    tracing::info!(region = %name, "following");
    let counter = Counter::new(local.clone(), &regions);
    let mut from = "0";
    let mut failing = false;
    // A resync owed to the region (with the gap to close, if any), tried
    // before any other read until it succeeds; and the pending entries
    // found trimmed, acknowledged once it has.
    let mut owed: Option<Option<gap::Gap>> = None;
    let mut trimmed_ids: Vec<String> = Vec::new();
    loop {
        if let Some(gap) = &owed {
            let scan = (regions.remote[&name].scan_count, limit);
            match gap::recover(
                &remote,
                &reader,
                (stream, group),
                &name,
                &local,
                gap.as_ref(),
                scan,
            )
            .await
            {
                Ok(r) => {
                    tracing::info!(region = %name, components = r.components, grew = r.grew, "resynced");
                    let fields = [("gaps", 1), ("resynced", r.components)];
                    counter
                        .add(&fields.map(|(what, n)| (format!("{name}:{what}"), n)))
                        .await;
                    ack(&acker, (stream, group), &name, &trimmed_ids).await;
                    trimmed_ids.clear();
                    owed = None;
                    from = "0";
                }
                Err(e) => {
                    tracing::warn!(region = %name, reason = %e, "cannot resync the region; trying again");
                    tokio::time::sleep(retry).await;
                    continue;
                }
            }
        }
        let cmd = store::xreadgroup(
            group,
            CONSUMER,
            regions.read_count,
            regions.block_ms,
            stream,
            from,
        );
        // New entries are read after a check for a gap before them.
        let read = if from == ">" {
            gap::checked_read(&reader, stream, group, cmd).await
        } else {
            reader.query::<Value>(&cmd).await.map(|v| (None, v))
        };
        let (gap, entries) = match read
            .map_err(|e| e.to_string())
            .and_then(|(gap, v)| Ok((gap, stream_entries(&v)?)))
        {
            Ok(e) => e,
            Err(e) => {
                if !failing {
                    tracing::warn!(region = %name, reason = %e, "cannot read the stream; trying again");
                }
                failing = true;
                from = "0";
                tokio::time::sleep(retry).await;
                continue;
            }
        };
        if failing {
            tracing::info!(region = %name, "reading again");
            failing = false;
        }
        if let Some(gap) = gap {
            // The entries just read follow the gap: read again once it is closed.
            tracing::warn!(region = %name, lost = gap.lost, resume = %gap.resume,
                "entries trimmed from the stream before they were read: merging every current component of the region");
            owed = Some(Some(gap));
            continue;
        }
        if entries.is_empty() {
            from = ">";
            continue;
        }
        let applies =
            futures_util::future::join_all(entries.iter().map(|e| apply(&local, &name, e)));
        // Each command has its timeout; this bounds the batch whatever happens.
        let outcomes = match tokio::time::timeout(limit, applies).await {
            Ok(o) => o,
            Err(_) => {
                tracing::warn!(region = %name, "applying the batch timed out; read again later");
                from = "0";
                continue;
            }
        };
        let mut done = Vec::new();
        let mut tally = Tally::default();
        for ((id, _), outcome) in entries.iter().zip(outcomes) {
            let trimmed = matches!(outcome, Outcome::Trimmed);
            if tally.add(&name, id, outcome) {
                if trimmed {
                    trimmed_ids.push(id.clone());
                } else {
                    done.push(id.as_str());
                }
            }
        }
        if !trimmed_ids.is_empty() && owed.is_none() {
            // what they carried is lost: the region's components stand in
            owed = Some(None);
        }
        ack(&acker, (stream, group), &name, &done).await;
        counter.add(&tally.fields(&name)).await;
        if tally.retry > 0 {
            from = "0";
            tokio::time::sleep(retry).await;
        }
    }
}

/// Acknowledges `ids` (none: nothing sent). A failure is logged only: the
/// entries are read again later and applied again, which is harmless.
async fn ack<T: redis::ToRedisArgs>(
    acker: &Store,
    (stream, group): (&str, &str),
    region: &str,
    ids: &[T],
) {
    if ids.is_empty() {
        return;
    }
    let acked: redis::RedisResult<i64> = acker
        .query(redis::cmd("XACK").arg(stream).arg(group).arg(ids))
        .await;
    if let Err(e) = acked {
        tracing::warn!(region, reason = %e, "XACK failed");
    }
}

async fn apply(local: &Store, remote: &str, (_, fields): &StreamEntry) -> Outcome {
    let Some(fields) = fields else {
        return Outcome::Trimmed;
    };
    let change = match Change::parse(fields) {
        Ok(c) => c,
        Err(e) => return Outcome::Malformed(e),
    };
    if change.region != remote {
        return Outcome::Refused(format!(
            "the stream of region {remote:?} carries a component of {:?}",
            change.region
        ));
    }
    match local
        .query_key::<i64>(&change.merge_cmd(), &change.key)
        .await
    {
        Ok(grew) => Outcome::Applied(grew),
        Err(e) if is_refusal(&e) => Outcome::Refused(format!("RL.REGION MERGE: {e}")),
        Err(e) => Outcome::Retry(format!("RL.REGION MERGE: {e}")),
    }
}

/// The outcomes of one batch.
#[derive(Debug, Default)]
struct Tally {
    applied: i64,
    grew: i64,
    malformed: i64,
    refused: i64,
    trimmed: i64,
    retry: i64,
}

impl Tally {
    /// Counts (and logs) one outcome; true when the entry is done with
    /// (to acknowledge).
    fn add(&mut self, region: &str, id: &str, outcome: Outcome) -> bool {
        match outcome {
            Outcome::Applied(grew) => {
                self.applied += 1;
                self.grew += grew;
            }
            Outcome::Malformed(why) => {
                self.malformed += 1;
                tracing::warn!(region, entry = id, reason = %why, "malformed entry: acknowledged, not applied");
            }
            Outcome::Refused(why) => {
                self.refused += 1;
                tracing::warn!(region, entry = id, reason = %why, "refused entry: acknowledged, not applied");
            }
            Outcome::Trimmed => {
                self.trimmed += 1;
                tracing::warn!(
                    region,
                    entry = id,
                    "pending entry trimmed from the stream before it was applied"
                );
            }
            Outcome::Retry(why) => {
                self.retry += 1;
                tracing::warn!(region, entry = id, reason = %why, "not applied; read again later");
                return false;
            }
        }
        true
    }

    /// The counters to add, named `<region>:<outcome>`.
    fn fields(&self, region: &str) -> Vec<(String, i64)> {
        [
            ("applied", self.applied),
            ("grew", self.grew),
            ("malformed", self.malformed),
            ("refused", self.refused),
            ("trimmed", self.trimmed),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| (format!("{region}:{what}"), n))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_may_pass_is_left_unacknowledged() {
        let mut t = Tally::default();
        assert!(t.add("us", "1-0", Outcome::Applied(1)));
        assert!(t.add("us", "2-0", Outcome::Applied(0)));
        assert!(t.add("us", "3-0", Outcome::Malformed("x".into())));
        assert!(t.add("us", "4-0", Outcome::Refused("x".into())));
        assert!(t.add("us", "5-0", Outcome::Trimmed));
        assert!(!t.add("us", "6-0", Outcome::Retry("x".into())));
        assert_eq!(
            t.fields("us"),
            [
                ("us:applied".to_string(), 2),
                ("us:grew".to_string(), 1),
                ("us:malformed".to_string(), 1),
                ("us:refused".to_string(), 1),
                ("us:trimmed".to_string(), 1),
            ]
        );
    }
}
