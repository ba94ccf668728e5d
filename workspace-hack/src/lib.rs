//! Empty on purpose: this crate only unifies dependency features (see its Cargo.toml).
