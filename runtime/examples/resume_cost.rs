//! What a resume costs, phase by phase: `cargo run --release -p aplc-runtime --example
//! resume_cost -- STORE_URL RUN_ID`. Loads the run from the store, then rebuilds it
//! (restore the newest checkpoint, replay the journal after it), as `aplc resume` does
//! before it goes on live; prints the time of each phase.

use std::time::Instant;

use aplc_runtime::durable;
use aplc_runtime::store::{self, StoreUrl};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(id)) = (args.next(), args.next()) else {
        return Err("usage: resume_cost STORE_URL RUN_ID".into());
    };
    let store = store::open(&StoreUrl::parse(&url)?).await?;
    for round in 0..3 {
        let start = Instant::now();
        let loaded = store.load(&id).await?;
        let load = start.elapsed();
        let start = Instant::now();
        let outcome = durable::inspect(store.as_ref(), &id).await?;
        let rebuild = start.elapsed();
        println!(
            "round {round}: load {:.1} ms ({} checkpoints, {} inputs after the newest), \
             load + restore + replay {:.1} ms, {} steps",
            load.as_secs_f64() * 1e3,
            loaded.checkpoints.len(),
            loaded.inputs.len(),
            rebuild.as_secs_f64() * 1e3,
            outcome.steps
        );
    }
    Ok(())
}
