{# One step that loops on itself `limit` times (default 500). Only 1.1 helpers, so the reference runtime can run it too. #}
# pre: loop
{{ set_context('i', get_context('i', 0) + 1) }}

# prompt: loop
Iteration {{ i }}: {{ result_text }}

# post: loop
{% if i < get_context('limit', 500) %}{{ set_context('next_step', 'loop') }}{% endif %}
