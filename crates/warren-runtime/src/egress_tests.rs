use super::*;

fn policy(allow: &[&str], deny: &[&str]) -> EgressPolicy {
    let s = |l: &[&str]| l.iter().map(|e| e.to_string()).collect::<Vec<_>>();
    EgressPolicy::from_lists(&s(allow), &s(deny), None).unwrap()
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn private() -> OperatorRanges {
    OperatorRanges {
        denied: vec![
            "10.0.0.0/8".parse().unwrap(),
            "169.254.0.0/16".parse().unwrap(),
        ],
        allowed: vec!["10.9.0.0/16".parse().unwrap()],
    }
}

#[test]
fn entries_parse_into_every_rule_kind() {
    let net = |s: &str| Rule::Net(s.parse().unwrap());
    for (entry, rule) in [
        ("192.0.2.7", net("192.0.2.7/32")),
        (" 198.51.100.0/24 ", net("198.51.100.0/24")),
        // A CIDR is normalised to its network.
        ("203.0.113.9/28", net("203.0.113.0/28")),
        ("0.0.0.0/0", net("0.0.0.0/0")),
        ("Example.COM.", Rule::Name("example.com".into())),
        ("*.api.example.com", Rule::Below("api.example.com".into())),
        ("_srv.example.com", Rule::Name("_srv.example.com".into())),
        ("*", Rule::AnyName),
    ] {
        assert_eq!(Rule::parse(entry), Ok(rule.clone()), "{entry}");
        // What is stored reads back as the same rule.
        assert_eq!(Rule::parse(&rule.to_string()), Ok(rule));
    }
}

#[test]
fn bad_entries_say_why() {
    for (entry, why) in [
        ("", RuleError::Empty),
        ("  ", RuleError::Empty),
        ("2001:db8::1", RuleError::Ipv6),
        ("2001:db8::/32", RuleError::Ipv6),
        ("192.0.2.0/33", RuleError::Prefix),
        ("192.0.2.300", RuleError::Malformed),
        ("example.com/24", RuleError::Malformed),
        ("-bad.example.com", RuleError::Malformed),
        ("a..b", RuleError::Malformed),
        ("*example.com", RuleError::Malformed),
        ("*.", RuleError::Malformed),
        ("exa mple.com", RuleError::Malformed),
        ("ünïcode.example", RuleError::Malformed),
    ] {
        assert_eq!(Rule::parse(entry), Err(why), "{entry:?}");
    }
    let e = EgressPolicy::from_lists(&["192.0.2.1".into(), "nope!".into()], &[], None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid allowOut entry \"nope!\": not an IPv4 address, CIDR or domain name"
    );
    let many: Vec<String> = (0..=MAX_RULES)
        .map(|i| format!("192.0.2.{}", i % 250))
        .collect();
    assert!(matches!(
        EgressPolicy::from_lists(&[], &many, None),
        Err(PolicyError::TooMany {
            list: "denyOut",
            ..
        })
    ));
}

#[test]
fn a_domain_in_allow_out_needs_all_traffic_denied_as_on_e2b() {
    let e = EgressPolicy::from_lists(&["example.com".into()], &["192.0.2.0/24".into()], None)
        .unwrap_err();
    assert_eq!(e, PolicyError::DomainNeedsDenyAll);
    assert_eq!(e.to_string(), DOMAIN_NEEDS_DENY_ALL);
    // allow_internet_access=false counts as denying all traffic.
    let p = EgressPolicy::from_lists(&["example.com".into()], &[], Some(false)).unwrap();
    assert!(!p.denies_all() && p.with_internet_access(false).denies_all());
}

#[test]
fn allow_internet_access_false_replaces_deny_out_and_keeps_allow_out() {
    let given = EgressPolicy::from_lists(
        &["192.0.2.0/24".into()],
        &["198.51.100.1".into()],
        Some(false),
    )
    .unwrap();
    // Kept as given (what the API reads back); folded for enforcement.
    assert_eq!(given.deny_out, vec![Rule::parse("198.51.100.1").unwrap()]);
    let p = given.with_internet_access(false);
    assert_eq!(p.deny_out, vec![Rule::parse("0.0.0.0/0").unwrap()]);
    assert_eq!(p.allow_out, vec![Rule::parse("192.0.2.0/24").unwrap()]);
    let none = OperatorRanges::default();
    assert!(p.decide(&none, &Destination::ip(ip("192.0.2.5"))).allowed);
    assert!(!p.decide(&none, &Destination::ip(ip("203.0.113.5"))).allowed);
    assert!(EgressPolicy::from_lists(&[], &[], Some(true))
        .unwrap()
        .is_open());
}

#[test]
fn allow_beats_deny_and_anything_unmatched_is_allowed() {
    let p = policy(&["198.51.100.7"], &["198.51.100.0/24"]);
    let none = OperatorRanges::default();
    let v = p.decide(&none, &Destination::ip(ip("198.51.100.7")));
    assert_eq!(v.reason.to_string(), "allowOut 198.51.100.7");
    assert!(v.allowed);
    let v = p.decide(&none, &Destination::ip(ip("198.51.100.8")));
    assert_eq!(
        (v.allowed, v.reason.to_string()),
        (false, "denyOut 198.51.100.0/24".into())
    );
    let v = p.decide(&none, &Destination::ip(ip("203.0.113.1")));
    assert_eq!((v.allowed, v.reason), (true, Reason::Default));
}

#[test]
fn operator_ranges_stay_denied_whatever_the_sandbox_allows() {
    let p = policy(&["10.0.0.0/8", "169.254.169.254", "*"], &["0.0.0.0/0"]);
    let op = private();
    for denied in ["10.1.2.3", "169.254.169.254"] {
        let v = p.decide(
            &op,
            &Destination {
                ip: ip(denied),
                name: Some("example.com"),
                pinned_by: &[],
            },
        );
        assert_eq!((v.allowed, v.reason), (false, Reason::Operator), "{denied}");
    }
    // What the operator carved out is the sandbox's policy's to decide.
    assert!(p.decide(&op, &Destination::ip(ip("10.9.1.1"))).allowed);
    let closed = policy(&[], &["0.0.0.0/0"]);
    assert!(!closed.decide(&op, &Destination::ip(ip("10.9.1.1"))).allowed);
}

#[test]
fn names_match_exactly_below_or_all_by_request_or_by_pin() {
    let p = policy(&["api.example.com", "*.cdn.example.net"], &["0.0.0.0/0"]);
    let none = OperatorRanges::default();
    let at = |name: Option<&'static str>, pins: &'static [&'static str]| {
        p.decide(
            &none,
            &Destination {
                ip: ip("203.0.113.10"),
                name,
                pinned_by: pins,
            },
        )
        .allowed
    };
    assert!(at(Some("api.example.com"), &[]));
    assert!(!at(Some("example.com"), &[]));
    assert!(!at(Some("xapi.example.com"), &[]));
    assert!(at(Some("img.cdn.example.net"), &[]));
    assert!(at(Some("a.b.cdn.example.net"), &[]));
    // `*.x` does not match `x` itself.
    assert!(!at(Some("cdn.example.net"), &[]));
    assert!(!at(Some("evilcdn.example.net"), &[]));
    // A raw connection to an address an allowed name resolved to (for this sandbox).
    assert!(at(None, &["api.example.com"]));
    assert!(!at(None, &[]));
    assert!(!at(None, &["other.example.org"]));
    let any = policy(&["*"], &["0.0.0.0/0"]);
    assert!(
        any.decide(
            &none,
            &Destination {
                ip: ip("192.0.2.1"),
                name: Some("x.test"),
                pinned_by: &[]
            }
        )
        .allowed
    );
    // `*` matches names, not bare addresses.
    assert!(!any.decide(&none, &Destination::ip(ip("192.0.2.1"))).allowed);
}

#[test]
fn names_in_deny_out_are_a_warren_extension() {
    let p = policy(&[], &["*.tracker.example", "ads.example"]);
    let none = OperatorRanges::default();
    let v = p.decide(
        &none,
        &Destination {
            ip: ip("192.0.2.9"),
            name: Some("x.tracker.example"),
            pinned_by: &[],
        },
    );
    assert_eq!(
        (v.allowed, v.reason.to_string()),
        (false, "denyOut *.tracker.example".into())
    );
    assert!(
        p.decide(
            &none,
            &Destination {
                ip: ip("192.0.2.9"),
                name: Some("ok.example"),
                pinned_by: &[]
            }
        )
        .allowed
    );
    assert!(!p.answers_name("ads.example"));
    assert!(p.answers_name("ok.example"));
}

#[test]
fn a_denied_by_default_sandbox_resolves_only_allowed_names() {
    let p = policy(&["api.example.com", "192.0.2.0/24"], &["0.0.0.0/0"]);
    assert!(p.answers_name("api.example.com"));
    assert!(!p.answers_name("exfil-data.attacker.example"));
    let open = policy(&[], &["198.51.100.0/24"]);
    assert!(open.answers_name("anything.example"));
}

#[test]
fn policies_round_trip_as_the_lists_the_api_stores() {
    let p = policy(&["192.0.2.7", "*.example.com"], &["0.0.0.0/0"]);
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"allowOut": ["192.0.2.7", "*.example.com"], "denyOut": ["0.0.0.0/0"]})
    );
    assert_eq!(serde_json::from_value::<EgressPolicy>(json).unwrap(), p);
    assert!(
        serde_json::from_value::<EgressPolicy>(serde_json::json!({"allowOut": ["::1"]})).is_err()
    );
    // Duplicates collapse.
    assert_eq!(
        policy(&["192.0.2.7", "192.0.2.7/32"], &[]).allow_out.len(),
        1
    );
}
