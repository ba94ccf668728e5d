{# 8 steps; system and user roles; loops and filters over a list in every phase. #}
# pre: s0
{% if get_context('items') is none %}{{ set_context('items', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) }}{% endif %}
{% for item in items if item | length > 4 %}{{ add_context('seen', 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s0
## system
You are step s0. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s0
{% for call in result_tool_calls if not call.with_error %}{{ add_context('ok_calls', 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', lengths | sum) }}
{{ set_context('next_step', 's1') }}

# pre: s1
{% if get_context('items') is none %}{{ set_context('items', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) }}{% endif %}
{% for item in items if item | length > 4 %}{{ add_context('seen', 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s1
## system
You are step s1. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s1
{% for call in result_tool_calls if not call.with_error %}{{ add_context('ok_calls', 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', lengths | sum) }}
{{ set_context('next_step', 's2') }}

# pre: s2
{% if get_context('items') is none %}{{ set_context('items', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) }}{% endif %}
{% for item in items if item | length > 4 %}{{ add_context('seen', 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s2
## system
You are step s2. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s2
{% for call in result_tool_calls if not call.with_error %}{{ add_context('ok_calls', 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', lengths | sum) }}
{{ set_context('next_step', 's3') }}

# pre: s3
{% if get_context('items') is none %}{{ set_context('items', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) }}{% endif %}
{% for item in items if item | length > 4 %}{{ add_context('seen', 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s3
## system
You are step s3. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s3
{% for call in result_tool_calls if not call.with_error %}{{ add_context('ok_calls', 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', lengths | sum) }}
{{ set_context('next_step', 's4') }}

# pre: s4
{% if get_context('items') is none %}{{ set_context('items', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) }}{% endif %}
{% for item in items if item | length > 4 %}{{ add_context('seen', 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s4
## system
You are step s4. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s4
{% for call in result_tool_calls if not call.with_error %}{{ add_context('ok_calls', 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', lengths | sum) }}
{{ set_context('next_step', 's5') }}

# pre: s5
{% if get_context('items') is none %}{{ set_context('items', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) }}{% endif %}
{% for item in items if item | length > 4 %}{{ add_context('seen', 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s5
## system
You are step s5. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s5
{% for call in result_tool_calls if not call.with_error %}{{ add_context('ok_calls', 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', lengths | sum) }}
{{ set_context('next_step', 's6') }}

# pre: s6
{% if get_context('items') is none %}{{ set_context('items', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) }}{% endif %}
{% for item in items if item | length > 4 %}{{ add_context('seen', 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s6
## system
You are step s6. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s6
{% for call in result_tool_calls if not call.with_error %}{{ add_context('ok_calls', 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', lengths | sum) }}
{{ set_context('next_step', 's7') }}

# pre: s7
{% if get_context('items') is none %}{{ set_context('items', ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']) }}{% endif %}
{% for item in items if item | length > 4 %}{{ add_context('seen', 1) }}{% endfor %}
{{ set_context('title', items | map('upper') | join(', ') | truncate(30)) }}

# prompt: s7
## system
You are step s7. Known items: {% for item in items | sort %}{{ loop.index }}. {{ item | title }}{% if not loop.last %}, {% endif %}{% endfor %}.
## user
{{ title }} — seen {{ seen }} long items. Previous answer: {{ result_text | default('none') | truncate(40) }}
{% for item in items | reverse %}- {{ item | capitalize }} ({{ item | length }})
{% endfor %}

# post: s7
{% for call in result_tool_calls if not call.with_error %}{{ add_context('ok_calls', 1) }}{% endfor %}
{{ set_context('lengths', items | map('length') | list) }}
{{ set_context('total', lengths | sum) }}
{{ set_context('next_step', 'return') }}
