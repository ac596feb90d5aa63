//! The senders: one bounded queue per destination, a paced start (at most
//! `delivery.rate_per_second` sends a second) and `delivery.concurrency`
//! sends in flight; each delivery retried with exponential backoff, then
//! recorded: a marker key (`sent` or `failed`, so a restart resends
//! nothing) and an audit entry with the result. Every failed attempt is
//! logged with the destination and the reason.

use crate::alert::{signature, Delivery, Payload};
use crate::audit::Audit;
use crate::config::{Config, Dest, SmtpTls};
use crate::secrets::Secrets;
use crate::store::Store;
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
    store: Store,
    audit: Audit,
    http: reqwest::Client,
    smtp: Option<(AsyncSmtpTransport<Tokio1Executor>, lettre::message::Mailbox)>,
    attempts: u32,
    backoff: Duration,
    backoff_max: Duration,
    /// `marker` of every delivery queued or in flight in this process.
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
        conf: &Config,
        secrets: &Secrets,
        store: Store,
        audit: Audit,
    ) -> Result<Senders, String> {
        let d = &conf.delivery;
        let timeout = Duration::from_millis(d.timeout_ms);
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("rlctl/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        let smtp = match &conf.email {
            Some(e) => Some((
                smtp_transport(e, secrets, timeout)?,
                e.from.parse().map_err(|err| format!("email.from: {err}"))?,
            )),
            None => None,
        };
        let shared = Arc::new(Shared {
            store,
            audit,
            http,
            smtp,
            attempts: d.attempts,
            backoff: Duration::from_millis(d.backoff_ms),
            backoff_max: Duration::from_millis(d.backoff_max_ms),
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

    /// Queues `delivery` unless it was already sent or finally failed (its
    /// marker exists) or is already queued here. Waits while the queue is
    /// full. Returns whether it was queued.
    pub async fn submit(&self, delivery: Delivery) -> Result<bool, String> {
        if self.lock_pending().contains(&delivery.marker) {
            return Ok(false);
        }
        let exists: bool = self
            .shared
            .store
            .query(redis::cmd("EXISTS").arg(&delivery.marker))
            .await
            .map_err(|e| format!("EXISTS {}: {e}", delivery.marker))?;
        if exists || !self.lock_pending().insert(delivery.marker.clone()) {
            return Ok(false);
        }
        let queue = self
            .queues
            .get(&delivery.dest)
            .ok_or("no queue for the destination")?;
        let marker = delivery.marker.clone();
        if queue.send(delivery).await.is_err() {
            self.lock_pending().remove(&marker);
            return Err("the sender stopped".into());
        }
        Ok(true)
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

async fn deliver(dest: Dest, d: Delivery, shared: &Shared) {
    let mut attempt = 0;
    let mut wait = shared.backoff;
    let (result, reason) = loop {
        attempt += 1;
        match send_once(&d, shared).await {
            Ok(()) => break ("sent", String::new()),
            Err(f) => {
                let last = f.permanent || attempt >= shared.attempts;
                tracing::warn!(destination = dest.name(), alert = %d.alert_id, attempt, reason = %f.reason, "delivery attempt failed");
                if last {
                    break ("failed", f.reason);
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(shared.backoff_max);
            }
        }
    };
    if result == "failed" {
        tracing::error!(destination = dest.name(), alert = %d.alert_id, attempts = attempt, reason = %reason, "delivery failed");
    } else {
        tracing::info!(destination = dest.name(), alert = %d.alert_id, attempts = attempt, "delivered");
    }
    set_marker(&d, result, shared).await;
    let mut fields = vec![
        ("alert_id", d.alert_id.clone()),
        (d.subject.0, d.subject.1.clone()),
        ("dest", dest.name().to_string()),
        ("result", result.to_string()),
        ("attempts", attempt.to_string()),
        ("target", target(&d.payload)),
    ];
    if !reason.is_empty() {
        fields.push(("reason", reason));
    }
    shared.audit.record_or_log("delivery", &fields).await;
    shared
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&d.marker);
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
        Payload::Http { url, .. } => url.clone(),
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
                reason: format!("POST {url}: {e}"),
                permanent: false,
            })?;
            let status = resp.status();
            if status.is_success() {
                return Ok(());
            }
            let text = resp.text().await.unwrap_or_default();
            let text: String = text.chars().take(200).collect();
            // 4xx other than 408 and 429 will not change by retrying.
            let permanent =
                status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429;
            Err(Failure {
                reason: format!("POST {url}: HTTP {status}: {text}"),
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

/// A Message-ID derived from the alert, so a resent email is recognisable.
fn message_id(alert_id: &str, dest: Dest) -> String {
    let digest = Sha256::digest(format!("{alert_id}/{}", dest.name()).as_bytes());
    format!("<{}@rlctl>", &hex::encode(digest)[..32])
}
