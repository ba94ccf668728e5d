{# inputs: ticket #}
{# A support agent: the model looks the order up with the `lookup_order` tool (a Rust
   closure in the service), then writes the reply. #}
# pre: triage
{{ set_context('model', 'support-model') }}
{{ set_context('allowed_tools', ['lookup_order']) }}

# prompt: triage
## system
You answer customer tickets. Look the order up before you answer.
## user
{{ ticket }}

# post: triage
{% if result_tool_calls and not result_tool_calls[0].with_error %}
{{ set_context('order', result_tool_calls[0].content) }}
{{ set_context('next_step', 'answer') }}
{% endif %}

# prompt: answer
## system
Write a one-line reply to the customer.
## user
Ticket: {{ ticket }}
Order details: order {{ order.id }} is {{ order.status }}.
