//! Private networks and their members in SQLite: kept across a reopen, members forgotten
//! one by one or with their network.

use chrono::{TimeZone, Utc};
use warren_control::store::*;
use warren_control::{Member, PrivateNetwork};
use warren_store::SqliteStore;

fn network(id: &str, name: &str, cidr: &str) -> PrivateNetwork {
    PrivateNetwork {
        id: id.into(),
        name: name.into(),
        team: "team-a".into(),
        cidr: cidr.parse().unwrap(),
        ports: vec![5432],
        created_at: Utc.timestamp_micros(1_700_000_000_000_000).unwrap(),
    }
}

fn member(net: &str, sandbox: &str, addr: &str, alias: Option<&str>) -> Member {
    Member {
        network_id: net.into(),
        sandbox_id: sandbox.into(),
        address: addr.parse().unwrap(),
        alias: alias.map(str::to_string),
        joined_at: Utc.timestamp_micros(1_700_000_000_000_001).unwrap(),
    }
}

#[tokio::test]
async fn networks_and_members_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("warren.db");
    let a = network("net_a", "backend", "10.224.0.0/24");
    let b = network("net_b", "cache", "10.224.1.0/24");
    let m1 = member("net_a", "i1", "10.224.0.2", Some("db"));
    let m2 = member("net_a", "i2", "10.224.0.3", None);
    let m3 = member("net_b", "i1", "10.224.1.2", None);
    {
        let store = SqliteStore::open(&path).unwrap();
        for n in [&a, &b] {
            store.put_network(n).await.unwrap();
        }
        for m in [&m1, &m2, &m3] {
            store.put_member(m).await.unwrap();
        }
    }
    let store = SqliteStore::open(&path).unwrap();
    let mut nets = store.networks().await.unwrap();
    nets.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(nets, vec![a.clone(), b.clone()]);
    let mut members = store.members().await.unwrap();
    members.sort_by(|x, y| (&x.network_id, &x.sandbox_id).cmp(&(&y.network_id, &y.sandbox_id)));
    assert_eq!(members, vec![m1.clone(), m2.clone(), m3.clone()]);

    assert!(store.delete_member("net_a", "i2").await.unwrap());
    assert!(!store.delete_member("net_a", "i2").await.unwrap());
    // A network goes with its members.
    assert!(store.delete_network("net_a").await.unwrap());
    assert!(!store.delete_network("net_a").await.unwrap());
    assert_eq!(store.networks().await.unwrap(), vec![b]);
    assert_eq!(store.members().await.unwrap(), vec![m3]);
}
