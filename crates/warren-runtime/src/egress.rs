//! A sandbox's egress policy: what it may connect to, as the E2B `network.allowOut` /
//! `network.denyOut` lists say it, and the decision for one destination.
//!
//! Rules are IPv4 addresses, CIDRs, names (`example.com`), subdomain wildcards (`*.example.com`,
//! which does not match `example.com` itself, as on E2B) and `*` (every name). The decision for
//! a destination, in order:
//! 1. ranges the operator denies (private, loopback, link-local, metadata: server config) stay
//!    denied unless the operator allows them; a sandbox's `allowOut` never opens them;
//! 2. an `allowOut` rule that matches allows (allow beats deny, as E2B);
//! 3. a `denyOut` rule that matches denies;
//! 4. anything else is allowed.
//!
//! A name rule matches a destination by the name the connection asked for (HTTP `Host`, TLS
//! SNI, a DNS question) or by a name whose DNS answer, given to this sandbox, held the
//! destination's address (a pin). Warren also takes names in `denyOut` (E2B takes only CIDRs).
//! Enforcement (nftables sets, the egress proxy, the per-sandbox resolver) lives in
//! `warren-net`; this module has no I/O.

use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use crate::transforms::HeaderRules;

/// Most entries one list may hold (each becomes set elements or matcher entries per slot).
pub const MAX_RULES: usize = 1000;

/// What E2B's API answers when `allowOut` names a domain but `denyOut` does not block all
/// traffic (a domain rule would then allow nothing that is not allowed already).
pub const DOMAIN_NEEDS_DENY_ALL: &str = "When specifying allowed domains in allow out, you must \
     include 'ALL_TRAFFIC' in deny out to block all other traffic.";

/// One entry of `allowOut` or `denyOut`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Rule {
    /// An address (a /32) or a CIDR, normalised to its network address.
    Net(Ipv4Net),
    /// Exactly this name (lower case, no trailing dot).
    Name(String),
    /// Every name below this one (`*.example.com`), not the name itself.
    Below(String),
    /// Every name (`*`).
    AnyName,
}

/// Why an entry is not a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("empty entry")]
    Empty,
    #[error("IPv6 is not supported: sandboxes reach IPv4 addresses only")]
    Ipv6,
    #[error("not an IPv4 address, CIDR or domain name")]
    Malformed,
    #[error("a CIDR's prefix length is at most 32")]
    Prefix,
}

impl Rule {
    /// Parses one entry as the SDKs send it; names are lower-cased.
    pub fn parse(entry: &str) -> Result<Self, RuleError> {
        let e = entry.trim();
        if e.is_empty() {
            return Err(RuleError::Empty);
        }
        if e == "*" {
            return Ok(Rule::AnyName);
        }
        if let Ok(ip) = e.parse::<Ipv4Addr>() {
            return Ok(Rule::Net(Ipv4Net::from(ip)));
        }
        if e.contains(':') {
            return Err(RuleError::Ipv6);
        }
        if let Some((addr, len)) = e.split_once('/') {
            if addr.parse::<Ipv4Addr>().is_err() {
                return Err(RuleError::Malformed);
            }
            if len.parse::<u8>().is_ok_and(|l| l > 32) {
                return Err(RuleError::Prefix);
            }
            return e
                .parse::<Ipv4Net>()
                .map(|n| Rule::Net(n.trunc()))
                .map_err(|_| RuleError::Malformed);
        }
        let lower = e.to_ascii_lowercase();
        let lower = lower.strip_suffix('.').unwrap_or(&lower);
        match lower.strip_prefix("*.") {
            Some(base) if valid_name(base) => Ok(Rule::Below(base.to_string())),
            None if valid_name(lower) => Ok(Rule::Name(lower.to_string())),
            _ => Err(RuleError::Malformed),
        }
    }

    /// Whether this rule names hosts (and so needs the proxy or the resolver to enforce it).
    pub fn is_name(&self) -> bool {
        !matches!(self, Rule::Net(_))
    }

    /// Whether this rule matches the name `name` (lower case, no trailing dot).
    pub fn matches_name(&self, name: &str) -> bool {
        match self {
            Rule::Net(_) => false,
            Rule::Name(n) => n == name,
            Rule::Below(base) => name
                .strip_suffix(base.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            Rule::AnyName => true,
        }
    }

    /// Whether this rule matches `dest`: its address, the name it asked for, or a pin.
    pub fn matches(&self, dest: &Destination<'_>) -> bool {
        match self {
            Rule::Net(net) => net.contains(&dest.ip),
            _ => dest
                .name
                .into_iter()
                .chain(dest.pinned_by.iter().copied())
                .any(|n| self.matches_name(n)),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Net(n) if n.prefix_len() == 32 => write!(f, "{}", n.addr()),
            Rule::Net(n) => write!(f, "{n}"),
            Rule::Name(n) => f.write_str(n),
            Rule::Below(n) => write!(f, "*.{n}"),
            Rule::AnyName => f.write_str("*"),
        }
    }
}

impl TryFrom<String> for Rule {
    type Error = RuleError;
    fn try_from(s: String) -> Result<Self, RuleError> {
        Rule::parse(&s)
    }
}

impl From<Rule> for String {
    fn from(r: Rule) -> String {
        r.to_string()
    }
}

/// A DNS name of labels of letters, digits, `-` and `_` (up to 63 bytes each, 253 in all),
/// whose last label is not all digits (that is a mistyped address, never a name).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && !name
            .rsplit('.')
            .next()
            .is_some_and(|tld| tld.bytes().all(|b| b.is_ascii_digit()))
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// Why a policy is refused (a 400 for the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("invalid {list} entry {entry:?}: {why}")]
    Rule {
        list: &'static str,
        entry: String,
        #[source]
        why: RuleError,
    },
    #[error("{list} holds {count} entries; at most {MAX_RULES} are allowed")]
    TooMany { list: &'static str, count: usize },
    #[error("{DOMAIN_NEEDS_DENY_ALL}")]
    DomainNeedsDenyAll,
}

/// A sandbox's egress rules.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressPolicy {
    #[serde(default)]
    pub allow_out: Vec<Rule>,
    #[serde(default)]
    pub deny_out: Vec<Rule>,
    /// Headers set on requests to named hosts (`network.rules`); they grant no access.
    #[serde(default, skip_serializing_if = "HeaderRules::is_empty")]
    pub rules: HeaderRules,
}

/// The whole IPv4 space: what `allow_internet_access=false` denies.
fn all_traffic() -> Ipv4Net {
    Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 0).expect("a /0 is a valid prefix")
}

impl EgressPolicy {
    /// The policy of a create (or a `PUT .../network`) from the E2B lists, as given.
    /// `allow_internet_access == Some(false)` counts as denying all traffic for the checks
    /// (it replaces `deny_out` but keeps `allow_out`, as E2B); the lists are returned without
    /// it, and [`EgressPolicy::with_internet_access`] folds it in for enforcement.
    pub fn from_lists(
        allow_out: &[String],
        deny_out: &[String],
        allow_internet_access: Option<bool>,
    ) -> Result<Self, PolicyError> {
        let parse = |list: &'static str, entries: &[String]| {
            if entries.len() > MAX_RULES {
                return Err(PolicyError::TooMany {
                    list,
                    count: entries.len(),
                });
            }
            let mut rules: Vec<Rule> = Vec::with_capacity(entries.len());
            for entry in entries {
                let rule = Rule::parse(entry).map_err(|why| PolicyError::Rule {
                    list,
                    entry: entry.clone(),
                    why,
                })?;
                if !rules.contains(&rule) {
                    rules.push(rule);
                }
            }
            Ok(rules)
        };
        let policy = Self {
            allow_out: parse("allowOut", allow_out)?,
            deny_out: parse("denyOut", deny_out)?,
            rules: HeaderRules::default(),
        };
        let enforced = policy
            .clone()
            .with_internet_access(allow_internet_access != Some(false));
        if enforced.allow_out.iter().any(Rule::is_name) && !enforced.denies_all() {
            return Err(PolicyError::DomainNeedsDenyAll);
        }
        Ok(policy)
    }

    /// This policy, or with `allow = false` one that denies all traffic but what `allow_out`
    /// allows (`allow_internet_access = false` replaces `denyOut`, as on E2B).
    pub fn with_internet_access(self, allow: bool) -> Self {
        if allow {
            return self;
        }
        Self {
            deny_out: vec![Rule::Net(all_traffic())],
            ..self
        }
    }

    /// This policy with `rules` (already checked by [`HeaderRules::parse`]).
    pub fn with_rules(self, rules: HeaderRules) -> Self {
        Self { rules, ..self }
    }

    /// Whether requests to some hosts get headers (those need the egress proxy).
    pub fn has_rules(&self) -> bool {
        !self.rules.is_empty()
    }

    /// Whether any rule names a domain (those need the resolver and the egress proxy).
    pub fn has_names(&self) -> bool {
        self.allow_out
            .iter()
            .chain(&self.deny_out)
            .any(Rule::is_name)
    }

    /// Whether anything is restricted (no policy: the sandbox's egress is open).
    pub fn is_open(&self) -> bool {
        self.deny_out.is_empty()
    }

    /// Whether `denyOut` blocks every address by default (holds `0.0.0.0/0`): then only what
    /// `allowOut` names is reachable, and the resolver answers only allowed names.
    pub fn denies_all(&self) -> bool {
        self.deny_out
            .iter()
            .any(|r| matches!(r, Rule::Net(n) if n.prefix_len() == 0))
    }

    /// The decision for `dest`, with `operator`'s ranges first.
    pub fn decide(&self, operator: &OperatorRanges, dest: &Destination<'_>) -> Verdict {
        if operator.denies(dest.ip) {
            return Verdict::deny(Reason::Operator);
        }
        if let Some(r) = self.allow_out.iter().find(|r| r.matches(dest)) {
            return Verdict::allow(Reason::AllowOut(r.clone()));
        }
        if let Some(r) = self.deny_out.iter().find(|r| r.matches(dest)) {
            return Verdict::deny(Reason::DenyOut(r.clone()));
        }
        Verdict::allow(Reason::Default)
    }

    /// Whether the resolver may answer a question for `name`: a name `allowOut` matches, else
    /// not one `denyOut` names, else only when not everything is denied (a denied-by-default
    /// sandbox learns no other name, so nothing leaks through DNS).
    pub fn answers_name(&self, name: &str) -> bool {
        if self
            .allow_out
            .iter()
            .any(|r| r.is_name() && r.matches_name(name))
        {
            return true;
        }
        if self
            .deny_out
            .iter()
            .any(|r| r.is_name() && r.matches_name(name))
        {
            return false;
        }
        !self.denies_all()
    }
}

/// Address ranges only the operator decides about (server config, never a sandbox's policy).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorRanges {
    /// Denied to every sandbox (private, loopback, link-local, metadata, ...).
    pub denied: Vec<Ipv4Net>,
    /// Carved out of `denied` by the operator (e.g. a company network sandboxes may reach).
    pub allowed: Vec<Ipv4Net>,
}

impl OperatorRanges {
    pub fn denies(&self, ip: Ipv4Addr) -> bool {
        self.denied.iter().any(|n| n.contains(&ip)) && !self.allowed.iter().any(|n| n.contains(&ip))
    }
}

/// A connection (or DNS answer) a sandbox asks for.
#[derive(Debug, Clone, Copy)]
pub struct Destination<'a> {
    pub ip: Ipv4Addr,
    /// The name the connection asked for (TLS SNI, HTTP Host), if one was seen.
    pub name: Option<&'a str>,
    /// Names whose answers to this sandbox held `ip`.
    pub pinned_by: &'a [&'a str],
}

impl<'a> Destination<'a> {
    /// A destination known only by its address.
    pub fn ip(ip: Ipv4Addr) -> Self {
        Self {
            ip,
            name: None,
            pinned_by: &[],
        }
    }
}

/// Why a destination is allowed or denied (for the flow log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    Operator,
    AllowOut(Rule),
    DenyOut(Rule),
    Default,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Operator => f.write_str("operator range"),
            Reason::AllowOut(r) => write!(f, "allowOut {r}"),
            Reason::DenyOut(r) => write!(f, "denyOut {r}"),
            Reason::Default => f.write_str("default"),
        }
    }
}

/// A decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub reason: Reason,
}

impl Verdict {
    fn allow(reason: Reason) -> Self {
        Self {
            allowed: true,
            reason,
        }
    }
    fn deny(reason: Reason) -> Self {
        Self {
            allowed: false,
            reason,
        }
    }
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
