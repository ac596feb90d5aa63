use super::*;
use crate::config::{Rule, Strikes, Unit};

fn check(key: &str, tag: &str, algorithm: Algorithm, cost: u64) -> Check {
    Check {
        desc: 0,
        rule: Rule {
            requests_per_unit: 10,
            unit: Unit::Minute,
            algorithm,
            burst: 20,
            strikes: None,
        },
        key: key.into(),
        tag: tag.into(),
        cost,
        shadow: false,
        fixed_reset_ms: None,
    }
}

#[test]
fn groups_share_a_command_a_cost_and_a_slot() {
    let mut shadow = check("s", "a", Algorithm::Fixed, 1);
    shadow.shadow = true;
    let mut boxed = check("b", "a", Algorithm::Fixed, 1);
    boxed.rule.strikes = Some(Strikes {
        threshold: 1,
        window: 1,
        boxes: [1, 1, 1],
    });
    let checks = vec![
        check("k1", "a", Algorithm::Fixed, 1),
        check("k2", "b", Algorithm::Fixed, 1),
        check("k3", "a", Algorithm::TokenBucket, 1),
        check("k4", "a", Algorithm::Fixed, 2),
        check("k1", "a", Algorithm::Fixed, 1),
        shadow,
        boxed,
    ];
    assert_eq!(
        group(&checks, false),
        vec![vec![0, 1], vec![2], vec![3], vec![4], vec![5], vec![6]]
    );
    assert_eq!(
        group(&checks, true),
        vec![
            vec![0],
            vec![1],
            vec![2],
            vec![3],
            vec![4],
            vec![5],
            vec![6]
        ]
    );
    let many: Vec<Check> = (0..40)
        .map(|i| check(&format!("k{i}"), "a", Algorithm::Fixed, 1))
        .collect();
    let sizes: Vec<usize> = group(&many, true).iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![16, 16, 8]);
}

fn args(c: &Cmd) -> Vec<String> {
    c.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            redis::Arg::Cursor => "<cursor>".into(),
        })
        .collect()
}

#[test]
fn commands() {
    let mut fixed = vec![
        check("k1", "a", Algorithm::Fixed, 3),
        check("k2", "a", Algorithm::Fixed, 3),
    ];
    fixed[1].rule.unit = Unit::Second;
    assert_eq!(
        args(&command(&fixed, &[0, 1], Mode::Charge)).join(" "),
        "RL.WINDOW k1 10 240.000 COST 3 ALSO k2 10 4.000 FIXED"
    );
    assert_eq!(
        args(&command(&fixed, &[0, 1], Mode::Refund)).join(" "),
        "RL.WINDOW k1 10 240.000 REFUND 3 ALSO k2 10 4.000 FIXED"
    );
    let mut tb = vec![check("t", "a", Algorithm::TokenBucket, 1)];
    tb[0].rule.strikes = Some(Strikes {
        threshold: 3,
        window: 60,
        boxes: [5, 10, 20],
    });
    assert_eq!(
        args(&command(&tb, &[0], Mode::Charge)).join(" "),
        "RL.TAKE t 20 10 60.000 COST 1 STRIKES 3 60 BOX 5 10 20"
    );
    let mut q = vec![
        check("q1", "a", Algorithm::Calendar, 2),
        check("q2", "a", Algorithm::Calendar, 2),
    ];
    q[0].rule.unit = Unit::Month;
    q[1].rule.unit = Unit::Week;
    assert_eq!(
        args(&command(&q, &[0, 1], Mode::Charge)).join(" "),
        "RL.QUOTA q1 10 MONTH COST 2 ALSO q2 10 WEEK"
    );
    let ex = vec![check("e", "a", Algorithm::Exact, 1)];
    assert_eq!(
        args(&command(&ex, &[0], Mode::Probe)).join(" "),
        "RL.WINDOW e 10 60.000 COST 0 EXACT"
    );
}
