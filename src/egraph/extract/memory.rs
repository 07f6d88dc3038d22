//! The memory limit: the process's resident size, and the growth of the search's tables
//! between two looks at it.

/// The search's large tables and `Vec`s between two looks at the resident size: each
/// doubles its block when full, writing its contents into fresh pages while the old block is
/// still held, and at MHA decode's sizes one such growth (hundreds of MiB to gigabytes) took
/// the search 1.3 GiB past an 8 GiB limit between two looks. A table counts as grown
/// already when, growing as fast as since the last look, it could fill before the next one.
#[derive(Default)]
pub(super) struct GrowthWatch {
    /// Each table's length at the last look, in the order `ahead` is given them.
    pub(super) last: Vec<usize>,
}

impl GrowthWatch {
    /// The bytes that the tables, given as (length, capacity, element bytes), may add to the
    /// resident size by growing before the next look: the contents copied by each growth.
    pub(super) fn ahead(&mut self, tables: &[(usize, usize, usize)]) -> usize {
        self.last.resize(tables.len(), 0);
        let mut bytes = 0;
        for (&(len, capacity, size), last) in tables.iter().zip(&mut self.last) {
            // Twice the growth since the last look, so an accelerating table is seen in time.
            let margin = 2 * len.saturating_sub(*last) + 1;
            if len + margin >= capacity {
                bytes += capacity * size;
            }
            *last = len;
        }
        bytes
    }
}

/// The process's resident memory in MiB (`VmRSS` of `/proc/self/status`), where the system
/// reports it.
pub fn resident_mib() -> Option<usize> {
    proc_mib("/proc/self/status", "VmRSS:")
}

/// A `field   N kB` line of a Linux `/proc` file, in MiB; `None` where there is no such file
/// or line.
pub fn proc_mib(file: &str, field: &str) -> Option<usize> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

#[cfg(test)]
mod tests {
    use super::GrowthWatch;

    /// A table counts as grown, its contents as bytes the next growth writes, when growing
    /// as fast as since the last look it could fill before the next look; one far from full,
    /// or one that stopped growing short of full, does not.
    #[test]
    fn a_table_that_may_fill_before_the_next_look_counts_as_grown() {
        let mut watch = GrowthWatch::default();
        assert_eq!(watch.ahead(&[(10, 1000, 8)]), 0);
        // 300 more: 310 + 2 × 300 + 1 < 1000.
        assert_eq!(watch.ahead(&[(310, 1000, 8)]), 0);
        // 300 more again: 610 + 601 ≥ 1000.
        assert_eq!(watch.ahead(&[(610, 1000, 8)]), 8000);
        assert_eq!(watch.ahead(&[(610, 1000, 8)]), 0);
        assert_eq!(watch.ahead(&[(1000, 1000, 8)]), 8000);
        let mut two = GrowthWatch::default();
        assert_eq!(
            two.ahead(&[(16, 16, 4), (50, 100, 1), (0, 100, 1)]),
            64 + 100
        );
    }
}
