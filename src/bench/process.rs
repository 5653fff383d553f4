//! What the bench cases read about the machine and this process (Linux `/proc`; "n/a" or 0
//! elsewhere): cores, load average, CPU seconds, resident and peak resident memory.

/// Cores available to this process.
pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The one-minute load average, as `/proc/loadavg` prints it.
pub(super) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "n/a".to_owned())
}

/// The process's peak resident memory so far (Linux `VmHWM`), MB.
pub(super) fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// This process's user + system CPU seconds.
pub(super) fn process_cpu_s() -> f64 {
    cpu_s_of("self")
}

/// User + system CPU seconds of process `pid` ("self" for this one), from /proc.
pub(super) fn cpu_s_of(pid: &str) -> f64 {
    // /proc/PID/stat fields 14 and 15: user and system time in clock ticks (100 Hz on Linux).
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// This process's resident memory now (Linux `VmRSS`), MB (0 when unknown).
pub(super) fn rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
