//! The vocabulary every Warren crate shares, written once: what a sandbox id is, what a
//! sandbox is given, and the port its agent listens on. Pure values: no I/O, no back end.

mod resources;
mod sandbox_id;

pub use resources::Resources;
pub use sandbox_id::{InvalidSandboxId, SandboxId};

/// The port of the agent (envd) inside every sandbox: what the host connects to, what the
/// proxy routes `49983-<id>.<domain>` to and what the firewall always lets the host reach.
pub const AGENT_PORT: u16 = 49983;

/// The agent's listen address inside a sandbox (all interfaces, [`AGENT_PORT`]), as the
/// runtimes pass it to the agent.
pub const AGENT_LISTEN: &str = "0.0.0.0:49983";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_address_is_the_agent_port() {
        let addr: std::net::SocketAddr = AGENT_LISTEN.parse().unwrap();
        assert_eq!(addr.port(), AGENT_PORT);
        assert!(addr.ip().is_unspecified());
    }
}
