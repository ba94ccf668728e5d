{# 8 steps; system and user roles; loops and filters over a list in every phase.
   `items` comes from agent8.context.json. No template reads a value it set itself, so the
   reference runtime (whose set_context is not live within a template) does the same work. #}
{# inputs: items #}
# pre: s0
{% for item in items if item | length > 4 %}{{ set_context('seen', get_context('seen', 0) + 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s0
## system
You are step s0. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s0
{% for call in result_tool_calls if not call.with_error %}{{ set_context('ok_calls', get_context('ok_calls', 0) + 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', items | map('length') | sum) }}
{{ set_context('next_step', 's1') }}

# pre: s1
{% for item in items if item | length > 4 %}{{ set_context('seen', get_context('seen', 0) + 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s1
## system
You are step s1. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s1
{% for call in result_tool_calls if not call.with_error %}{{ set_context('ok_calls', get_context('ok_calls', 0) + 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', items | map('length') | sum) }}
{{ set_context('next_step', 's2') }}

# pre: s2
{% for item in items if item | length > 4 %}{{ set_context('seen', get_context('seen', 0) + 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s2
## system
You are step s2. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s2
{% for call in result_tool_calls if not call.with_error %}{{ set_context('ok_calls', get_context('ok_calls', 0) + 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', items | map('length') | sum) }}
{{ set_context('next_step', 's3') }}

# pre: s3
{% for item in items if item | length > 4 %}{{ set_context('seen', get_context('seen', 0) + 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s3
## system
You are step s3. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s3
{% for call in result_tool_calls if not call.with_error %}{{ set_context('ok_calls', get_context('ok_calls', 0) + 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', items | map('length') | sum) }}
{{ set_context('next_step', 's4') }}

# pre: s4
{% for item in items if item | length > 4 %}{{ set_context('seen', get_context('seen', 0) + 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s4
## system
You are step s4. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s4
{% for call in result_tool_calls if not call.with_error %}{{ set_context('ok_calls', get_context('ok_calls', 0) + 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', items | map('length') | sum) }}
{{ set_context('next_step', 's5') }}

# pre: s5
{% for item in items if item | length > 4 %}{{ set_context('seen', get_context('seen', 0) + 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s5
## system
You are step s5. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s5
{% for call in result_tool_calls if not call.with_error %}{{ set_context('ok_calls', get_context('ok_calls', 0) + 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', items | map('length') | sum) }}
{{ set_context('next_step', 's6') }}

# pre: s6
{% for item in items if item | length > 4 %}{{ set_context('seen', get_context('seen', 0) + 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s6
## system
You are step s6. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s6
{% for call in result_tool_calls if not call.with_error %}{{ set_context('ok_calls', get_context('ok_calls', 0) + 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', items | map('length') | sum) }}
{{ set_context('next_step', 's7') }}

# pre: s7
{% for item in items if item | length > 4 %}{{ set_context('seen', get_context('seen', 0) + 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s7
## system
You are step s7. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s7
{% for call in result_tool_calls if not call.with_error %}{{ set_context('ok_calls', get_context('ok_calls', 0) + 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', items | map('length') | sum) }}
{{ set_context('next_step', 'return') }}
