"""The §6 tool helpers: aplc's own."""

from aplc import call_tool, call_tools, describe_tools, validate_schema

__all__ = ["call_tool", "call_tools", "describe_tools", "validate_schema"]
