//! Time travel: [`TimeShift`], an `LD_PRELOAD` shim that moves the wall
//! clock of the servers started under it, and [`now_ms`], the real one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::fresh_dir;

/// The real wall clock (this process is not under a [`TimeShift`]), in
/// Unix milliseconds.
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since.as_millis()).expect("ms fit i64")
}

/// The server's clock (`TIME`) in Unix microseconds.
pub fn server_time_us(con: &mut impl redis::ConnectionLike) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000_000 + micros
}

/// Path of the `timeshift` LD_PRELOAD shim, compiled (once per test process,
/// with `cc`) from `tests/common/timeshift.c` into
/// `target/rl-test-support/libtimeshift.so`.
pub fn timeshift_lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let src = root.join("tests/common/timeshift.c");
        let out_dir = root.join("target/rl-test-support");
        std::fs::create_dir_all(&out_dir).expect("create target/rl-test-support");
        let lib = out_dir.join("libtimeshift.so");
        // Build under a unique name, then rename: safe against concurrent
        // test processes and against servers still mapping an older copy.
        let tmp = out_dir.join(format!("libtimeshift.so.{}", std::process::id()));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
        let output = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("cannot run C compiler {cc:?}: {e}"));
        assert!(
            output.status.success(),
            "compiling {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&tmp, &lib).expect("rename libtimeshift.so");
        lib
    })
    .clone()
}

/// A controllable wall-clock offset for servers started under it.
///
/// ```ignore
/// let clock = TimeShift::new();
/// let server = Server::start_with(&clock.prefix(), &[]);
/// clock.advance(Duration::from_secs(3600)); // the server is now 1 h ahead
/// ```
///
/// Servers see `CLOCK_REALTIME`, `gettimeofday()` and `time()` shifted by
/// the current offset (so key expiry, `TIME` and module time calls follow
/// it); monotonic clocks are untouched. The offset applies to every server
/// started with this prefix, takes effect immediately, and survives
/// [`Server::restart`] while the `TimeShift` lives.
pub struct TimeShift {
    dir: PathBuf,
    file: std::fs::File,
    offset_ns: Mutex<i64>,
    preload: String,
    file_env: String,
}

impl TimeShift {
    /// A new clock with offset 0.
    pub fn new() -> TimeShift {
        let lib = timeshift_lib();
        let dir = fresh_dir("timeshift");
        let path = dir.join("offset");
        let file = std::fs::File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .expect("create timeshift offset file");
        let clock = TimeShift {
            preload: format!("LD_PRELOAD={}", lib.display()),
            file_env: format!("RL_TIMESHIFT_FILE={}", path.display()),
            dir,
            file,
            offset_ns: Mutex::new(0),
        };
        clock.write(0);
        clock
    }

    /// The program prefix for [`Server::start_with`] / [`Server::launch`]:
    /// `env LD_PRELOAD=... RL_TIMESHIFT_FILE=...` (env execs, no fork).
    pub fn prefix(&self) -> Vec<&str> {
        vec!["env", &self.preload, &self.file_env]
    }

    fn write(&self, ns: i64) {
        use std::os::unix::fs::FileExt;
        self.file
            .write_all_at(&ns.to_ne_bytes(), 0)
            .expect("write timeshift offset");
        *self.offset_ns.lock().unwrap_or_else(|e| e.into_inner()) = ns;
    }

    /// Sets the offset from real time, in milliseconds (may be negative).
    pub fn set_ms(&self, ms: i64) {
        self.write(ms.checked_mul(1_000_000).expect("offset overflows i64 ns"));
    }

    /// Moves the clock forward by `d` (relative to the current offset).
    pub fn advance(&self, d: Duration) {
        let cur = *self.offset_ns.lock().unwrap_or_else(|e| e.into_inner());
        let add = i64::try_from(d.as_nanos()).expect("duration fits i64 ns");
        self.write(cur.checked_add(add).expect("offset overflows i64 ns"));
    }

    /// Moves the clock forward by `ms` milliseconds (negative: backward).
    pub fn advance_ms(&self, ms: i64) {
        let cur = *self.offset_ns.lock().unwrap_or_else(|e| e.into_inner());
        self.write(cur + ms * 1_000_000);
    }

    /// Sets the offset so that a server under this clock reads `at_ms`
    /// (Unix ms) now; its clock then runs on from there.
    pub fn set_now_ms(&self, at_ms: i64) {
        self.set_ms(at_ms - now_ms());
    }

    /// The current offset in milliseconds.
    pub fn offset_ms(&self) -> i64 {
        *self.offset_ns.lock().unwrap_or_else(|e| e.into_inner()) / 1_000_000
    }

    /// Moves the clock to `past_ms` after the next boundary of `key`'s
    /// windows of `window_ms` (see [`key_offset_ms`]), so that calls in the
    /// following `window_ms - past_ms` fall in one window.
    pub fn start_window(&self, key: &str, window_ms: i64, past_ms: i64) {
        let now = now_ms() + self.offset_ms();
        let offset = key_offset_ms(key.as_bytes(), window_ms);
        let boundary = now + (offset - now).rem_euclid(window_ms);
        self.set_now_ms(boundary + past_ms);
    }
}

/// rl's boundary offset of a window key, in `0..window_ms`: the 64-bit
/// FNV-1a hash of the key, MurmurHash3's `fmix64`, scaled to the window
/// (as `commands.md` defines it).
pub fn key_offset_ms(key: &[u8], window_ms: i64) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    let window = u128::try_from(window_ms).expect("a positive window");
    i64::try_from((u128::from(h) * window) >> 64).expect("below the window")
}

impl Default for TimeShift {
    fn default() -> Self {
        TimeShift::new()
    }
}

impl Drop for TimeShift {
    fn drop(&mut self) {
        if std::env::var_os("RL_KEEP_TEST_DIRS").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
