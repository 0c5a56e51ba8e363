//! The control plane's tunables.

use std::time::Duration;

/// The code interpreter's port, a service port on every template (E2B's convention).
pub const SERVICE_PORT: u16 = 49999;

/// Tunables of the control plane.
#[derive(Debug, Clone)]
pub struct Config {
    /// Live sandboxes allowed at once; creating one more is `ResourceExhausted`.
    pub max_concurrent: usize,
    /// Suggested wait when the limit is hit.
    pub retry_after: Duration,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub cpu_count: u32,
    pub memory_mb: u32,
    pub disk_mb: u32,
    /// envd version reported to SDKs (`e2b-compat.md` §6: ≥ 0.6.4 gates nothing off).
    pub envd_version: String,
    /// Domain for `{port}-{id}.{domain}` hosts, returned to SDKs when set.
    pub domain: Option<String>,
    /// How often sandboxes that ended on their own are looked for.
    pub exit_poll: Duration,
    /// Template names snapshots may not take: a snapshot id is looked up before templates in
    /// create, so a snapshot named like a template would take over every create of it.
    pub template_names: Vec<String>,
    /// Sandbox ports of in-image services (the code interpreter's 49999): like the agent's
    /// port, they answer only requests carrying the sandbox's access or traffic token.
    pub service_ports: Vec<u16>,
    /// A pause at the end time (`onTimeout = pause`) that fails is tried again after
    /// `end_of_life_pause_retry`; after this many failed attempts the sandbox is killed, so a
    /// sandbox that breaks its own save cannot outlive its end time.
    pub end_of_life_pause_attempts: u32,
    pub end_of_life_pause_retry: Duration,
    /// Quotas on what sandboxes leave on disk (threat model M5): snapshots in all, snapshots
    /// of one sandbox, bytes of all snapshots, and paused sandboxes at once.
    pub max_snapshots: usize,
    pub max_snapshots_per_sandbox: usize,
    pub max_snapshot_bytes: u64,
    pub max_paused: usize,
    /// Pauses and snapshots are refused while the runtime's save area has less free space or
    /// fewer free inodes than this (sandboxes can fill a disk with tiny files too).
    pub min_free_bytes: u64,
    pub min_free_inodes: u64,
    /// Killed and failed sandboxes are forgotten this long after their end time.
    pub ended_retention: Duration,
    /// Ceilings on what a template build may ask for (`cpuCount`, `memoryMB`).
    pub max_template_cpu: u32,
    pub max_template_memory_mb: u32,
    /// Where private networks get their /24s (one each). The addresses exist only inside
    /// sandboxes' slots (translated there), so the range need not be routed anywhere; it
    /// should not hold addresses sandboxes must reach otherwise.
    pub network_range: ipnet::Ipv4Net,
    /// A new volume's quota when its creator names none: bytes (the size of its
    /// filesystem, which the volume owns on the data disk from its create) and inodes
    /// (files and directories).
    pub volume_bytes: u64,
    pub volume_inodes: u64,
    /// The largest quota a creator may ask for, and how many volumes the server keeps.
    pub max_volume_bytes: u64,
    pub max_volumes: usize,
    pub max_volume_snapshots: usize,
    /// Secrets one team may keep.
    pub max_secrets: usize,
    /// Prometheus gets one series per running sandbox (CPU, memory, disk): useful on a host
    /// of tens of sandboxes, costly for a scraper at thousands.
    pub per_sandbox_metrics: bool,
    /// The audit trail and sandbox logs: agents' journals are read and kept. Off, nothing is
    /// read (for measuring what the trail costs).
    pub audit: bool,
    /// What one sandbox may put into the audit trail, and the free space the trail leaves.
    pub audit_budget: AuditBudget,
}

/// Bounds on what the audit trail keeps (threat model W3-M2): without them one sandbox
/// executing `/bin/true` in a loop writes ~21 GB a day into the store, and a full data disk
/// fails the store for every team. What a bound leaves out is not lost silently: it is counted,
/// by kind and reason, in one `audit.dropped` entry per sandbox and `summary_every`.
#[derive(Debug, Clone)]
pub struct AuditBudget {
    /// Entries one sandbox may have kept per second, on average over the sources...
    pub entries_per_second: u32,
    /// ...and in one go (a token bucket this deep, full when the sandbox is first read), so a
    /// burst of activity is kept whole and a loop is kept at the rate.
    pub burst: u32,
    /// Most bytes one sandbox's entries may take in the store within the retention window
    /// (an estimate of the rows' size; entries already kept count, also after a restart).
    pub sandbox_bytes: u64,
    /// Most bytes of entries read from one source in one round: a source that answers with
    /// huge pages waits for the next round (its own bounded ring counts what it drops).
    pub round_bytes: u64,
    /// Largest entry kept whole; the message and field values of a bigger one are clipped
    /// (the agent clips its own at 2 KiB; only a hostile agent sends more).
    pub entry_bytes: usize,
    /// Nothing more is written to the audit trail while the data disk (which holds the
    /// store) has less free space than this, or fewer free inodes than
    /// [`Config::min_free_inodes`]. Above [`Config::min_free_bytes`] on purpose: the trail
    /// stops before pauses and snapshots are refused.
    pub min_free_bytes: u64,
    /// How often at most a sandbox's left-out entries are summed up (and when it pauses or
    /// ends).
    pub summary_every: Duration,
}

impl Default for AuditBudget {
    fn default() -> Self {
        AuditBudget {
            entries_per_second: 10,
            burst: 1000,
            sandbox_bytes: 64 * 1024 * 1024,
            round_bytes: 4 * 1024 * 1024,
            entry_bytes: 16 * 1024,
            min_free_bytes: 2 * 1024 * 1024 * 1024,
            summary_every: Duration::from_secs(60),
        }
    }
}

impl Config {
    /// What a sandbox of a template with no size of its own is given.
    pub fn default_resources(&self) -> warren_types::Resources {
        warren_types::Resources {
            cpu_count: self.cpu_count,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_concurrent: 100,
            retry_after: Duration::from_secs(1),
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            cpu_count: 2,
            memory_mb: 512,
            disk_mb: 2048,
            envd_version: "0.6.13".into(),
            domain: None,
            exit_poll: Duration::from_secs(1),
            template_names: Vec::new(),
            service_ports: vec![SERVICE_PORT],
            end_of_life_pause_attempts: 3,
            end_of_life_pause_retry: Duration::from_secs(60),
            max_snapshots: 1000,
            max_snapshots_per_sandbox: 100,
            max_snapshot_bytes: 500 * 1024 * 1024 * 1024,
            max_paused: 1000,
            min_free_bytes: 1024 * 1024 * 1024,
            min_free_inodes: 50_000,
            ended_retention: Duration::from_secs(7 * 24 * 3600),
            max_template_cpu: 8,
            max_template_memory_mb: 16 * 1024,
            network_range: ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(10, 224, 0, 0), 12)
                .expect("a /12 is a valid prefix"),
            volume_bytes: 10 * 1024 * 1024 * 1024,
            volume_inodes: 1 << 20,
            max_volume_bytes: 1024 * 1024 * 1024 * 1024,
            max_volumes: 1000,
            max_volume_snapshots: 1000,
            max_secrets: 1000,
            per_sandbox_metrics: false,
            audit: true,
            audit_budget: AuditBudget::default(),
        }
    }
}
