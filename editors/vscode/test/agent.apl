{# inputs: ticket #}
# pre: triage
{{ set_context('attempts', 0) }}

# prompt: triage
## system
Tu es un trieur — réponds « urgent » ou non. 😀
## user
Ticket : {{ ticket | tojson }} (essai {{ runs }})

# post: triage
{% if 'urgent' in result_text %}
{{ set_context('next_step', 'escalate') }}
{% else %}{{ set_context('next_step', "reply") }}{% endif %}

# prompt: reply
```
# prompt: not a heading in a fence
```
# Not a phase
Réponds à {{ ticket }}.
{# Jinja from source.jinja: attributes, filters without a space, tests, escapes #}
{{ ticket.title|upper ~ '\n' }}{% if human_input is defined %}{{ get_context('n', runs + 1.5) }}{% endif %}
