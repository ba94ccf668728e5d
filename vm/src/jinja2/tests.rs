//! Tests of the Jinja2 built-ins; expected outputs come from Python Jinja2 3.1.6.
