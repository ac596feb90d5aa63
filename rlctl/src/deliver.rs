//! The senders: one bounded queue per destination, a paced start (at most
//! `delivery.rate_per_second` sends a second) and `delivery.concurrency`
//! sends in flight. A delivery is recorded as pending in Redis before its
//! first attempt (`retry`); a failed attempt is due again after a capped
//! exponential backoff, for `delivery.retry_for_ms`. Its end is recorded:
//! a marker key (`sent`, `failed` or `expired`, so a restart resends
//! nothing) and an audit entry with the result. Every failed attempt is
//! logged with the destination and the reason.

use crate::alert::{signature, Delivery, Payload};
use crate::audit::Audit;
use crate::config::{Config, Dest, SmtpTls};
use crate::retry::{self, Keys, Pending, Source};
use crate::secrets::Secrets;
use crate::store::{now_ms, Store};
use crate::text::redact_url;
use lettre::message::header::ContentType;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

/// Why one attempt failed, and whether another attempt can help.
struct Failure {
    reason: String,
    permanent: bool,
}

/// What every sender needs.
struct Shared {
    conf: Arc<Config>,
    secrets: Arc<Secrets>,
    store: Store,
    audit: Audit,
    keys: Keys,
    http: reqwest::Client,
    smtp: Option<(AsyncSmtpTransport<Tokio1Executor>, lettre::message::Mailbox)>,
    /// The delivery id of every delivery queued or in flight in this process.
    pending: Mutex<HashSet<String>>,
}

/// The queues of all destinations.
#[derive(Clone)]
pub struct Senders {
    queues: HashMap<Dest, mpsc::Sender<Delivery>>,
    shared: Arc<Shared>,
}

impl Senders {
    /// Starts one sender task per destination.
    pub fn start(
        conf: Arc<Config>,
        secrets: Arc<Secrets>,
        store: Store,
        audit: Audit,
    ) -> Result<Senders, String> {
        let d = &conf.delivery;
        let timeout = Duration::from_millis(d.timeout_ms);
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("rlctl/", env!("CARGO_PKG_VERSION")))
            // A redirect is an answer, never followed: following it would
            // send the signed body wherever a receiver points (an internal
            // address) and report that address's answer as the receiver's.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        let smtp = match &conf.email {
            Some(e) => Some((
                smtp_transport(e, &secrets, timeout)?,
                e.from.parse().map_err(|err| format!("email.from: {err}"))?,
            )),
            None => None,
        };
        let shared = Arc::new(Shared {
            keys: Keys::new(&conf),
            conf: conf.clone(),
            secrets,
            store,
            audit,
            http,
            smtp,
            pending: Mutex::new(HashSet::new()),
        });
        let mut queues = HashMap::new();
        for dest in [
            Dest::TenantWebhook,
            Dest::Email,
            Dest::Internal,
            Dest::Page,
            Dest::PageAccountOwner,
        ] {
            let (tx, rx) = mpsc::channel(d.queue);
            queues.insert(dest, tx);
            let pace = Duration::from_secs(1) / d.rate_per_second;
            tokio::spawn(run_queue(dest, rx, shared.clone(), pace, d.concurrency));
        }
        Ok(Senders { queues, shared })
    }

    /// Records `delivery` as pending and queues it, unless it was already
    /// sent or given up (its marker exists) or is pending already (queued
    /// here, or left by an earlier run: the poller resends it when due).
    /// Waits while the queue is full. Returns whether it was queued.
    pub async fn submit(&self, mut delivery: Delivery) -> Result<bool, String> {
        let id = retry::delivery_id(&delivery);
        if self.in_flight(&id) {
            return Ok(false);
        }
        let exists: bool = self
            .shared
            .store
            .query(redis::cmd("EXISTS").arg(&delivery.marker))
            .await
            .map_err(|e| format!("EXISTS {}: {e}", delivery.marker))?;
        if exists {
            return Ok(false);
        }
        let now = now_ms();
        delivery.first_ms = now;
        // Due again if this attempt never ends (the worker killed).
        let claim = i64::try_from(self.shared.conf.delivery.timeout_ms * 2).unwrap_or(i64::MAX);
        if !retry::add(
            &self.shared.store,
            &self.shared.keys,
            &delivery,
            now + claim,
        )
        .await?
        {
            return Ok(false);
        }
        self.resume(delivery).await
    }

    /// Queues a pending delivery (unless queued or in flight here).
    pub async fn resume(&self, delivery: Delivery) -> Result<bool, String> {
        let id = retry::delivery_id(&delivery);
        if !self.lock_pending().insert(id.clone()) {
            return Ok(false);
        }
        let queue = self
            .queues
            .get(&delivery.dest)
            .ok_or("no queue for the destination")?;
        if queue.send(delivery).await.is_err() {
            self.lock_pending().remove(&id);
            return Err("the sender stopped".into());
        }
        Ok(true)
    }

    /// Whether delivery `id` is queued or in flight here.
    pub fn in_flight(&self, id: &str) -> bool {
        self.lock_pending().contains(id)
    }

    /// Ends pending delivery `id`, which cannot be made any more (its
    /// destination was removed from the configuration): `failed`.
    pub async fn give_up(&self, id: &str, rec: Pending, why: &str) {
        tracing::error!(destination = rec.dest.name(), delivery = %id, reason = %why, "delivery failed");
        let fields = [
            ("alert_id", id.to_string()),
            ("dest", rec.dest.name().to_string()),
            ("result", "failed".to_string()),
            ("attempts", rec.attempts.to_string()),
            ("reason", why.to_string()),
        ];
        self.shared.audit.record_or_log("delivery", &fields).await;
        if let Err(e) = retry::remove(&self.shared.store, &self.shared.keys, id).await {
            tracing::error!(destination = "redis", reason = %e, "pending delivery not removed");
        }
    }

    /// Deliveries queued or in flight.
    pub fn pending(&self) -> usize {
        self.lock_pending().len()
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

fn smtp_transport(
    e: &crate::config::EmailConf,
    secrets: &Secrets,
    timeout: Duration,
) -> Result<AsyncSmtpTransport<Tokio1Executor>, String> {
    let builder = match e.tls {
        SmtpTls::None => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&e.smtp_host),
        SmtpTls::Starttls => AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&e.smtp_host)
            .map_err(|err| format!("email.smtp_host: {err}"))?,
        SmtpTls::Tls => AsyncSmtpTransport::<Tokio1Executor>::relay(&e.smtp_host)
            .map_err(|err| format!("email.smtp_host: {err}"))?,
    };
    let mut builder = builder.port(e.smtp_port).timeout(Some(timeout));
    if let Some((user, password)) = &secrets.smtp_credentials {
        builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
    }
    Ok(builder.build())
}

async fn run_queue(
    dest: Dest,
    mut rx: mpsc::Receiver<Delivery>,
    shared: Arc<Shared>,
    pace: Duration,
    concurrency: usize,
) {
    let mut ticks = tokio::time::interval(pace);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let slots = Arc::new(Semaphore::new(concurrency));
    while let Some(delivery) = rx.recv().await {
        ticks.tick().await;
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            deliver(dest, delivery, &shared).await;
            drop(permit);
        });
    }
}

/// One attempt; then the delivery ends (sent, refused for good, or past
/// `delivery.retry_for_ms`) or is due again after its backoff.
async fn deliver(dest: Dest, mut d: Delivery, shared: &Shared) {
    d.attempts += 1;
    let failure = match send_once(&d, shared).await {
        Ok(()) => {
            tracing::info!(destination = dest.name(), alert = %d.alert_id, attempts = d.attempts, "delivered");
            return finish(dest, &d, "sent", String::new(), shared).await;
        }
        Err(f) => f,
    };
    let now = now_ms();
    let horizon = i64::try_from(shared.conf.delivery.retry_for_ms).unwrap_or(i64::MAX);
    if failure.permanent || now - d.first_ms >= horizon {
        let result = if failure.permanent {
            "failed"
        } else {
            "expired"
        };
        tracing::error!(destination = dest.name(), alert = %d.alert_id, attempts = d.attempts, result, reason = %failure.reason, "delivery failed");
        finish(dest, &d, result, failure.reason.clone(), shared).await;
        if result == "expired" && !matches!(d.source, Source::Expired { .. }) {
            raise_expiry(&d, failure.reason, shared).await;
        }
        return;
    }
    let wait = retry::backoff_ms(&shared.conf.delivery, d.attempts);
    tracing::warn!(destination = dest.name(), alert = %d.alert_id, attempt = d.attempts, retry_in_ms = wait, reason = %failure.reason, "delivery attempt failed");
    let due = now + i64::try_from(wait).unwrap_or(i64::MAX / 2);
    let saved = match retry::save(&shared.store, &shared.keys, &d, &failure.reason).await {
        Ok(()) => retry::reschedule(&shared.store, &shared.keys, &d, due).await,
        Err(e) => Err(e),
    };
    if let Err(e) = saved {
        tracing::error!(destination = "redis", alert = %d.alert_id, reason = %e, "retry not recorded; due at its earlier time");
    }
    unpend(&d, shared);
}

/// Records the end of a delivery: marker, audit entry, pending record gone.
async fn finish(dest: Dest, d: &Delivery, result: &str, reason: String, shared: &Shared) {
    set_marker(d, result, shared).await;
    let mut fields = vec![
        ("alert_id", d.alert_id.clone()),
        (d.subject.0, d.subject.1.clone()),
        ("dest", dest.name().to_string()),
        ("result", result.to_string()),
        ("attempts", d.attempts.to_string()),
        ("target", target(&d.payload)),
    ];
    if !reason.is_empty() {
        fields.push(("reason", reason));
    }
    shared.audit.record_or_log("delivery", &fields).await;
    let id = retry::delivery_id(d);
    if let Err(e) = retry::remove(&shared.store, &shared.keys, &id).await {
        tracing::error!(destination = "redis", reason = %e, "pending delivery not removed");
    }
    unpend(d, shared);
}

fn unpend(d: &Delivery, shared: &Shared) {
    shared
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&retry::delivery_id(d));
}

/// An alert given up is itself alerted: `rl.delivery_expired` to the
/// internal webhook (recorded as pending like any delivery; the poller
/// sends it).
async fn raise_expiry(d: &Delivery, reason: String, shared: &Shared) {
    let source = Source::Expired {
        alert_id: d.alert_id.clone(),
        dest: d.dest,
        subject: (d.subject.0.to_string(), d.subject.1.clone()),
        target: target(&d.payload),
        attempts: d.attempts,
        first_ms: d.first_ms,
        reason,
    };
    let added = match retry::rebuild(&shared.conf, &shared.secrets, &source, Dest::Internal) {
        Ok(mut e) => {
            e.first_ms = now_ms();
            retry::add(&shared.store, &shared.keys, &e, e.first_ms).await
        }
        Err(why) => Err(why),
    };
    if let Err(why) = added {
        tracing::error!(destination = "internal", alert = %d.alert_id, reason = %why, "the expiry of a delivery is not alerted");
    }
}

/// Records the outcome; retried a few times, since a lost marker means a
/// resend after a restart.
async fn set_marker(d: &Delivery, result: &str, shared: &Shared) {
    let ttl = d.marker_ttl_ms.max(1000);
    for attempt in 1..=3 {
        let r: redis::RedisResult<()> = shared
            .store
            .query(
                redis::cmd("SET")
                    .arg(&d.marker)
                    .arg(result)
                    .arg("PX")
                    .arg(ttl),
            )
            .await;
        match r {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(destination = "redis", marker = %d.marker, attempt, reason = %e, "marker not written");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Where a payload goes, for the audit trail (never a secret).
fn target(p: &Payload) -> String {
    match p {
        Payload::Http { url, .. } => redact_url(url),
        Payload::Email { to, .. } => to.join(","),
    }
}

async fn send_once(d: &Delivery, shared: &Shared) -> Result<(), Failure> {
    match &d.payload {
        Payload::Http { url, body, secret } => {
            let mut req = shared
                .http
                .post(url)
                .header("content-type", "application/json")
                .header(
                    "x-rlctl-delivery",
                    format!("{}/{}", d.alert_id, d.dest.name()),
                )
                .body(body.clone());
            if let Some(secret) = secret {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |t| t.as_secs());
                req = req.header("x-rlctl-signature", signature(secret, now, body));
            }
            let resp = req.send().await.map_err(|e| Failure {
                reason: format!("POST {}: {}", redact_url(url), e.without_url()),
                permanent: false,
            })?;
            let status = resp.status();
            if status.is_success() {
                return Ok(());
            }
            if status.is_redirection() {
                // Retried like any other answer but a refusal: the
                // receiver may stop redirecting.
                return Err(Failure {
                    reason: format!(
                        "POST {}: HTTP {status} (redirects are not followed)",
                        redact_url(url)
                    ),
                    permanent: false,
                });
            }
            let text = resp.text().await.unwrap_or_default();
            // 4xx other than 408 and 429 will not change by retrying.
            let permanent =
                status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429;
            Err(Failure {
                reason: http_reason(url, status, &text),
                permanent,
            })
        }
        Payload::Email { to, subject, body } => {
            let (transport, from) = shared.smtp.as_ref().ok_or(Failure {
                reason: "no [email] section".into(),
                permanent: true,
            })?;
            let mut builder = Message::builder()
                .from(from.clone())
                .subject(subject.clone())
                .message_id(Some(message_id(&d.alert_id, d.dest)))
                .header(ContentType::TEXT_PLAIN);
            for addr in to {
                let mailbox = addr.parse().map_err(|e| Failure {
                    reason: format!("address {addr:?}: {e}"),
                    permanent: true,
                })?;
                builder = builder.to(mailbox);
            }
            let message = builder.body(body.clone()).map_err(|e| Failure {
                reason: format!("building the email: {e}"),
                permanent: true,
            })?;
            transport
                .send(message)
                .await
                .map(|_| ())
                .map_err(|e| Failure {
                    reason: format!("SMTP to {}: {e}", to.join(",")),
                    permanent: e.is_permanent(),
                })
        }
    }
}

/// The reason of an HTTP answer that is not a success: the status and
/// the start of the receiver's body, escaped (it is logged and stored: a
/// receiver cannot write a line of its own into the log).
fn http_reason(url: &str, status: reqwest::StatusCode, body: &str) -> String {
    let url = redact_url(url);
    let body = crate::text::escape(body.trim(), 200);
    if body.is_empty() {
        format!("POST {url}: HTTP {status}")
    } else {
        format!("POST {url}: HTTP {status}: {body}")
    }
}

/// A Message-ID derived from the alert, so a resent email is recognisable.
fn message_id(alert_id: &str, dest: Dest) -> String {
    let digest = Sha256::digest(format!("{alert_id}/{}", dest.name()).as_bytes());
    format!("<{}@rlctl>", &hex::encode(digest)[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receivers_body_cannot_forge_a_log_line() {
        let body = "\x1b[31mFAKE\x1b[0m\r\n2026-12-03T00:00:00Z  INFO rlctl::deliver: delivered";
        let reason = http_reason("http://h/x", reqwest::StatusCode::SERVICE_UNAVAILABLE, body);
        assert!(!reason.chars().any(char::is_control), "{reason}");
        assert!(reason.contains("\\r\\n2026"), "{reason}");
        let long = "x".repeat(10_000);
        let reason = http_reason("http://h/x", reqwest::StatusCode::BAD_GATEWAY, &long);
        assert!(reason.len() < 300, "{}", reason.len());
    }

    #[test]
    fn a_webhooks_password_reaches_no_reason_and_no_audit_target() {
        let url = "https://user:s3cret@hooks.test/rl";
        let reason = http_reason(url, reqwest::StatusCode::BAD_GATEWAY, "down");
        let payload = Payload::Http {
            url: url.into(),
            body: Vec::new(),
            secret: None,
        };
        for shown in [reason, target(&payload)] {
            assert!(!shown.contains("s3cret") && shown.contains("https://***@hooks.test/rl"));
        }
    }
}
