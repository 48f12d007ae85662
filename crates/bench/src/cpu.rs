//! Whole-machine CPU use between two readings of /proc/stat.

/// Busy and total jiffies of all CPUs.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSample {
    busy: u64,
    total: u64,
}

impl CpuSample {
    /// Reads /proc/stat now (zeros where it cannot be read).
    pub fn now() -> CpuSample {
        let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
            return CpuSample::default();
        };
        let fields: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let total: u64 = fields.iter().sum();
        // idle and iowait are not busy.
        let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
        CpuSample {
            busy: total.saturating_sub(idle),
            total,
        }
    }

    /// Percent of all CPUs busy since `earlier`.
    pub fn busy_percent_since(&self, earlier: &CpuSample) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        100.0 * self.busy.saturating_sub(earlier.busy) as f64 / total as f64
    }
}
