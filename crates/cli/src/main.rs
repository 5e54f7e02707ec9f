//! The `myriad` binary: the command line of [`myriad::main_with`] with the built-in jobs
//! and tasks.

fn main() -> anyhow::Result<()> {
    myriad::main_with(myriad_compute::Registry::with_builtins())
}
