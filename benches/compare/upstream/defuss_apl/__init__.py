"""A stand-in for defuss-apl 1.1.0's package, so that its own test suite runs against
aplc: every name the tests import is mapped onto the `aplc` package in the `defuss-1.1`
dialect (spec/dialects.md). Nothing here implements APL; it only translates the API.

Not a copy of defuss-apl: only the names and call shapes are the same. The test
fixtures (`test_utils`) are loaded from the upstream checkout the tests come from."""

from .parser import ValidationError, parse_apl
from .providers import create_openai_provider
from .runtime import RuntimeError, check, start  # noqa: A004 (the reference's name)
from .tools import call_tool, call_tools, describe_tools, validate_schema

__version__ = "1.1.0"
__all__ = [
    "start",
    "check",
    "parse_apl",
    "describe_tools",
    "call_tool",
    "call_tools",
    "validate_schema",
    "create_openai_provider",
    "ValidationError",
    "RuntimeError",
]
