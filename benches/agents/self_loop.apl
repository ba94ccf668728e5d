{# One step that loops on itself `limit` times (default 500). #}
# pre: loop
{{ inc_context('i') }}

# prompt: loop
Iteration {{ i }}: {{ result_text }}

# post: loop
{% if i < get_context('limit', 500) %}{{ set_context('next_step', 'loop') }}{% endif %}
