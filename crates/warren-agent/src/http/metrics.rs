//! `GET /metrics`: a resource snapshot the control plane polls.
//!
//! CPU usage is the busy share of all CPUs since the previous call (like gopsutil's
//! `cpu.Percent(0)` that envd uses), or over a 100 ms window when there is no recent enough
//! previous reading. Memory comes from `/proc/meminfo`, or from the agent's memory cgroup
//! when that has a limit below the machine's memory; disk figures are for `/`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::auth::http_error;

const MIB: u64 = 1024 * 1024;
/// Shortest window a CPU percentage is computed over; shorter ones are mostly noise.
const MIN_WINDOW: Duration = Duration::from_millis(100);

#[derive(Debug, Serialize)]
struct Metrics {
    ts: i64,
    cpu_count: u32,
    cpu_used_pct: f32,
    mem_total: u64,
    mem_used: u64,
    mem_cache: u64,
    mem_total_mib: u64,
    mem_used_mib: u64,
    disk_used: u64,
    disk_total: u64,
}

pub async fn metrics() -> Response {
    let cpu_used_pct = cpu_used_pct().await;
    // The rest reads small pseudo-files and calls statvfs: quick, but still blocking calls.
    let rest = tokio::task::spawn_blocking(move || -> Result<Metrics, String> {
        let mem = memory()?;
        let (disk_total, disk_avail) = disk("/")?;
        Ok(Metrics {
            ts: super::signing::unix_now(),
            cpu_count: cpu_count(),
            cpu_used_pct,
            mem_total: mem.total,
            mem_used: mem.used,
            mem_cache: mem.cache,
            mem_total_mib: mem.total / MIB,
            mem_used_mib: mem.used / MIB,
            disk_used: disk_total.saturating_sub(disk_avail),
            disk_total,
        })
    })
    .await;
    match rest {
        Ok(Ok(m)) => Json(m).into_response(),
        Ok(Err(e)) => http_error(StatusCode::INTERNAL_SERVER_ERROR, e),
        Err(e) => http_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// CPU

/// Aggregate jiffies from the `cpu` line of /proc/stat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuTimes {
    busy: u64,
    total: u64,
}

/// The previous reading, so consecutive polls measure the interval between them.
static LAST_CPU: Mutex<Option<(Instant, CpuTimes)>> = Mutex::new(None);

async fn cpu_used_pct() -> f32 {
    let Some(now) = read_cpu_times() else {
        return 0.0;
    };
    let previous = *LAST_CPU.lock().unwrap_or_else(|e| e.into_inner());
    let (before, after) = match previous {
        Some((at, before)) if at.elapsed() >= MIN_WINDOW => (before, now),
        _ => {
            tokio::time::sleep(MIN_WINDOW).await;
            match read_cpu_times() {
                Some(after) => (now, after),
                None => return 0.0,
            }
        }
    };
    *LAST_CPU.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), after));
    busy_percent(before, after)
}

/// Busy share between two readings in percent, rounded to two decimals as envd reports it.
fn busy_percent(before: CpuTimes, after: CpuTimes) -> f32 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    let busy = after.busy.saturating_sub(before.busy).min(total);
    let pct = busy as f64 * 100.0 / total as f64;
    ((pct * 100.0).round() / 100.0) as f32
}

fn read_cpu_times() -> Option<CpuTimes> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(stat.lines().next()?)
}

/// `cpu  user nice system idle iowait irq softirq steal guest guest_nice`; guest time is
/// already counted in user/nice, so it is left out of the total.
fn parse_cpu_line(line: &str) -> Option<CpuTimes> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = fields.take(8).map(|f| f.parse().unwrap_or(0)).collect();
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some(CpuTimes {
        busy: total.saturating_sub(idle),
        total,
    })
}

/// Online logical CPUs: the `cpuN` lines of /proc/stat.
fn cpu_count() -> u32 {
    let counted = std::fs::read_to_string("/proc/stat")
        .map(|s| {
            s.lines()
                .filter(|l| {
                    l.strip_prefix("cpu")
                        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(0);
    if counted > 0 {
        return u32::try_from(counted).unwrap_or(u32::MAX);
    }
    std::thread::available_parallelism()
        .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
        .unwrap_or(1)
}

// ---------------------------------------------------------------------------------------------
// Memory

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Memory {
    total: u64,
    used: u64,
    cache: u64,
}

fn memory() -> Result<Memory, String> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| format!("error reading /proc/meminfo: {e}"))?;
    let host = parse_meminfo(&text);
    Ok(cgroup_memory(host.total).unwrap_or(host))
}

/// Used memory as gopsutil computes it: total minus free, buffers and page cache (including
/// reclaimable slab); the cache figure is that page cache.
fn parse_meminfo(text: &str) -> Memory {
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kib| kib.saturating_mul(1024))
            .unwrap_or(0)
    };
    let total = field("MemTotal");
    let cache = field("Cached").saturating_add(field("SReclaimable"));
    let used = total
        .saturating_sub(field("MemFree"))
        .saturating_sub(field("Buffers"))
        .saturating_sub(cache);
    Memory { total, used, cache }
}

/// The agent's memory cgroup (v2, else v1) when it is limited below `host_total`. Used memory
/// leaves out inactive page cache, the way `docker stats` reports it.
fn cgroup_memory(host_total: u64) -> Option<Memory> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |dir: &str, file: &str| std::fs::read_to_string(format!("{dir}/{file}")).ok();
    let num = |s: Option<String>| s.and_then(|s| s.trim().parse::<u64>().ok());
    let stat = |text: Option<String>, key: &str| -> u64 {
        text.and_then(|t| {
            t.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse::<u64>().ok())?
            })
        })
        .unwrap_or(0)
    };
    for line in membership.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (root, v2) = if id == "0" && controllers.is_empty() {
            ("/sys/fs/cgroup", true)
        } else if controllers.split(',').any(|c| c == "memory") {
            ("/sys/fs/cgroup/memory", false)
        } else {
            continue;
        };
        // Inside a cgroup namespace the mount's root is our own cgroup already.
        let candidates = [format!("{root}{path}"), root.to_string()];
        for dir in candidates.iter().map(|d| d.trim_end_matches('/')) {
            let (limit, usage, stats) = if v2 {
                (
                    num(read(dir, "memory.max")),
                    num(read(dir, "memory.current")),
                    read(dir, "memory.stat"),
                )
            } else {
                (
                    num(read(dir, "memory.limit_in_bytes")),
                    num(read(dir, "memory.usage_in_bytes")),
                    read(dir, "memory.stat"),
                )
            };
            let (Some(limit), Some(usage)) = (limit, usage) else {
                continue;
            };
            if limit == 0 || limit >= host_total {
                return None;
            }
            let (cache_key, inactive_key) = if v2 {
                ("file", "inactive_file")
            } else {
                ("total_cache", "total_inactive_file")
            };
            let cache = stat(stats.clone(), cache_key);
            let inactive = stat(stats, inactive_key);
            return Some(Memory {
                total: limit,
                used: usage.saturating_sub(inactive).min(limit),
                cache,
            });
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// Disk

/// Total and available bytes of the filesystem holding `path`.
fn disk(path: &str) -> Result<(u64, u64), String> {
    let st = nix::sys::statvfs::statvfs(path).map_err(|e| format!("statvfs {path}: {e}"))?;
    let unit = st.fragment_size() as u64;
    Ok((
        (st.blocks() as u64).saturating_mul(unit),
        (st.blocks_available() as u64).saturating_mul(unit),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lines_parse() {
        let t = parse_cpu_line("cpu  100 0 50 800 50 0 0 0 0 0").expect("cpu line");
        assert_eq!(
            t,
            CpuTimes {
                busy: 150,
                total: 1000
            }
        );
        assert!(parse_cpu_line("cpu0 1 2 3 4").is_none());
        let later = CpuTimes {
            busy: 250,
            total: 1400,
        };
        assert_eq!(busy_percent(t, later), 25.0);
        assert_eq!(busy_percent(t, t), 0.0);
    }

    #[test]
    fn meminfo_parses() {
        let m = parse_meminfo(
            "MemTotal:       1000 kB\nMemFree:         200 kB\nBuffers:          50 kB\n\
             Cached:          100 kB\nSwapCached:        7 kB\nSReclaimable:     50 kB\n",
        );
        assert_eq!(m.total, 1000 * 1024);
        assert_eq!(m.cache, 150 * 1024);
        assert_eq!(m.used, 600 * 1024);
    }
}
