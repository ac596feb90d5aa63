//! Loopback receivers: an HTTP webhook receiver (tiny_http) that records
//! every request and can be told to fail, and an SMTP receiver (the
//! `mailin` protocol state machine over a TCP listener) that records every
//! message.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the webhook receiver got.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Request {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    /// The `x-rlctl-delivery` header (the idempotency key).
    pub fn delivery(&self) -> String {
        self.headers
            .get("x-rlctl-delivery")
            .cloned()
            .unwrap_or_default()
    }
}

/// Failure rule for a path: answer `status` to the next `times` requests
/// (`usize::MAX`: always).
#[derive(Debug, Clone, Copy)]
pub struct Fail {
    pub status: u16,
    pub times: usize,
}

/// The webhook receiver; stops on drop.
pub struct Webhooks {
    pub base: String,
    requests: Arc<Mutex<Vec<Request>>>,
    fails: Arc<Mutex<HashMap<String, Fail>>>,
    redirects: Arc<Mutex<HashMap<String, String>>>,
    stop: Arc<AtomicBool>,
}

impl Webhooks {
    /// Listens on an ephemeral loopback port.
    pub fn start() -> Webhooks {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("webhook receiver");
        let port = server.server_addr().to_ip().expect("ip addr").port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let fails: Arc<Mutex<HashMap<String, Fail>>> = Arc::new(Mutex::new(HashMap::new()));
        let redirects: Arc<Mutex<HashMap<String, String>>> = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, f, s) = (requests.clone(), fails.clone(), stop.clone());
        let to = redirects.clone();
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Ok(Some(mut req)) = server.recv_timeout(Duration::from_millis(100)) else {
                    continue;
                };
                let mut body = String::new();
                let _ = req.as_reader().read_to_string(&mut body);
                let headers = req
                    .headers()
                    .iter()
                    .map(|h| {
                        (
                            h.field.as_str().as_str().to_ascii_lowercase(),
                            h.value.as_str().to_string(),
                        )
                    })
                    .collect();
                let path = req.url().to_string();
                r.lock().unwrap().push(Request {
                    path: path.clone(),
                    headers,
                    body,
                });
                let status = {
                    let mut fails = f.lock().unwrap();
                    match fails.get_mut(&path) {
                        Some(rule) if rule.times > 0 => {
                            if rule.times != usize::MAX {
                                rule.times -= 1;
                            }
                            rule.status
                        }
                        _ => 200,
                    }
                };
                let location = to.lock().unwrap().get(&path).cloned();
                let response = match location {
                    Some(l) => tiny_http::Response::from_string("moved")
                        .with_status_code(307)
                        .with_header(
                            tiny_http::Header::from_bytes("Location", l.as_bytes())
                                .expect("header"),
                        ),
                    None => tiny_http::Response::from_string("ok").with_status_code(status),
                };
                let _ = req.respond(response);
            }
        });
        Webhooks {
            base: format!("http://127.0.0.1:{port}"),
            requests,
            fails,
            redirects,
            stop,
        }
    }

    /// Makes `path` answer `307 Temporary Redirect` to `location`.
    pub fn redirect(&self, path: &str, location: &str) {
        self.redirects
            .lock()
            .unwrap()
            .insert(path.to_string(), location.to_string());
    }

    /// Makes `path` answer `fail.status` for the next `fail.times` requests.
    pub fn fail(&self, path: &str, fail: Fail) {
        self.fails.lock().unwrap().insert(path.to_string(), fail);
    }

    /// Every request so far.
    pub fn all(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// The `key` field of every internal webhook body, in arrival order.
    pub fn internal_keys(&self) -> Vec<String> {
        self.to("/internal")
            .iter()
            .map(|r| r.json()["key"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// The requests to `path`.
    pub fn to(&self, path: &str) -> Vec<Request> {
        self.all().into_iter().filter(|r| r.path == path).collect()
    }
}

impl Drop for Webhooks {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One message the SMTP receiver got.
#[derive(Debug, Clone)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

impl Mail {
    /// A header's value (first occurrence, unfolded).
    pub fn header(&self, name: &str) -> Option<String> {
        let head = self.data.split("\r\n\r\n").next().unwrap_or("");
        let unfolded = head.replace("\r\n ", " ").replace("\r\n\t", " ");
        unfolded.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    }
}

#[derive(Clone)]
struct Collector {
    mails: Arc<Mutex<Vec<Mail>>>,
    current: Option<Mail>,
}

impl mailin::Handler for Collector {
    fn data_start(
        &mut self,
        _domain: &str,
        from: &str,
        _is8bit: bool,
        to: &[String],
    ) -> mailin::Response {
        self.current = Some(Mail {
            from: from.to_string(),
            to: to.to_vec(),
            data: String::new(),
        });
        mailin::response::OK
    }
    fn data(&mut self, buf: &[u8]) -> std::io::Result<()> {
        if let Some(m) = &mut self.current {
            m.data.push_str(&String::from_utf8_lossy(buf));
        }
        Ok(())
    }
    fn data_end(&mut self) -> mailin::Response {
        if let Some(m) = self.current.take() {
            self.mails.lock().unwrap().push(m);
        }
        mailin::response::OK
    }
}

/// The SMTP receiver; stops accepting on drop.
pub struct Smtp {
    pub port: u16,
    mails: Arc<Mutex<Vec<Mail>>>,
    stop: Arc<AtomicBool>,
}

impl Smtp {
    /// Listens on an ephemeral loopback port.
    pub fn start() -> Smtp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("smtp listener");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let mails = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (m, s) = (mails.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let collector = Collector {
                            mails: m.clone(),
                            current: None,
                        };
                        std::thread::spawn(move || serve(stream, collector));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Smtp { port, mails, stop }
    }

    /// Every message so far.
    pub fn all(&self) -> Vec<Mail> {
        self.mails.lock().unwrap().clone()
    }
}

impl Drop for Smtp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One SMTP session, bounded: 30 s of inactivity ends it.
fn serve(stream: std::net::TcpStream, collector: Collector) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let mut session =
        mailin::SessionBuilder::new("smtp.test").build(IpAddr::from([127, 0, 0, 1]), collector);
    if session.greeting().write_to(&mut out).is_err() {
        return;
    }
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let resp = session.process(&line);
        match resp.action {
            mailin::Action::NoReply => {}
            mailin::Action::Close => {
                let _ = resp.write_to(&mut out);
                let _ = out.flush();
                return;
            }
            _ => {
                if resp.write_to(&mut out).is_err() {
                    return;
                }
            }
        }
    }
}
