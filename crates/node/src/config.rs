//! The settings of superpeers and peers: TOML file, defaults, command-line overrides.
