//! What watching costs the programs watched: the time to start and wait for `/bin/true`, with
//! nobody listening to process events, with a listener that reads each exec's cgroup (the `ns`
//! runtime's watcher when the program is not a sandbox's) and with one that reads everything
//! (the microVM agent's watcher). Rounds alternate so that load from other work spreads evenly.
//!
//! `cargo run --release -p warren-procwatch --example exec_cost -- [execs per round] [rounds]`
//! (root of the initial namespaces).

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_procwatch::{procfs, Event, ProcInfo, Watcher};

#[derive(Clone, Copy, Debug)]
enum Mode {
    Nobody,
    Cgroup,
    Everything,
}

fn listener(
    mode: Mode,
    stop: Arc<AtomicBool>,
    seen: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    let mut w = Watcher::subscribe().expect("subscribe (root of the initial namespaces)");
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            for ev in w.next_events(Duration::from_millis(100)).unwrap() {
                if let Event::Exec { pid, .. } = ev {
                    match mode {
                        Mode::Cgroup => {
                            std::hint::black_box(procfs::cgroups(pid));
                        }
                        _ => {
                            std::hint::black_box(procfs::cgroups(pid));
                            std::hint::black_box(ProcInfo::read(pid));
                        }
                    }
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    })
}

fn round(n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            Command::new("/bin/true").status().unwrap();
            t.elapsed()
        })
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let modes = [Mode::Nobody, Mode::Cgroup, Mode::Everything];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); modes.len()];
    let mut seen_total = [0u64; 3];
    for _ in 0..rounds {
        for (i, mode) in modes.iter().enumerate() {
            let stop = Arc::new(AtomicBool::new(false));
            let seen = Arc::new(AtomicU64::new(0));
            let thread = match mode {
                Mode::Nobody => None,
                m => Some(listener(*m, stop.clone(), seen.clone())),
            };
            samples[i].extend(round(n));
            stop.store(true, Ordering::Relaxed);
            if let Some(t) = thread {
                t.join().unwrap();
            }
            seen_total[i] += seen.load(Ordering::Relaxed);
        }
    }
    println!("| listener | p50 | p90 | mean | execs seen |");
    println!("| --- | --- | --- | --- | --- |");
    for (i, mode) in modes.iter().enumerate() {
        let s = &mut samples[i];
        s.sort();
        let mean = s.iter().sum::<Duration>() / s.len() as u32;
        println!(
            "| {mode:?} | {:.0} µs | {:.0} µs | {:.0} µs | {} |",
            s[s.len() / 2].as_secs_f64() * 1e6,
            s[s.len() * 9 / 10].as_secs_f64() * 1e6,
            mean.as_secs_f64() * 1e6,
            seen_total[i]
        );
    }
}
