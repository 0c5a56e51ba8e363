//! Where pulls may connect: the decision for one destination of a pull's request (the
//! registry, a redirect, a token realm, the ECR API), made by [`crate::guard`] before it
//! connects.
//!
//! - Hosts the operator named (`insecure` registries, mirrors, the ECR endpoint, `allow`
//!   entries written as `host:port`) may be at any address: the operator chose them.
//! - Any other host is resolved, and only its addresses outside the refused ranges
//!   (`warren_runtime::blocked::HostPolicy`: loopback, private, link-local and metadata,
//!   CGNAT, the rest of the egress block list, their IPv6 forms) are connected to, unless an
//!   `allow` range holds them.
//! - Plain HTTP goes only to hosts the operator named as plain HTTP (`insecure` registries,
//!   `http://` mirrors and ECR endpoint): a redirect from HTTPS to HTTP or a plain-HTTP token
//!   realm elsewhere is refused.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use warren_runtime::blocked::{HostPolicy, Refusal};

use crate::{PullError, PullOptions};

/// A destination the operator lets pulls reach although the default refuses it
/// (`--registry-allow`): a range, or one `host:port` at whatever address it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryAllow {
    /// Addresses in this range (`10.20.0.0/16`, `10.20.1.5`, `fd00::/8`).
    Range(IpNet),
    /// This host and port, over HTTPS (`registry.internal:5000`; without a port, 443).
    Host { host: String, port: u16 },
}

impl FromStr for RegistryAllow {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if let Ok(net) = s.parse::<IpNet>() {
            return Ok(RegistryAllow::Range(net.trunc()));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(RegistryAllow::Range(IpNet::from(ip)));
        }
        match split_host_port(s) {
            Some((host, port)) => Ok(RegistryAllow::Host {
                host,
                port: port.unwrap_or(443),
            }),
            None => Err(format!(
                "registry allow {s:?}: expected a CIDR, an address or HOST[:PORT], \
                 e.g. 10.20.0.0/16 or registry.internal:5000"
            )),
        }
    }
}

impl fmt::Display for RegistryAllow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistryAllow::Range(net) => write!(f, "{net}"),
            RegistryAllow::Host { host, port } => f.write_str(&authority(host, *port)),
        }
    }
}

/// `host:port`, bracketing an IPv6 host.
pub(crate) fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `HOST[:PORT]` (`[v6]:port` for IPv6) into a lower-case host without brackets and the port.
pub(crate) fn split_host_port(s: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':')?.parse().ok()?)),
        }
    } else {
        match s.rsplit_once(':') {
            Some((host, port)) => (host, Some(port.parse().ok()?)),
            None => (s, None),
        }
    };
    let ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    ok.then(|| (host.to_ascii_lowercase(), port))
}

/// How a request reaches its destination through the guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    /// A `CONNECT` tunnel: the client speaks TLS to the destination itself.
    Tunnel,
    /// A plain-HTTP request the guard forwards.
    Plain,
}

/// Why a destination is refused: shown to the template author.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    /// `host:port` as the request named it.
    pub target: String,
    pub reason: String,
}

impl From<Refused> for PullError {
    fn from(r: Refused) -> Self {
        PullError::NotAllowed {
            address: r.target,
            reason: r.reason,
        }
    }
}

/// A host the operator named, and whether plain HTTP is meant for it.
#[derive(Debug, Clone)]
struct Named {
    host: String,
    port: u16,
    plain: bool,
}

/// The decision for a pull's destinations; see the module text.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    named: Vec<Named>,
    addresses: HostPolicy,
}

impl Policy {
    pub fn new(opts: &PullOptions) -> Result<Self, PullError> {
        let mut named = Vec::new();
        for entry in &opts.insecure {
            let bare = entry.trim();
            let bare = bare.strip_prefix("http://").unwrap_or(bare);
            let bare = bare.trim_end_matches('/');
            let (host, port) = split_host_port(bare).ok_or_else(|| PullError::BadConfig {
                detail: format!("insecure registry {entry:?} is not HOST[:PORT]"),
            })?;
            named.push(Named {
                host,
                port: port.unwrap_or(80),
                plain: true,
            });
        }
        for mirror in &opts.mirrors {
            let (host, plain) = mirror.host();
            let (host, port) = split_host_port(host).ok_or_else(|| PullError::BadConfig {
                detail: format!("mirror {:?} has no HOST[:PORT]", mirror.endpoint),
            })?;
            named.push(Named {
                host,
                port: port.unwrap_or(if plain { 80 } else { 443 }),
                plain,
            });
        }
        if let Some(endpoint) = &opts.ecr_endpoint {
            let url = reqwest_oci::Url::parse(endpoint).map_err(|e| PullError::BadConfig {
                detail: format!("ECR endpoint {endpoint:?}: {e}"),
            })?;
            let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
                return Err(PullError::BadConfig {
                    detail: format!("ECR endpoint {endpoint:?} has no host"),
                });
            };
            named.push(Named {
                host: host.trim_matches(['[', ']']).to_ascii_lowercase(),
                port,
                plain: url.scheme() == "http",
            });
        }
        let mut ranges = Vec::new();
        for allow in &opts.allow {
            match allow {
                RegistryAllow::Range(net) => ranges.push(*net),
                RegistryAllow::Host { host, port } => named.push(Named {
                    host: host.trim_matches(['[', ']']).to_ascii_lowercase(),
                    port: *port,
                    plain: false,
                }),
            }
        }
        Ok(Policy {
            named,
            addresses: HostPolicy::new(ranges),
        })
    }

    fn named(&self, host: &str, port: u16) -> Option<&Named> {
        let host = host.trim_matches(['[', ']']);
        self.named
            .iter()
            .find(|n| n.port == port && n.host.eq_ignore_ascii_case(host))
    }

    /// Whether the operator named `host:port`, so that any address it has may be used.
    pub fn operator_named(&self, host: &str, port: u16) -> bool {
        self.named(host, port).is_some()
    }

    /// The decision that needs no address: plain HTTP only to hosts named as plain HTTP.
    pub fn check_transport(&self, host: &str, port: u16, via: Via) -> Result<(), Refused> {
        if via == Via::Tunnel || self.named(host, port).is_some_and(|n| n.plain) {
            return Ok(());
        }
        Err(Refused {
            target: authority(host.trim_matches(['[', ']']), port),
            reason: "plain HTTP (without TLS) goes only to registries the operator names with \
                     `warren serve --registry-insecure` or an http:// `--registry-mirror`"
                .into(),
        })
    }

    /// The decision for one resolved address of `host:port` (not operator-named).
    pub fn check_address(&self, host: &str, port: u16, ip: IpAddr) -> Result<(), Refused> {
        self.addresses
            .check(ip)
            .map_err(|r| refused_address(host, port, &r))
    }
}

fn refused_address(host: &str, port: u16, r: &Refusal) -> Refused {
    let host = host.trim_matches(['[', ']']);
    let target = authority(host, port);
    let what = if host.parse::<IpAddr>().is_ok() {
        r.to_string()
    } else {
        format!("{host} resolves to {r}")
    };
    Refused {
        reason: format!(
            "{what}; an operator may allow it with `warren serve --registry-allow {target}`"
        ),
        target,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mirror;

    fn opts() -> PullOptions {
        let mut o = PullOptions::new("/nonexistent");
        o.insecure = vec!["http://127.0.0.1:5000/".into(), "reg.lan".into()];
        o.mirrors = vec!["docker.io=https://[fd00::5]:8443"
            .parse::<Mirror>()
            .unwrap()];
        o.allow = vec![
            "10.20.0.0/16".parse().unwrap(),
            "Registry.Internal:5001".parse().unwrap(),
        ];
        o
    }

    #[test]
    fn allow_entries_parse() {
        assert_eq!(
            "10.0.0.1".parse::<RegistryAllow>().unwrap(),
            RegistryAllow::Range("10.0.0.1/32".parse().unwrap())
        );
        assert_eq!(
            "10.1.2.3/16".parse::<RegistryAllow>().unwrap(),
            RegistryAllow::Range("10.1.0.0/16".parse().unwrap())
        );
        assert_eq!(
            "[::1]:5000".parse::<RegistryAllow>().unwrap().to_string(),
            "[::1]:5000"
        );
        assert_eq!(
            "reg.example".parse::<RegistryAllow>().unwrap().to_string(),
            "reg.example:443"
        );
        for bad in ["", "a b", "reg:http", "http://reg:5000", "[::1"] {
            assert!(bad.parse::<RegistryAllow>().is_err(), "{bad}");
        }
    }

    #[test]
    fn plain_http_only_to_hosts_named_as_plain() {
        let p = Policy::new(&opts()).unwrap();
        assert!(p.check_transport("127.0.0.1", 5000, Via::Plain).is_ok());
        assert!(p.check_transport("reg.lan", 80, Via::Plain).is_ok());
        let r = p
            .check_transport("127.0.0.1", 5001, Via::Plain)
            .unwrap_err();
        assert_eq!(r.target, "127.0.0.1:5001");
        assert!(r.reason.contains("plain HTTP"), "{}", r.reason);
        // Named for HTTPS is not named for plain HTTP.
        assert!(p
            .check_transport("registry.internal", 5001, Via::Plain)
            .is_err());
        assert!(p.check_transport("[fd00::5]", 8443, Via::Plain).is_err());
        assert!(p.check_transport("anything", 443, Via::Tunnel).is_ok());
    }

    #[test]
    fn named_hosts_and_ranges_are_the_operators_choice() {
        let p = Policy::new(&opts()).unwrap();
        assert!(p.operator_named("REGISTRY.internal", 5001));
        assert!(p.operator_named("[fd00::5]", 8443));
        assert!(!p.operator_named("registry.internal", 443));
        assert!(p
            .check_address("x", 443, "10.20.3.4".parse().unwrap())
            .is_ok());
        let r = p
            .check_address("127.0.0.1", 5001, "127.0.0.1".parse().unwrap())
            .unwrap_err();
        assert_eq!(
            r.reason,
            "127.0.0.1 is loopback (127.0.0.0/8); an operator may allow it with \
             `warren serve --registry-allow 127.0.0.1:5001`"
        );
        let r = p
            .check_address(
                "meta.example",
                443,
                "::ffff:169.254.169.254".parse().unwrap(),
            )
            .unwrap_err();
        assert!(
            r.reason
                .starts_with("meta.example resolves to ::ffff:169.254.169.254"),
            "{}",
            r.reason
        );
    }
}
