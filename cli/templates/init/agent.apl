{# A starter agent: `draft` writes a slogan and retries until it is short enough, at
   most three times; `review` scores the result as JSON. Run it without a model:
     aplc run agent.apl --mock responses.json  (see README.md)
   and test it with `aplc test`. #}
# pre: draft
{{ set_context('topic', get_context('topic', 'tidy desks')) }}
{{ set_context('max_attempts', 3) }}

# prompt: draft
## system
You write one-line slogans. Answer with the slogan only.
## user
Write a slogan about {{ topic }}.
{% if get_context('attempts', 0) > 0 %}
Your last slogan was too long: keep it under 60 characters.
{% endif %}

# post: draft
{{ inc_context('attempts', 0) }}
{{ set_context('slogan', result_text | trim) }}
{# A loop with a retry limit: `attempts` counts every try, failed calls included, so a
   model that keeps failing cannot loop forever. #}
{% if (errors or slogan | length > 60) and attempts < max_attempts %}
{{ set_context('next_step', 'draft') }}
{% else %}
{{ set_context('next_step', 'review') }}
{% endif %}

# pre: review
{{ set_context('output_mode', 'json') }}

# prompt: review
## user
Rate this slogan from 1 to 10. Answer with JSON only: {"score": <number>}.

{{ slogan }}
