//! The sandbox record and its lifecycle state machine.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use warren_runtime::egress::EgressPolicy;
use warren_runtime::{PauseMode, RuntimeSandbox};

/// Lifecycle of a sandbox as the control plane records it.
///
/// ```text
/// Pending --> Running --> Stopping --> Killed
///    |           |  ^         |
///    |           v  |         v
///    +------> Failed <--------+      Running <-> Paused --> Stopping
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Recorded, the runtime is creating it. Counts against the concurrency limit.
    Pending,
    Running,
    /// Paused by the API or at its end time (`onTimeout = pause`); connect resumes it. Paused
    /// sandboxes never expire: they are kept until killed.
    Paused,
    /// Kill in progress: the proxy no longer routes to it.
    Stopping,
    Killed,
    /// Creation, kill or reattach failed; `failure` says why.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("sandbox cannot go from {from:?} to {to:?}")]
pub struct TransitionError {
    pub from: SandboxState,
    pub to: SandboxState,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Pending => "pending",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Stopping => "stopping",
            SandboxState::Killed => "killed",
            SandboxState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<SandboxState> {
        Some(match s {
            "pending" => SandboxState::Pending,
            "running" => SandboxState::Running,
            "paused" => SandboxState::Paused,
            "stopping" => SandboxState::Stopping,
            "killed" => SandboxState::Killed,
            "failed" => SandboxState::Failed,
            _ => return None,
        })
    }

    /// The transition table. Everything not listed is refused.
    pub fn can_become(self, to: SandboxState) -> bool {
        use SandboxState::*;
        matches!(
            (self, to),
            (Pending, Running)
                | (Pending, Failed)
                | (Running, Stopping)
                | (Running, Paused)
                | (Running, Failed)
                | (Paused, Running)
                | (Paused, Stopping)
                | (Stopping, Killed)
                | (Stopping, Failed)
        )
    }

    /// Terminal states: the sandbox no longer exists for API callers (404).
    pub fn is_gone(self) -> bool {
        matches!(self, SandboxState::Killed | SandboxState::Failed)
    }

    /// Whether the sandbox holds a runtime slot (counts against the concurrency limit).
    pub fn is_live(self) -> bool {
        matches!(
            self,
            SandboxState::Pending
                | SandboxState::Running
                | SandboxState::Paused
                | SandboxState::Stopping
        )
    }
}

/// One sandbox, exactly as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sandbox {
    pub id: warren_types::SandboxId,
    pub template: String,
    pub state: SandboxState,
    /// Why the sandbox failed (state `Failed`).
    pub failure: Option<String>,
    pub resources: warren_types::Resources,
    pub allow_internet_access: bool,
    pub metadata: BTreeMap<String, String>,
    pub started_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// Sent by SDKs as `X-Access-Token` to the agent; the agent checks it.
    pub envd_access_token: String,
    /// Sent by SDKs as `E2B-Traffic-Access-Token` to non-agent ports.
    pub traffic_access_token: String,
    /// What the runtime returned (agent address and its opaque record) once running.
    pub runtime: Option<RuntimeSandbox>,
    /// Sandbox-wide environment variables from create, needed again by resume and fork. They
    /// may hold secrets: never log them.
    pub env_vars: BTreeMap<String, String>,
    pub lifecycle: Lifecycle,
    /// What the current pause kept (state `Paused` only).
    pub pause_mode: Option<PauseMode>,
    /// Who may reach the sandbox's ports through the proxy.
    pub network: Network,
    /// The team of the API key that created it (a fork's children: the parent's).
    pub team: String,
    /// Volumes it mounts (again on every resume; its forks and snapshots mount them too).
    pub volume_mounts: Vec<crate::volumes::VolumeMountRecord>,
}

/// A sandbox's network settings as the control plane enforces them.
// `default`: records written before network settings existed hold `{}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Network {
    /// User ports answer anyone who reaches the proxy (`true`, E2B's default), or only
    /// requests carrying the sandbox's traffic access token (`false`). In-image service ports
    /// (the code interpreter's) always need a token.
    pub allow_public_traffic: bool,
    /// What the sandbox may connect to (`allowOut`, `denyOut`) as given; the runtime also
    /// applies `allow_internet_access` ([`warren_runtime::CreateSpec::egress_policy`]).
    #[serde(flatten)]
    pub egress: EgressPolicy,
    /// The `Host` header services on user ports get (`${PORT}`: the port), instead of the
    /// sandbox's own address (E2B's `maskRequestHost`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            allow_public_traffic: true,
            egress: EgressPolicy::default(),
            mask_request_host: None,
        }
    }
}

/// What happens at the end time, and whether traffic wakes a paused sandbox.
// `default`: records written before lifecycles existed hold `{}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Lifecycle {
    pub on_timeout: OnTimeout,
    /// For `OnTimeout::Pause`: keep memory (`Some(true)`), files only (`Some(false)`), or the
    /// best the runtime has (`None`).
    pub pause_memory: Option<bool>,
    /// Traffic through the proxy resumes the sandbox when it is paused.
    pub auto_resume: bool,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    #[default]
    Kill,
    Pause,
}

impl OnTimeout {
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Kill => "kill",
            OnTimeout::Pause => "pause",
        }
    }
}

impl Sandbox {
    /// The egress policy the runtime enforces: its rules with `allow_internet_access` folded
    /// in (as [`warren_runtime::CreateSpec::egress_policy`] does for a create).
    pub fn egress_policy(&self) -> EgressPolicy {
        self.network
            .egress
            .clone()
            .with_internet_access(self.allow_internet_access)
    }

    /// Moves to `to` if the table allows it.
    pub fn transition(&mut self, to: SandboxState) -> Result<(), TransitionError> {
        if self.state.can_become(to) {
            self.state = to;
            Ok(())
        } else {
            Err(TransitionError {
                from: self.state,
                to,
            })
        }
    }

    /// Marks the sandbox failed from any non-terminal state (used when the runtime lost it).
    pub fn fail(&mut self, reason: impl Into<String>) {
        self.state = SandboxState::Failed;
        self.failure = Some(reason.into());
    }

    /// The state the E2B API shows: `running` or `paused`.
    pub fn api_state(&self) -> &'static str {
        match self.state {
            SandboxState::Paused => "paused",
            _ => "running",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SandboxState::*;
    use super::*;

    const ALL: [SandboxState; 6] = [Pending, Running, Paused, Stopping, Killed, Failed];

    #[test]
    fn transition_table() {
        let allowed = [
            (Pending, Running),
            (Pending, Failed),
            (Running, Stopping),
            (Running, Paused),
            (Running, Failed),
            (Paused, Running),
            (Paused, Stopping),
            (Stopping, Killed),
            (Stopping, Failed),
        ];
        for from in ALL {
            for to in ALL {
                assert_eq!(
                    from.can_become(to),
                    allowed.contains(&(from, to)),
                    "{from:?} -> {to:?}"
                );
            }
        }
    }

    #[test]
    fn terminal_states_go_nowhere() {
        for to in ALL {
            assert!(!Killed.can_become(to));
            assert!(!Failed.can_become(to));
        }
    }

    #[test]
    fn names_round_trip() {
        for s in ALL {
            assert_eq!(SandboxState::parse(s.as_str()), Some(s));
        }
        assert_eq!(SandboxState::parse("bogus"), None);
    }
}

/// One snapshot as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// What the API calls `snapshotID`; usable as `templateID`.
    pub id: String,
    /// The caller's name for it, if any (names are unique).
    pub names: Vec<String>,
    /// The runtime's key for its saved state.
    pub key: String,
    pub sandbox_id: String,
    pub template: String,
    pub resources: warren_types::Resources,
    pub allow_internet_access: bool,
    /// The source sandbox's env vars, given to sandboxes created from it. May hold secrets.
    pub env_vars: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    /// Whether memory and processes are in it (else only the filesystem).
    pub memory: bool,
    pub bytes: u64,
    pub created_at: DateTime<Utc>,
    /// The team of the sandbox it was taken of.
    pub team: String,
    /// The volumes its sandbox mounted: sandboxes made from it mount them too (the volumes'
    /// files are not in the snapshot; they are shared, live).
    pub volume_mounts: Vec<crate::volumes::VolumeMountRecord>,
}
