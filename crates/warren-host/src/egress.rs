//! A sandbox's egress policy turned into what its network slot enforces.

use warren_net::{Ipv4Cidr, NetPool, Slot, SlotPolicy};
use warren_runtime::egress::{EgressPolicy, Rule};
use warren_runtime::RuntimeError;

/// `policy` as the slot enforces it: address rules in its nftables filter, and, when it has
/// rules by name or header rules, the whole policy for the pool's resolver (which answers
/// only allowed names and pins what it answered) and its egress proxy.
pub fn slot_policy(policy: &EgressPolicy) -> SlotPolicy {
    let nets = |rules: &[Rule]| -> Vec<Ipv4Cidr> {
        rules
            .iter()
            .filter_map(|r| match r {
                Rule::Net(n) => Ipv4Cidr::new(n.network(), n.prefix_len()).ok(),
                _ => None,
            })
            .collect()
    };
    SlotPolicy {
        allow: nets(&policy.allow_out),
        deny: nets(&policy.deny_out),
        names: (policy.has_names() || policy.has_rules()).then(|| policy.clone()),
    }
}

/// Applies `policy` to a leased slot.
pub async fn apply(
    pool: &NetPool,
    slot: &mut Slot,
    policy: &EgressPolicy,
) -> Result<(), RuntimeError> {
    pool.set_policy(slot, &slot_policy(policy))
        .await
        .map_err(|e| RuntimeError::unavailable("change the sandbox's egress policy", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_rules_become_sets_and_names_open_dns() {
        let p = EgressPolicy::from_lists(
            &["192.0.2.7".into(), "example.com".into()],
            &["198.51.100.0/24".into()],
            Some(false),
        )
        .unwrap()
        .with_internet_access(false);
        let s = slot_policy(&p);
        assert_eq!(s.allow, vec!["192.0.2.7/32".parse().unwrap()]);
        assert_eq!(s.deny, vec!["0.0.0.0/0".parse().unwrap()]);
        assert_eq!(s.names.as_ref(), Some(&p));
        assert!(slot_policy(&EgressPolicy::default()).is_open());
        let cidrs = EgressPolicy::from_lists(&[], &["198.51.100.0/24".into()], None).unwrap();
        let s = slot_policy(&cidrs);
        assert!(s.names.is_none() && s.allow.is_empty() && !s.denies_everything());
    }
}
