//! The names APL gives meaning to: executor-maintained variables (§2.4), user-settable
//! variables with their defaults (§2.5), and the variables reserved for later (§8).

use minijinja::Value;

/// Variables reserved for future versions of APL (§8).
pub const RESERVED_VARIABLES: &[&str] = &[
    // Parallel execution & synchronization
    "next_steps",
    "await_steps",
    "parallel_results",
    "race_winner",
    "concurrent_limit",
    // Workflow management
    "step_graph",
    "workflow_state",
    "checkpoint",
    "rollback",
    "snapshot",
    "resume_from",
    // Advanced tool capabilities
    "tool_registry",
    "tool_dependencies",
    "tool_cache",
    "streaming_tools",
    "tool_timeout",
    // Memory & state management
    "memory",
    "shared_state",
    "session",
    "workspace",
    "vector_store",
    // Observability & debugging
    "trace",
    "metrics",
    "profiler",
    "debug_info",
    "audit_log",
    // Advanced flow control
    "conditions",
    "loops",
    "break_points",
    "event_triggers",
    "webhooks",
    // Provider & model management
    "model_fallbacks",
    "provider_pool",
    "cost_tracking",
    "rate_limits",
    "model_routing",
    // Security & validation
    "permissions",
    "sandbox",
    "input_validation",
    "output_sanitization",
    "security_context",
    // Integration & extensions
    "plugins",
    "extensions",
    "middleware",
    "interceptors",
    "transformers",
    // Workflow composition
    "sub_workflows",
    "workflow_imports",
    "macro_steps",
    "step_library",
    "template_inheritance",
    // Real-time & streaming
    "streaming_mode",
    "real_time_updates",
    "push_notifications",
    "websocket_handlers",
    "sse_streams",
];

/// Variables the executor maintains (§2.4), except the `context` and `context_history`
/// views.
pub const EXECUTOR_VARIABLES: &[&str] = &[
    "prev_step",
    "next_step",
    "result_text",
    "result_json",
    "result_tool_calls",
    "result_image_urls",
    "result_audio_inputs",
    "result_files",
    "result_role",
    "usage",
    "runs",
    "global_runs",
    "time_elapsed",
    "time_elapsed_global",
    "errors",
    "prompts",
    "tools",
];

/// The user-settable variables (§2.5) and their defaults.
pub fn user_defaults() -> [(&'static str, Value); 14] {
    [
        ("model", Value::from("gpt-4o")),
        ("temperature", Value::from(())),
        ("allowed_tools", Value::from(Vec::<Value>::new())),
        ("output_mode", Value::from(())),
        ("output_structure", Value::from(())),
        ("max_tokens", Value::from(())),
        ("top_p", Value::from(())),
        ("presence_penalty", Value::from(())),
        ("frequency_penalty", Value::from(())),
        ("top_k", Value::from(())),
        ("repetition_penalty", Value::from(())),
        ("stop_sequences", Value::from(Vec::<Value>::new())),
        ("seed", Value::from(())),
        (
            "logit_bias",
            Value::from(std::collections::BTreeMap::<String, Value>::new()),
        ),
    ]
}
