//! The embedding example, run by CI (`cargo test --workspace`): many concurrent runs of
//! one loaded agent against the fake HTTP model, with the Rust closure tool.

use aplc_example_embed::fake_model::{API_KEY, FakeModel};
use aplc_example_embed::{ReplyError, SupportAgent, demo};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_runs_call_the_model_and_the_tool() {
    let tickets: Vec<String> = (0..16)
        .map(|i| format!("Where is my order {}?", 40 + i % 5))
        .collect();
    let replies = demo(&tickets).await.expect("the demo starts");
    for (i, reply) in replies.iter().enumerate() {
        let expected = match 40 + i % 5 {
            40 => Ok("Thanks for waiting: order 40 is being packed.".to_string()),
            41 => Ok("Thanks for waiting: order 41 is shipped.".to_string()),
            42 => Ok("Thanks for waiting: order 42 is delivered.".to_string()),
            43 => Ok("Thanks for waiting: order 43 is refunded.".to_string()),
            // The tool fails, the triage step's post does not jump, and the run ends
            // after the tool error: `last_step_errors` turns it into a failed reply.
            _ => Err(ReplyError::Failed(
                "tool execution failed: `lookup_order`: no order 44".to_string(),
            )),
        };
        assert_eq!(reply, &expected, "ticket {i}: {}", tickets[i]);
    }
}

#[tokio::test]
async fn a_missing_input_is_a_bad_request_and_calls_no_model() {
    let model = FakeModel::start().await.unwrap();
    let agent = SupportAgent::new(&model.base_url(), API_KEY).unwrap();
    assert_eq!(
        agent.reply(None).await,
        Err(ReplyError::BadRequest("missing input: ticket".into()))
    );
    assert_eq!(model.requests(), 0);

    // The same agent then serves a good request: two model calls, one tool call.
    let reply = agent.reply(Some("Order 41, please?")).await;
    assert_eq!(
        reply.as_deref(),
        Ok("Thanks for waiting: order 41 is shipped.")
    );
    assert_eq!(model.requests(), 2);
}

#[test]
fn the_agent_compiles_without_diagnostics() {
    aplc_example_embed::load_program(aplc_example_embed::AGENT_SOURCE, "agent.apl")
        .expect("agent.apl compiles cleanly");
}
