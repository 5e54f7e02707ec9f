//! Backup-log sizes of a local cluster's peers, scaled to their memory.
//!
//! A peer's log engine preallocates its files on disk: a 256 MiB primary log and, per
//! backup zone it holds, a secondary log of twice the zone size (512 MiB at the 256 MiB
//! default). Those defaults fit servers with gigabytes of chunk memory. A local cluster of
//! small peers (`--peer-memory-mb 64` for a test or a laptop demo) would still reserve
//! gigabytes of disk, on `/tmp` (often RAM) for a temporary cluster. So when a
//! [`LaunchSpec`](crate::LaunchSpec) sets the peers' memory and names no configuration
//! file of its own, `start` writes `DIR/peer-backup.toml` with sizes scaled to that
//! memory and gives it to every peer as `--config`. From 1 GiB of peer memory up, the
//! sizes are the node defaults.

use std::path::Path;

/// Name of the generated configuration file in the cluster directory.
pub const PEER_BACKUP_CONFIG: &str = "peer-backup.toml";

/// Backup settings of peers with `memory_mb` MiB of chunk memory, in KiB (zone in MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupSizes {
    /// Payload per backup zone, MiB: a quarter of the memory, 4..=256.
    pub zone_mb: u64,
    /// Secondary-log segment, KiB: a power of two near 1/32 of a zone, 256..=8192.
    pub segment_kb: u64,
    /// Write buffer, KiB: 1/8 of a zone, at least two segments, at most 32 MiB.
    pub write_buffer_kb: u64,
    /// Primary log, KiB: one zone, at least two write buffers, at most 256 MiB.
    pub primary_log_kb: u64,
}

impl BackupSizes {
    /// The sizes for peers of `memory_mb` MiB.
    pub fn for_memory(memory_mb: u64) -> Self {
        let zone_mb = (memory_mb / 4).clamp(4, 256);
        let zone_kb = zone_mb * 1024;
        let segment_kb = prev_power_of_two(zone_kb / 32).clamp(256, 8192);
        let write_buffer_kb = (zone_kb / 8).clamp(2 * segment_kb, 32 * 1024);
        let primary_log_kb = zone_kb.clamp(2 * write_buffer_kb, 256 * 1024);
        BackupSizes {
            zone_mb,
            segment_kb,
            write_buffer_kb,
            primary_log_kb,
        }
    }

    /// The `[backup]` section holding these sizes.
    pub fn toml(&self) -> String {
        format!(
            "# Written by `myriad cluster start` for peers of this cluster's memory size\n\
             # (see myriad-launcher's sizing module); edit it or pass --config of your own.\n\
             [backup]\nzone_mb = {}\nsegment_kb = {}\nwrite_buffer_kb = {}\nprimary_log_kb = {}\n",
            self.zone_mb, self.segment_kb, self.write_buffer_kb, self.primary_log_kb
        )
    }

    /// Writes [`toml`](Self::toml) to `path`.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.toml())
    }
}

fn prev_power_of_two(value: u64) -> u64 {
    if value == 0 {
        return 1;
    }
    1 << (63 - value.leading_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_peers_get_the_node_defaults() {
        let defaults = BackupSizes {
            zone_mb: 256,
            segment_kb: 8192,
            write_buffer_kb: 32 * 1024,
            primary_log_kb: 256 * 1024,
        };
        assert_eq!(BackupSizes::for_memory(1024), defaults);
        assert_eq!(BackupSizes::for_memory(64 * 1024), defaults);
    }

    #[test]
    fn small_peers_get_small_logs_that_keep_the_engine_rules() {
        for memory_mb in [1, 16, 64, 100, 128, 300, 512, 1000] {
            let sizes = BackupSizes::for_memory(memory_mb);
            let zone_kb = sizes.zone_mb * 1024;
            assert!(sizes.segment_kb.is_power_of_two(), "{sizes:?}");
            let segments = 2 * zone_kb / sizes.segment_kb;
            assert!((3..=65536).contains(&segments), "{memory_mb}: {sizes:?}");
            assert!(sizes.write_buffer_kb >= 2 * sizes.segment_kb, "{sizes:?}");
            assert!(
                sizes.primary_log_kb >= 2 * sizes.write_buffer_kb,
                "{sizes:?}"
            );
        }
        let small = BackupSizes::for_memory(64);
        assert_eq!(small.zone_mb, 16);
        assert_eq!(small.primary_log_kb, 16 * 1024);
    }
}
