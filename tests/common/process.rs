//! Processes: the one behind a [`Server`](super::Server), and killing it
//! with everything it started.

use std::process::{Child, Command};
use std::time::Duration;

use super::poll_for;

/// The live process behind a [`Server`](super::Server).
pub(super) struct Proc {
    /// The process we spawned: `redis-server` itself, or a wrapper from the
    /// program prefix (which may fork and wait for `redis-server`, as
    /// `faketime` and `sh -c '...; :'` do).
    pub(super) child: Child,
    /// `redis-server`'s own pid, from `INFO server` (differs from the child's
    /// pid under a forking wrapper).
    pub(super) redis_pid: Option<u32>,
}

pub(super) fn kill_proc(proc: &mut Proc) {
    let child_pid = proc.child.id();
    let mut victims = descendants(child_pid);
    if let Some(pid) = proc.redis_pid {
        if pid != child_pid && !victims.contains(&pid) {
            victims.push(pid);
        }
    }
    victims.retain(|&pid| pid_alive(pid));
    if !victims.is_empty() {
        let pids: Vec<String> = victims.iter().map(u32::to_string).collect();
        // `sh -c kill` needs no extra crate and no procps.
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -9 {} 2>/dev/null", pids.join(" "))])
            .status();
    }
    let _ = proc.child.kill();
    let _ = proc.child.wait();
    for pid in victims {
        wait_pid_gone(Some(pid));
    }
    wait_pid_gone(proc.redis_pid);
}

/// The pids of all live descendants of `root` (from `/proc/*/stat`).
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // After the parenthesised command name: state, then ppid.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for &(pid, ppid) in &parent_of {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
            }
        }
        i += 1;
    }
    found.remove(0);
    found
}

/// Whether `pid` is a running (non-zombie) process (reads `/proc`).
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3, after the parenthesised command name, is the state.
        Ok(stat) => match stat.rsplit_once(')') {
            Some((_, rest)) => !matches!(rest.trim_start().chars().next(), Some('Z' | 'X')),
            None => false,
        },
        Err(_) => false,
    }
}

/// Waits (bounded, 5 s) until `pid` is dead or a zombie.
pub(super) fn wait_pid_gone(pid: Option<u32>) {
    if let Some(pid) = pid {
        let _ = poll_for(Duration::from_secs(5), Duration::from_millis(10), || {
            (!pid_alive(pid)).then_some(())
        });
    }
}
