# pre: draft
{{ set_context('topic', get_context('topic', 'sunsets')) }}

# prompt: draft
## system
You write haiku.
## user
Write a haiku about {{ topic }}.

# post: draft
{% if runs < 3 and "5-7-5" not in result_text %}
{{ set_context('next_step', 'draft') }}
{% endif %}
