//! The pool's flow log: every decision of the resolver and the egress proxy, kept per owner
//! (the sandbox a slot serves), bounded.
//!
//! Entries are recorded by slot name; a slot's owner is set by the runtime when it leases
//! the slot ([`crate::NetPool::set_owner`]). An owner's log outlives its slot lease, so a
//! sandbox that is paused and resumed in another slot keeps its history; the logs of owners
//! that hold no slot are the first to go when there are too many.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use warren_runtime::flows::Flow;

/// Entries kept per owner (the oldest go first).
pub(crate) const PER_OWNER: usize = 500;
/// Owners whose log is kept at once.
const MAX_OWNERS: usize = 256;

#[derive(Default)]
struct State {
    /// Slot name -> owner.
    owners: HashMap<String, String>,
    logs: HashMap<String, VecDeque<Flow>>,
    /// Owners in the order their log was last written, for eviction.
    order: VecDeque<String>,
}

#[derive(Default)]
pub(crate) struct FlowLog {
    state: Mutex<State>,
}

/// Now, in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl FlowLog {
    /// Entries of `slot` go to `owner`'s log from now on; `None`: the slot serves nobody.
    pub(crate) fn set_owner(&self, slot: &str, owner: Option<&str>) {
        let mut s = self.lock();
        match owner {
            Some(o) => {
                s.owners.insert(slot.to_owned(), o.to_owned());
            }
            None => {
                s.owners.remove(slot);
            }
        }
    }

    /// Whom `slot` serves.
    pub(crate) fn owner(&self, slot: &str) -> Option<String> {
        self.lock().owners.get(slot).cloned()
    }

    /// Records `flow` for whoever `slot` serves (nothing if nobody).
    pub(crate) fn record(&self, slot: &str, flow: Flow) {
        let mut s = self.lock();
        let Some(owner) = s.owners.get(slot).cloned() else {
            return;
        };
        let log = s.logs.entry(owner.clone()).or_default();
        if log.len() == PER_OWNER {
            log.pop_front();
        }
        log.push_back(flow);
        if let Some(i) = s.order.iter().position(|o| *o == owner) {
            s.order.remove(i);
        }
        s.order.push_back(owner);
        while s.logs.len() > MAX_OWNERS {
            let leased: std::collections::HashSet<&String> = s.owners.values().collect();
            let victim = s
                .order
                .iter()
                .position(|o| !leased.contains(o))
                .unwrap_or(0);
            if let Some(gone) = s.order.remove(victim) {
                s.logs.remove(&gone);
            }
        }
    }

    /// `owner`'s entries, oldest first.
    pub(crate) fn of(&self, owner: &str) -> Vec<Flow> {
        self.lock()
            .logs
            .get(owner)
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets `owner`'s log (its sandbox is gone).
    pub(crate) fn forget(&self, owner: &str) {
        let mut s = self.lock();
        s.logs.remove(owner);
        s.order.retain(|o| o != owner);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_runtime::flows::{FlowKind, FlowVerdict};

    fn flow(n: u64) -> Flow {
        Flow {
            at_ms: n,
            kind: FlowKind::Tcp,
            verdict: FlowVerdict::Allowed,
            name: None,
            destination: None,
            addresses: Vec::new(),
            via: "address".into(),
            reason: None,
        }
    }

    #[test]
    fn entries_follow_the_owner_across_slots_and_stay_bounded() {
        let log = FlowLog::default();
        log.record("s1", flow(0));
        assert!(log.of("a").is_empty(), "a slot nobody owns logs nothing");
        log.set_owner("s1", Some("a"));
        for n in 0..(PER_OWNER as u64 + 5) {
            log.record("s1", flow(n));
        }
        let got = log.of("a");
        assert_eq!(got.len(), PER_OWNER);
        assert_eq!(got[0].at_ms, 5, "the oldest went first");
        // Paused, then resumed in another slot: one history.
        log.set_owner("s1", None);
        log.set_owner("s2", Some("a"));
        log.record("s2", flow(9999));
        assert_eq!(log.of("a").last().unwrap().at_ms, 9999);
        log.forget("a");
        assert!(log.of("a").is_empty());
    }
}
