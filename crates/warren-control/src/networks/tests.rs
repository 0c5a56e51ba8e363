use super::*;

#[test]
fn metadata_joins() {
    let md = BTreeMap::from([(METADATA_KEY.to_string(), "backend:db, frontend".to_string())]);
    assert_eq!(
        joins_from_metadata(&md).unwrap(),
        vec![
            Join {
                network: "backend".into(),
                alias: Some("db".into())
            },
            Join {
                network: "frontend".into(),
                alias: None
            },
        ]
    );
    assert!(joins_from_metadata(&BTreeMap::new()).unwrap().is_empty());
    let bad = BTreeMap::from([(METADATA_KEY.to_string(), ":db".to_string())]);
    assert!(joins_from_metadata(&bad).is_err());
}

#[test]
fn labels() {
    assert!(valid_label("backend-1"));
    assert!(!valid_label("Backend"));
    assert!(!valid_label("-a"));
    assert!(!valid_label("a.b"));
    assert!(!valid_label(""));
}

fn net(id: &str, name: &str, cidr: &str, ports: Vec<u16>) -> PrivateNetwork {
    PrivateNetwork {
        id: id.into(),
        name: name.into(),
        team: "t".into(),
        cidr: cidr.parse().unwrap(),
        ports,
        created_at: Utc::now(),
    }
}

fn member(net: &str, id: &str, addr: &str, alias: Option<&str>) -> Member {
    Member {
        network_id: net.into(),
        sandbox_id: id.into(),
        address: addr.parse().unwrap(),
        alias: alias.map(Into::into),
        joined_at: Utc::now(),
    }
}

#[test]
fn peering_covers_every_network_and_only_running_peers() {
    let mut st = NetworkState::default();
    st.networks
        .insert("n1".into(), net("n1", "backend", "10.224.0.0/24", vec![]));
    st.networks
        .insert("n2".into(), net("n2", "db", "10.224.1.0/24", vec![5432]));
    for m in [
        member("n1", "a", "10.224.0.2", None),
        member("n1", "b", "10.224.0.3", Some("api")),
        member("n1", "c", "10.224.0.4", None),
        member("n2", "a", "10.224.1.2", None),
        member("n2", "d", "10.224.1.3", Some("pg")),
    ] {
        st.members
            .entry(m.network_id.clone())
            .or_default()
            .insert(m.sandbox_id.clone(), m);
    }
    // c is paused (no host): named, not a peer.
    let hosts = |id: &str| match id {
        "a" => Some(Ipv4Addr::new(10, 11, 0, 2)),
        "b" => Some(Ipv4Addr::new(10, 11, 0, 6)),
        "d" => Some(Ipv4Addr::new(10, 11, 0, 10)),
        _ => None,
    };
    let p = st.peering("a", &hosts);
    assert_eq!(p.peers.len(), 2);
    assert!(p
        .peers
        .iter()
        .any(|x| x.address == Ipv4Addr::new(10, 224, 0, 3)
            && x.host == Ipv4Addr::new(10, 11, 0, 6)
            && x.ports.is_empty()));
    assert!(p
        .peers
        .iter()
        .any(|x| x.address == Ipv4Addr::new(10, 224, 1, 3) && x.ports == vec![5432]));
    assert_eq!(
        p.names["api.backend.internal"],
        Ipv4Addr::new(10, 224, 0, 3)
    );
    assert_eq!(p.names["c.backend.internal"], Ipv4Addr::new(10, 224, 0, 4));
    assert_eq!(p.names["pg.db.internal"], Ipv4Addr::new(10, 224, 1, 3));
    assert_eq!(p.names["a.db.internal"], Ipv4Addr::new(10, 224, 1, 2));
    // b is not in db: it neither reaches nor resolves d.
    let pb = st.peering("b", &hosts);
    assert!(!pb.names.contains_key("pg.db.internal"));
    assert!(pb
        .peers
        .iter()
        .all(|x| x.host != Ipv4Addr::new(10, 11, 0, 10)));
    // A sandbox in no network gets nothing.
    assert!(st.peering("zzz", &hosts).is_empty());
}

#[test]
fn addresses_and_ranges_are_allocated_lowest_first() {
    let mut st = NetworkState::default();
    let range: Ipv4Net = "10.224.0.0/23".parse().unwrap();
    assert_eq!(st.free_cidr(range).unwrap().to_string(), "10.224.0.0/24");
    let n = net("n1", "x", "10.224.0.0/24", vec![]);
    st.networks.insert("n1".into(), n.clone());
    assert_eq!(st.free_cidr(range).unwrap().to_string(), "10.224.1.0/24");
    st.networks
        .insert("n2".into(), net("n2", "y", "10.224.1.0/24", vec![]));
    assert!(st.free_cidr(range).is_none());
    assert_eq!(st.free_address(&n), Some(Ipv4Addr::new(10, 224, 0, 2)));
    st.members
        .entry("n1".into())
        .or_default()
        .insert("a".into(), member("n1", "a", "10.224.0.2", None));
    assert_eq!(st.free_address(&n), Some(Ipv4Addr::new(10, 224, 0, 3)));
}
