//! `chunk-scan`: the whole `myriad` command line (superpeer, peer, term, cluster, bench)
//! whose peers also run this example's job, task and application.

fn main() -> anyhow::Result<()> {
    myriad::main_with(chunk_scan::registry())
}
