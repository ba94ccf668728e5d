{# A 4-step loop: a → b → c → d → a, once round, then return. #}
# prompt: a
Step a, visit {{ runs + 1 }}.
# post: a
{{ set_context('next_step', 'b') }}

# prompt: b
Step b after {{ prev_step }}: {{ result_text }}
# post: b
{{ set_context('next_step', 'c') }}

# prompt: c
Step c: {{ result_text | upper }}
# post: c
{{ set_context('next_step', 'd') }}

# prompt: d
Step d, {{ global_runs }} calls so far.
# post: d
{% if global_runs < 4 %}{{ set_context('next_step', 'a') }}{% endif %}
