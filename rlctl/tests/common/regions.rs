//! Three regions on loopback for the multi-region tests: `eu` and `us`
//! (one server each) and `ap` (a cluster of three primaries), every server
//! with the module and its region; one `rlctl regions sync` worker per
//! region; a TCP proxy the test controls on every link from a worker to a
//! one-server region (a cluster's clients follow the addresses the nodes
//! announce, so links to `ap` are direct).

use super::{fresh_dir, Cluster, Server, Worker};
use redis::{ConnectionLike, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every region's name, as `rl.regions`.
pub const REGIONS: &str = "eu,us,ap";
/// The stream each region's changes go to (the worker's default).
pub const STREAM: &str = "rl:region:changes";
/// The workers' `regions.retry_ms` and every `timeout_ms`.
pub const RETRY_MS: u64 = 200;
pub const TIMEOUT_MS: u64 = 2000;

/// A loopback TCP proxy to one port; `cut` closes every connection and
/// refuses new ones until `heal`.
pub struct Proxy {
    pub port: u16,
    up: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Listens on an ephemeral loopback port, forwarding to `to`.
    pub fn start(to: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("addr").port();
        let up = Arc::new(AtomicBool::new(true));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (up2, open2) = (up.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !up2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let mut open = open2.lock().expect("lock");
                for s in [&client, &server] {
                    open.push(s.try_clone().expect("clone"));
                }
                pipe(&client, &server);
                pipe(&server, &client);
            }
        });
        Proxy { port, up, open }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The partition: every connection closed, new ones refused.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for s in self.open.lock().expect("lock").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// The link is back.
    pub fn heal(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either end closes.
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (mut from, mut to) = (
        from.try_clone().expect("clone"),
        to.try_clone().expect("clone"),
    );
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.flush();
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

/// One region's Redis.
pub enum Redis {
    Single(Server),
    Cluster(Cluster),
}

/// One region: its name and its Redis.
pub struct Region {
    pub name: &'static str,
    pub redis: Redis,
}

impl Region {
    /// A one-server region; `aof`: append-only file, fsync'd every write.
    pub fn single(name: &'static str, aof: bool) -> Region {
        let mut args = vec!["region", name, "regions", REGIONS];
        if aof {
            args.extend(["--appendonly", "yes", "--appendfsync", "always"]);
        }
        Region {
            name,
            redis: Redis::Single(Server::launch(false, &args)),
        }
    }

    /// A region on a cluster of three primaries.
    pub fn cluster(name: &'static str) -> Region {
        let args = ["region", name, "regions", REGIONS];
        Region {
            name,
            redis: Redis::Cluster(Cluster::start_with(3, 0, &args)),
        }
    }

    /// The primaries.
    pub fn primaries(&self) -> usize {
        match &self.redis {
            Redis::Single(_) => 1,
            Redis::Cluster(c) => c.nodes.len(),
        }
    }

    /// A connection routed by key.
    pub fn con(&self) -> Box<dyn ConnectionLike + Send> {
        match &self.redis {
            Redis::Single(s) => Box::new(s.client()),
            Redis::Cluster(c) => Box::new(c.client()),
        }
    }

    /// The one server (panics for a cluster region).
    pub fn server(&mut self) -> &mut Server {
        match &mut self.redis {
            Redis::Single(s) => s,
            Redis::Cluster(_) => panic!("{} is a cluster", self.name),
        }
    }

    /// The `[redis]` section's urls and cluster flag of this region, each
    /// URL through `via` when given.
    fn section(&self, via: Option<&Proxy>) -> String {
        let (urls, cluster) = match (&self.redis, via) {
            (_, Some(p)) => (vec![p.url()], false),
            (Redis::Single(s), None) => (vec![s.url()], false),
            (Redis::Cluster(c), None) => (c.urls(), true),
        };
        let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
        format!(
            "urls = [{}]\ncluster = {cluster}\ntimeout_ms = {TIMEOUT_MS}\n",
            urls.join(", ")
        )
    }
}

/// `RL.QUOTA key limit MONTH COST cost REGION`: whether it was admitted.
pub fn take(con: &mut dyn ConnectionLike, key: &str, limit: u64, cost: u64) -> bool {
    let r: Vec<i64> = redis::cmd("RL.QUOTA")
        .arg(key)
        .arg(limit)
        .arg("MONTH")
        .arg("COST")
        .arg(cost)
        .arg("REGION")
        .query(con)
        .expect("RL.QUOTA ... REGION");
    r[0] == 1
}

/// The components of `key` (`RL.REGION READ`): region -> (added, refunded).
pub fn components(con: &mut dyn ConnectionLike, key: &str) -> BTreeMap<String, (u64, u64)> {
    let v: Value = redis::cmd("RL.REGION")
        .arg("READ")
        .arg(key)
        .query(con)
        .expect("RL.REGION READ");
    let mut out = BTreeMap::new();
    let Value::Array(parts) = v else {
        return out;
    };
    let Some(Value::Array(list)) = parts.get(2) else {
        panic!("RL.REGION READ {key}: {parts:?}");
    };
    for c in list {
        let (name, added, refunded): (String, u64, u64) =
            redis::from_redis_value(c).expect("a component");
        out.insert(name, (added, refunded));
    }
    out
}

/// Three regions, their proxies and their workers.
pub struct World {
    pub regions: Vec<Region>,
    /// `(worker's region, remote region)` -> the proxy on that link.
    pub proxies: BTreeMap<(&'static str, &'static str), Proxy>,
    pub workers: Vec<Option<Worker>>,
    pub configs: Vec<PathBuf>,
    pub dir: PathBuf,
}

impl World {
    /// `eu` and `us` (one server each; `aof` for both), `ap` (a cluster),
    /// a proxy on each link to `eu` and `us`, and the three workers.
    pub fn start(tag: &str, aof: bool) -> World {
        World::launch(tag, aof, true)
    }

    /// [`World::start`]; `proxied`: false for direct links everywhere.
    pub fn launch(tag: &str, aof: bool, proxied: bool) -> World {
        World::launch_with(tag, aof, proxied, "")
    }

    /// [`World::launch`], with `extra` (lines of `[regions]`) added to
    /// every worker's configuration.
    pub fn launch_with(tag: &str, aof: bool, proxied: bool, extra: &str) -> World {
        let regions = vec![
            Region::single("eu", aof),
            Region::single("us", aof),
            Region::cluster("ap"),
        ];
        let dir = fresh_dir(tag);
        let mut proxies = BTreeMap::new();
        let mut configs = Vec::new();
        for local in &regions {
            let mut text = format!(
                "[redis]\n{}topology_refresh_ms = 300\n\n[regions]\nlocal = {:?}\n\
                 block_ms = 500\nretry_ms = {RETRY_MS}\n{extra}",
                local.section(None),
                local.name
            );
            for remote in regions.iter().filter(|r| r.name != local.name) {
                let proxy = match &remote.redis {
                    Redis::Single(s) if proxied => Some(Proxy::start(s.port)),
                    _ => None,
                };
                text.push_str(&format!(
                    "\n[regions.remote.{}]\n{}",
                    remote.name,
                    remote.section(proxy.as_ref())
                ));
                if let Some(p) = proxy {
                    proxies.insert((local.name, remote.name), p);
                }
            }
            let cfg = dir.join(format!("{}.toml", local.name));
            std::fs::write(&cfg, text).expect("write a worker configuration");
            configs.push(cfg);
        }
        let mut world = World {
            regions,
            proxies,
            workers: vec![],
            configs,
            dir,
        };
        for i in 0..3 {
            let w = world.worker(i);
            world.workers.push(Some(w));
        }
        world
    }

    /// Starts region `i`'s worker and waits until it has scanned every
    /// local primary and follows both remote regions.
    pub fn worker(&self, i: usize) -> Worker {
        let primaries = self.regions[i].primaries();
        Worker::run(
            &self.dir,
            &self.configs[i],
            &[],
            &["regions", "sync"],
            |log| {
                log.matches("reconciled").count() >= primaries
                    && log.matches("following").count() >= 2
            },
        )
    }

    /// The proxy on the link from `worker`'s region to `remote`.
    pub fn link(&self, worker: &str, remote: &str) -> &Proxy {
        self.proxies
            .iter()
            .find(|((w, r), _)| *w == worker && *r == remote)
            .map(|(_, p)| p)
            .expect("a proxied link")
    }

    /// A connection to every region, in order.
    pub fn cons(&self) -> Vec<Box<dyn ConnectionLike + Send>> {
        self.regions.iter().map(Region::con).collect()
    }

    /// The worker counters of region `i` (`<stream>:counts`).
    pub fn counts(&self, i: usize) -> BTreeMap<String, i64> {
        redis::cmd("HGETALL")
            .arg(format!("{STREAM}:counts"))
            .query(&mut *self.regions[i].con())
            .expect("HGETALL counts")
    }
}

/// Waits until every region holds `expected` as the components of every
/// key of `keys`; the wait is bounded by `within`.
pub fn wait_converged(
    cons: &mut [Box<dyn ConnectionLike + Send>],
    keys: &[String],
    expected: &BTreeMap<String, BTreeMap<String, (u64, u64)>>,
    within: Duration,
) {
    let start = std::time::Instant::now();
    loop {
        let mut differ = None;
        'regions: for con in cons.iter_mut() {
            for k in keys {
                let got = components(&mut **con, k);
                if got != expected[k] {
                    differ = Some(format!("{k}: {got:?}, expected {:?}", expected[k]));
                    break 'regions;
                }
            }
        }
        let Some(differ) = differ else { return };
        assert!(
            start.elapsed() < within,
            "not converged after {within:?}: {differ}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
