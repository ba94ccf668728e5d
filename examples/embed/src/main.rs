//! `cargo run -p aplc-example-embed`: the embedding example end to end, printed.

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    let tickets: Vec<String> = (0..16)
        .map(|i| format!("Where is my order {}?", 40 + i % 5))
        .collect();
    match aplc_example_embed::demo(&tickets).await {
        Ok(replies) => {
            for (ticket, reply) in tickets.iter().zip(replies) {
                match reply {
                    Ok(text) => println!("{ticket} -> {text}"),
                    Err(error) => println!("{ticket} -> error: {error:?}"),
                }
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
