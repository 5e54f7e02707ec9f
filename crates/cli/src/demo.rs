//! `myriad demo`: what Myriad can do today, in about ten seconds on one machine.
//!
//! For now that is the memory manager, the first layer: store a million small chunks with
//! about 8 bytes of metadata each, read and write them singly and in batches, show the
//! typed API, the statistics and a consistency check, then run a short benchmark. Later
//! issues turn this into a local cluster demo.

use std::time::Instant;

use myriad_bench::mem::{KeyDistribution, MemArgs, Workload};
use myriad_mem::{ChunkId, MemoryConfig, MemoryManager, NodeId};

/// Runs the demo.
pub fn run() -> anyhow::Result<()> {
    println!("Myriad demo: the peer-local memory manager\n");
    let memory = MemoryManager::new(MemoryConfig {
        node_id: NodeId(1),
        region_bytes: 1 << 30,
        ..MemoryConfig::default()
    })?;

    let count = 1_000_000;
    let started = Instant::now();
    let cids = memory.create_many(count, 32)?;
    println!(
        "created {count} chunks of 32 bytes in one batch call: {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    let started = Instant::now();
    for (index, &cid) in cids.iter().enumerate() {
        let mut value = [0u8; 32];
        value[..8].copy_from_slice(&(index as u64).to_le_bytes());
        memory.put(cid, &value)?;
    }
    println!(
        "wrote all of them with single puts: {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );

    let probe = cids[123_456];
    let mut buffer = [0u8; 32];
    memory.get(probe, &mut buffer)?;
    println!(
        "get {probe}: first 8 bytes hold {}",
        u64::from_le_bytes(buffer[..8].try_into()?)
    );

    let mut batch_sum = 0u64;
    memory.get_batch_with(&cids[..64], |_, result| {
        if let Ok(bytes) = result {
            batch_sum += u64::from(bytes[0]);
        }
    });
    println!("batch get of 64 chunks in one call: sum of first bytes = {batch_sum}");

    let name = memory.create_typed(&"typed chunks encode themselves".to_string())?;
    println!(
        "typed chunk {name}: {:?}",
        memory.get_typed::<String>(name)?
    );

    for &cid in &cids[..1000] {
        memory.remove(cid)?;
    }
    let reused = memory.create(32)?;
    println!(
        "removed 1000 chunks; the next create reuses a freed ID: {reused} (was {})",
        cids[999]
    );
    let missing = ChunkId::new(NodeId(1), 5).unwrap_or(probe);
    println!(
        "get of a removed chunk is a typed error: {}",
        memory.get_vec(missing).unwrap_err()
    );

    let stats = memory.stats();
    println!(
        "\nstats: {} chunks, {:.1} MiB payload, {:.2} bytes metadata per chunk, {:.1} MiB free in the region, fragmentation {:.3}",
        stats.chunks,
        stats.payload_bytes as f64 / (1 << 20) as f64,
        stats.metadata_bytes as f64 / stats.chunks as f64,
        stats.free_bytes as f64 / (1 << 20) as f64,
        stats.fragmentation
    );
    let started = Instant::now();
    memory.check_consistency().map_err(anyhow::Error::msg)?;
    println!(
        "consistency walk of table and allocator: ok ({:.0} ms)",
        started.elapsed().as_secs_f64() * 1e3
    );
    drop(memory);

    println!("\nA short benchmark (full version: myriad bench mem):\n");
    myriad_bench::mem::run(&MemArgs {
        workload: Some(Workload::FacebookB),
        objects: Some(1_000_000),
        size: None,
        threads: None,
        distribution: Some(KeyDistribution::Uniform),
        batch: None,
        ops: 4_000_000,
        huge_pages: true,
        json: false,
    })
    .map_err(anyhow::Error::msg)
}
