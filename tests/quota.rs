//! RL.QUOTA against a real redis-server whose clock is moved to calendar
//! edges: month ends, leap days, the turn of the year.

mod common;

use common::*;

#[test]
fn the_civil_helper_agrees_with_known_dates() {
    assert_eq!(utc_ms(1970, 1, 1, 0, 0, 0), 0);
    assert_eq!(utc_ms(2000, 3, 1, 0, 0, 0), 951_868_800_000);
    assert_eq!(utc_ms(2028, 2, 29, 12, 0, 0), 1_835_438_400_000);
}

#[test]
fn a_monthly_quota_resets_at_the_turn_of_the_month() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    for (y, m, d, ny, nm) in [
        (2026, 12, 31, 2027, 1),
        (2028, 2, 29, 2028, 3),
        (2027, 2, 28, 2027, 3),
    ] {
        let key = format!("q:{y}-{m}");
        clock.set_now_ms(utc_ms(y, m, d, 23, 59, 50));
        let end = utc_ms(ny, nm, 1, 0, 0, 0);
        let call = format!("RL.QUOTA {key} 3 MONTH");
        for left in [2, 1, 0] {
            let d = decide(&mut con, &call);
            assert_eq!((d.status, d.limit, d.remaining), (ALLOWED, 3, left));
        }
        let d = decide(&mut con, &call);
        assert_eq!((d.status, d.limit, d.remaining), (THROTTLED, 3, 0), "{key}");
        near(
            d.retry_after_ms,
            9_000,
            10_000,
            "until the first of the next month",
        );
        assert_eq!(
            d.reset_ms, d.retry_after_ms,
            "reset_ms is the end of the period"
        );
        assert_eq!(
            int(&mut con, &format!("PEXPIRETIME {key}")),
            end,
            "the key expires when the period ends"
        );
        clock.set_now_ms(end);
        let d = decide(&mut con, &call);
        assert_eq!(
            (d.status, d.limit, d.remaining),
            (ALLOWED, 3, 2),
            "{key}: a new month"
        );
    }
}

#[test]
fn weeks_are_iso_weeks_and_days_are_utc_days() {
    let clock = TimeShift::new();
    let server = Server::start_with(&clock.prefix(), &[]);
    let mut con = server.client();
    // Sunday 2027-01-03 is the last day of ISO week 53 of 2026.
    clock.set_now_ms(utc_ms(2027, 1, 3, 12, 0, 0));
    let week = decide(&mut con, "RL.QUOTA w 10 WEEK");
    near(
        week.reset_ms,
        43_190_000,
        43_200_000,
        "the week ends Monday 00:00",
    );
    let day = decide(&mut con, "RL.QUOTA d 10 DAY");
    near(
        day.reset_ms,
        43_190_000,
        43_200_000,
        "the day ends at midnight UTC",
    );
    assert_eq!(int(&mut con, "PEXPIRETIME w"), utc_ms(2027, 1, 4, 0, 0, 0));
    assert_eq!(int(&mut con, "PEXPIRETIME d"), utc_ms(2027, 1, 4, 0, 0, 0));
}

#[test]
fn peek_is_a_dry_run_of_the_cost() {
    let server = Server::start(&[]);
    let mut con = server.client();
    assert_eq!(
        ints(&mut con, "RL.QUOTA p 100 MONTH COST 60 PEEK")[..3],
        [1, 100, 40]
    );
    assert_eq!(int(&mut con, "EXISTS p"), 0, "PEEK writes nothing");
    ints(&mut con, "RL.QUOTA p 100 MONTH COST 60");
    let offset = server.info_get("replication", "master_repl_offset");
    assert_eq!(
        ints(&mut con, "RL.QUOTA p 100 MONTH COST 60 PEEK STRIKES 1 60")[..3],
        [0, 100, 40]
    );
    assert_eq!(
        ints(
            &mut con,
            "RL.QUOTA p 100 MONTH COST 60 PEEK STRIKES 1 60 EVERY"
        )[..3],
        [0, 100, 40],
        "a dry run is no refusal, EVERY or not"
    );
    assert_eq!(
        ints(&mut con, "RL.BOX STATUS p"),
        [0, 0, 0, 0],
        "a dry run counts no strike"
    );
    assert_eq!(server.info_get("replication", "master_repl_offset"), offset);
    assert_eq!(
        ints(&mut con, "RL.QUOTA p 100 MONTH COST 40")[..3],
        [1, 100, 0]
    );
}

#[test]
fn bad_input_and_replication() {
    let master = Server::start(&[]);
    let replica = start_replica(&master);
    let mut con = master.client();
    assert_rejected(
        &mut con,
        &[
            ("RL.QUOTA k 10 YEAR", "period must be DAY, WEEK or MONTH"),
            ("RL.QUOTA k 10", "missing period"),
            ("RL.QUOTA k 0 DAY", "limit"),
            ("RL.QUOTA k 10 DAY COST 11", "COST"),
        ],
    );
    for line in [
        "RL.QUOTA a 5 DAY",
        "RL.QUOTA b 5 WEEK COST 3 ALSO c 10 MONTH",
        "RL.QUOTA a 5 DAY COST 4",
    ] {
        ints(&mut con, line);
    }
    wait_replica(&mut con, 1, 5000);
    assert_eq!(snapshot(&mut con), snapshot(&mut replica.client()));
    assert_eq!(
        info_field(&master.info("rl"), "rl_quota_calls").as_deref(),
        Some("3")
    );
}
