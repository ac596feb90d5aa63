//! A real 3-master cluster on loopback: hash-tagged calls routed by the
//! `redis` crate's cluster client, and CROSSSLOT for keys in two slots.

mod common;

use common::*;

#[test]
fn hash_tagged_tenants_work_across_a_cluster() {
    let cluster = Cluster::start(3, 0);
    let mut con = cluster.client();
    let mut nodes_used = std::collections::HashSet::new();
    for tenant in 0..30 {
        let key = format!("rl:{{t:{tenant}}}:key:7");
        let tenant_key = format!("rl:{{t:{tenant}}}:tenant");
        nodes_used.insert(cluster.master_for_key(key.as_bytes()).port);
        for call in 0..4 {
            let d: Vec<i64> = redis::cmd("RL.TAKE")
                .arg(&key)
                .arg(10)
                .arg(10)
                .arg(60)
                .arg("COST")
                .arg(2)
                .arg("ALSO")
                .arg(&tenant_key)
                .arg(5)
                .arg(5)
                .arg(60)
                .query(&mut con)
                .expect("RL.TAKE through the cluster client");
            let d = Decision::from(d);
            let expected_status = if call < 2 { ALLOWED } else { THROTTLED };
            assert_eq!(
                (d.status, d.binding),
                (expected_status, 1),
                "tenant {tenant} call {call}: {d:?}"
            );
        }
    }
    assert_eq!(nodes_used.len(), 3, "tenants spread over every master");
}

#[test]
fn keys_in_two_slots_get_crossslot() {
    let cluster = Cluster::start(3, 0);
    let node = cluster.master_for_key(b"rl:{a}:key");
    let mut con = node.client();
    let r = call(
        &mut con,
        "RL.TAKE rl:{a}:key 1 1 1 ALSO rl:{b}:tenant 1 1 1",
    );
    expect_err(r, "CROSSSLOT");
    assert_eq!(int(&mut con, "EXISTS rl:{a}:key"), 0, "nothing written");
    let keys = str_array(
        call(
            &mut con,
            "COMMAND GETKEYS RL.TAKE rl:{a}:key 1 1 1 ALSO rl:{b}:tenant 1 1 1",
        )
        .expect("GETKEYS"),
    );
    assert_eq!(keys, ["rl:{a}:key", "rl:{b}:tenant"]);
    // The replicated effect declares every key it writes, old form too.
    let keys = str_array(
        call(
            &mut con,
            "COMMAND GETKEYS RL.APPLY rl:{a}:key p 1 rl:{a}:tenant q PERSIST",
        )
        .expect("GETKEYS"),
    );
    assert_eq!(keys, ["rl:{a}:key", "rl:{a}:tenant"]);
    let keys = str_array(call(&mut con, "COMMAND GETKEYS RL.APPLY k p").expect("GETKEYS"));
    assert_eq!(keys, ["k"]);
}
