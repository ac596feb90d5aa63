//! rlctl: rl's alert worker (`rlctl watch`) and operator commands
//! (`boxes`, `stats`, `release`, `trip`, `audit`, `check-config`). See README.md.

mod alert;
mod audit;
mod config;
mod deliver;
mod ops;
mod owner;
mod quota;
mod regions;
mod retry;
mod secrets;
mod store;
mod text;
mod validate;
mod watch;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// rl's operator tool: alerts on penalty-box trips and quota thresholds,
/// shows and changes boxes, keeps an audit trail.
///
/// Every command reads one TOML configuration file (see rlctl/README.md;
/// `rlctl check-config` validates one). Secrets (webhook keys, the pager's
/// routing keys, SMTP and Redis passwords) are never in the file: it names
/// the environment variables that hold them.
///
/// Typical session:
///   rlctl boxes                                       # what is boxed now
///   rlctl release 'rl:{t:42}:key:7' --reason "customer fixed their retry loop" --by alice
///   rlctl trip 'rl:{t:42}:key:7' --level 3 --for manual --reason "leaked key" --by bob
///   rlctl audit --since 1h --key 'rl:{t:42}:key:7'
#[derive(Parser)]
#[command(name = "rlctl", version, verbatim_doc_comment)]
struct Cli {
    /// The configuration file.
    #[arg(
        long,
        short,
        env = "RLCTL_CONFIG",
        default_value = "rlctl.toml",
        global = true
    )]
    config: PathBuf,
    /// Log level of the messages on stderr: error, warn, info, debug, trace.
    #[arg(long, env = "RLCTL_LOG", default_value = "info", global = true)]
    log: tracing::Level,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the alert worker (until SIGINT or SIGTERM).
    ///
    /// Follows rl's keyspace events on every primary (the cluster's primaries
    /// are discovered, and followed across failovers), reads each box and its
    /// owner, and sends the alerts of its level and tier: level 2 to the
    /// tenant's webhook, the tenant's contacts by email and the internal
    /// webhook; level 3 to the pager (and, for tiers with human_review, the
    /// account owner) and the internal webhook. Also sends quota threshold
    /// alerts from the gateway's quota stream. On start, and after every
    /// reconnection, it scans the keyspace for active boxes, so a trip that
    /// happened while it was down is still alerted. Nothing already sent is
    /// sent again after a restart.
    #[command(verbatim_doc_comment)]
    Watch,
    /// List the active boxes on every primary: key, level, time left, offenses.
    Boxes {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The module's counters (INFO rl) summed over every primary: box trips
    /// by level, manual trips, releases, boxed replies.
    Stats {
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Lift a key's box now (RL.BOX RELEASE), with an audit entry.
    ///
    /// The key keeps its offenses (a repeat trip escalates) unless --forget.
    /// The audit entry is written first (no entry, no release); then the
    /// gateways' deny cache is told (INCR <prefix>:deny:version).
    /// Exit status 3, nothing changed: the key has no active box (and, with
    /// --forget, no offenses or strikes either).
    #[command(verbatim_doc_comment)]
    Release {
        /// The Redis key, as `rlctl boxes` shows it (quote the braces).
        key: String,
        /// Why (recorded in the audit trail).
        #[arg(long)]
        reason: String,
        /// Who (recorded in the audit trail).
        #[arg(long)]
        by: String,
        /// Also clear the key's offenses and strikes.
        #[arg(long)]
        forget: bool,
    },
    /// The kill switch: box a key now (RL.BOX TRIP), with an audit entry.
    ///
    /// The box replaces any active one; the worker alerts it like any trip,
    /// saying who tripped it and why.
    #[command(verbatim_doc_comment)]
    Trip {
        /// The Redis key (any key; quote the braces).
        key: String,
        /// Box level: 1, 2 or 3 (it chooses the alerts).
        #[arg(long)]
        level: u8,
        /// How long: 15m, 1h, 1day, 1500ms, or `manual` (until `rlctl release`).
        #[arg(long = "for", value_name = "DURATION")]
        duration: String,
        /// Why (recorded in the audit trail).
        #[arg(long)]
        reason: String,
        /// Who (recorded in the audit trail).
        #[arg(long)]
        by: String,
    },
    /// Show the audit trail, oldest first.
    Audit {
        /// From this time: RFC 3339 (2026-12-01T08:00:00Z) or a duration ago (90m, 2h, 1day).
        #[arg(long)]
        since: Option<String>,
        /// Only the entries about this key.
        #[arg(long)]
        key: Option<String>,
        /// At most this many entries.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// The alerts not delivered: those still being retried, and those given
    /// up (refused for good by their destination, or still failing after
    /// delivery.retry_for_ms), oldest first.
    #[command(verbatim_doc_comment)]
    Undelivered {
        /// Given-up deliveries from this time: RFC 3339 or a duration ago (2h, 1day).
        #[arg(long)]
        since: Option<String>,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Multi-region quotas: the sync worker and its counters (`[regions]`).
    Regions {
        #[command(subcommand)]
        command: RegionsCommand,
    },
    /// Validate the configuration (and, with --secrets, the environment variables it names).
    CheckConfig {
        /// Also check that every secret's environment variable is set.
        #[arg(long)]
        secrets: bool,
    },
}

#[derive(Subcommand)]
enum RegionsCommand {
    /// Run the sync worker of the local region (until SIGINT or SIGTERM).
    ///
    /// Publishes the local component of every quota key counted with
    /// `RL.QUOTA ... REGION` to the local stream (`regions.stream`), and
    /// merges every other region's components from that region's stream
    /// (`RL.REGION MERGE`), acknowledging an entry only once it is applied.
    /// Run one worker per region; `[redis]` is the local region.
    #[command(verbatim_doc_comment)]
    Sync,
    /// Per remote region: entries applied, refused, malformed; the consumer
    /// group's backlog on that region's stream.
    Status {
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_max_level(cli.log)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rlctl: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(Done::Ok) => ExitCode::SUCCESS,
        Ok(Done::NothingToDo) => ExitCode::from(NOTHING_TO_DO),
        Err(e) => {
            eprintln!("rlctl: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit status of a command that found nothing to act on (`release`
/// of a key with no active box).
const NOTHING_TO_DO: u8 = 3;

/// How a command that did not fail ended.
enum Done {
    Ok,
    NothingToDo,
}

async fn run(cli: Cli) -> Result<Done, String> {
    let conf = config::Config::load(&cli.config)?;
    let done = match cli.command {
        Command::Release {
            key,
            reason,
            by,
            forget,
        } => {
            return match ops::release(&conf, &key, &reason, &by, forget).await? {
                ops::Released::Nothing => Ok(Done::NothingToDo),
                ops::Released::Lifted | ops::Released::Forgotten => Ok(Done::Ok),
            }
        }
        Command::Watch => {
            let secrets = secrets::Secrets::from_env(&conf)?;
            watch::run(conf, secrets).await
        }
        Command::Boxes { json } => ops::boxes(&conf, json).await,
        Command::Stats { json } => ops::stats(&conf, json).await,
        Command::Trip {
            key,
            level,
            duration,
            reason,
            by,
        } => ops::trip(&conf, &key, level, &duration, &reason, &by).await,
        Command::Audit {
            since,
            key,
            limit,
            json,
        } => ops::show_audit(&conf, since.as_deref(), key.as_deref(), limit, json).await,
        Command::Undelivered { since, json } => {
            ops::undelivered(&conf, since.as_deref(), json).await
        }
        Command::Regions { command } => match command {
            RegionsCommand::Sync => regions::sync(conf).await,
            RegionsCommand::Status { json } => regions::status(&conf, json).await,
        },
        Command::CheckConfig { secrets } => {
            if secrets {
                secrets::Secrets::from_env(&conf)?;
            }
            println!(
                "{}: ok ({} tenant(s), tiers: {})",
                cli.config.display(),
                conf.tenants.len(),
                conf.tiers.keys().cloned().collect::<Vec<_>>().join(", ")
            );
            Ok(())
        }
    };
    done.map(|()| Done::Ok)
}
