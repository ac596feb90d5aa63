//! Keyspace events: a real subscriber sees `rl.boxed` and `rl.released`.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn a_subscriber_sees_trips_and_releases() {
    let server = Server::start(&["--notify-keyspace-events", "KEd"]);
    let mut sub_con = server.client();
    let mut pubsub = rl_events(&mut sub_con);

    let mut con = server.client();
    let line = "RL.TAKE ip:203.0.113.9 1 1 100 STRIKES 1 60";
    ints(&mut con, line);
    assert_eq!(ints(&mut con, line)[0], 0, "refused: a retry is announced");
    assert_eq!(ints(&mut con, line)[0], -1, "the early retry trips the box");
    ints(&mut con, "RL.BOX TRIP user:alice 3 0");
    assert_eq!(int(&mut con, "RL.BOX RELEASE user:alice"), 1);
    assert_eq!(
        int(&mut con, "RL.BOX RELEASE user:alice"),
        0,
        "nothing to release: no event"
    );

    let mut seen = vec![];
    for _ in 0..3 {
        let msg = pubsub.get_message().expect("an event within 5 s");
        let payload: String = msg.get_payload().expect("payload");
        seen.push((msg.get_channel_name().to_string(), payload));
    }
    assert_eq!(
        seen,
        [
            (
                "__keyevent@0__:rl.boxed".to_string(),
                "ip:203.0.113.9".to_string()
            ),
            (
                "__keyevent@0__:rl.boxed".to_string(),
                "user:alice".to_string()
            ),
            (
                "__keyevent@0__:rl.released".to_string(),
                "user:alice".to_string()
            ),
        ]
    );
    pubsub
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    assert!(pubsub.get_message().is_err(), "no further event");
}
