use myriad_compute::Registry;
/// Adds this crate's tasks to `registry`.
pub fn register(registry: Registry) -> Registry {
    registry
}
