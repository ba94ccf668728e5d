"""Native tools from Python (spec §5): descriptor inference (§5.1.1) and the §6 helpers
``describe_tools``, ``call_tool``, ``call_tools`` and ``validate_schema``."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import typing
from typing import Any, Callable, Dict, List, Mapping, Optional

from . import _aplc

#: JSON Schema types of the Python annotations descriptor inference understands.
_JSON_TYPES: Dict[Any, str] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
    type(None): "null",
}


def infer_descriptor(fn: Callable[..., Any], name: Optional[str] = None) -> Dict[str, Any]:
    """The OpenAI function descriptor of ``fn`` (§5.1.1): its name, its docstring as the
    description, and a parameter schema from its signature and type hints. A parameter
    named ``context`` is the run's context, not an argument the model gives."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise TypeError(f"cannot infer a descriptor for {fn!r}: {e}") from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        # Unresolvable annotations (a forward reference to a missing name) describe no type.
        hints = {}
    properties: Dict[str, Any] = {}
    required: List[str] = []
    for param in signature.parameters.values():
        if param.name == "context" or param.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            continue
        schema = _schema_of(_hint(fn, hints, param))
        schema["description"] = f"{param.name} parameter"
        properties[param.name] = schema
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    return {
        "name": name or getattr(fn, "__name__", "tool"),
        "description": inspect.getdoc(fn) or "",
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


def _hint(fn: Any, hints: Dict[str, Any], param: inspect.Parameter) -> Any:
    """The type hint of ``param``, the same on every Python: before 3.11,
    ``typing.get_type_hints`` makes ``x: T = None`` ``Optional[T]``; 3.11 on, it does not."""
    hint = hints.get(param.name, inspect.Parameter.empty)
    if sys.version_info >= (3, 11) or param.default is not None:
        return hint
    raw = getattr(fn, "__annotations__", {}).get(param.name, inspect.Parameter.empty)
    if not isinstance(raw, str):
        return raw
    if typing.get_origin(hint) is typing.Union and not any(w in raw for w in ("Optional", "None", "|")):
        rest = tuple(a for a in typing.get_args(hint) if a is not type(None))
        return rest[0] if len(rest) == 1 else typing.Union[rest]
    return hint


def _schema_of(annotation: Any) -> Dict[str, Any]:
    """The JSON Schema of one annotation; ``{}`` (anything) for what has no JSON type."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or (origin is not None and type(annotation).__name__ == "UnionType"):
        types = [_schema_of(a) for a in args]
        names = [t.get("type") for t in types]
        if all(isinstance(n, str) for n in names):
            return {"type": names if len(names) > 1 else names[0]}
        return {}
    if origin in (list, tuple, set, frozenset):
        schema: Dict[str, Any] = {"type": "array"}
        if args and origin is list:
            items = _schema_of(args[0])
            if items:
                schema["items"] = items
        return schema
    if origin is dict:
        return {"type": "object"}
    if origin is typing.Literal:
        return {"enum": list(args)}
    return {}


class ToolEntry:
    """One tool of ``with_tools``: its callable, whether it takes the context, and its
    descriptor (given or inferred)."""

    __slots__ = ("name", "fn", "with_context", "descriptor", "is_async")

    def __init__(self, name: str, config: Any) -> None:
        if not isinstance(config, Mapping):
            raise TypeError(f"with_tools[{name!r}] must be a dict with 'fn', found {type(config).__name__}")
        fn = config.get("fn")
        if not callable(fn):
            raise TypeError(f"with_tools[{name!r}]['fn'] must be callable")
        descriptor = config.get("descriptor")
        if descriptor is None:
            descriptor = infer_descriptor(fn, name)
        elif not isinstance(descriptor, Mapping):
            raise TypeError(f"with_tools[{name!r}]['descriptor'] must be a dict")
        else:
            descriptor = dict(descriptor)
            descriptor.setdefault("name", name)
        if descriptor.get("name") != name:
            raise ValueError(
                f"with_tools[{name!r}]: the descriptor names the tool {descriptor.get('name')!r}"
            )
        self.name = name
        self.fn = fn
        self.with_context = bool(config.get("with_context", False))
        self.descriptor = descriptor
        self.is_async = inspect.iscoroutinefunction(fn)

    async def invoke(self, arguments: Dict[str, Any], context: Optional[Dict[str, Any]]) -> Any:
        """Calls the tool: async functions on this loop, sync ones in a thread."""
        kwargs = dict(arguments)
        if self.with_context:
            kwargs["context"] = context
        if self.is_async:
            result = await self.fn(**kwargs)
        else:
            result = await asyncio.to_thread(self.fn, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        return result


def split_manifest(with_tools: Any) -> "typing.Tuple[Any, Optional[typing.Tuple[str, str]]]":
    """``with_tools`` as its Python tools and the tool manifest Rust runs (spec/tools.md,
    spec/mcp.md): a path (``str`` or ``os.PathLike``) is a manifest file; a dict with an
    ``mcpServers`` key is a parsed manifest, whose entries with ``fn`` stay Python tools.
    The manifest is ``("file", path)`` or ``("json", text)``, else ``None``."""
    if isinstance(with_tools, (str, os.PathLike)):
        return {}, ("file", os.fsdecode(with_tools))
    if isinstance(with_tools, Mapping) and "mcpServers" in with_tools:
        python = {
            k: v for k, v in with_tools.items() if k != "mcpServers" and isinstance(v, Mapping) and "fn" in v
        }
        manifest = {str(k): v for k, v in with_tools.items() if k not in python}
        try:
            text = json.dumps(manifest)
        except (TypeError, ValueError) as e:
            raise TypeError(f"with_tools: the manifest must be JSON values: {e}") from None
        return python, ("json", text)
    return with_tools, None


def tool_entries(with_tools: Any) -> Dict[str, ToolEntry]:
    """Checks ``with_tools`` and infers missing descriptors."""
    if with_tools is None:
        return {}
    if isinstance(with_tools, ToolTable):
        return with_tools.entries
    if not isinstance(with_tools, Mapping):
        raise TypeError("with_tools must be a dict of tool name to tool dict")
    return {str(name): ToolEntry(str(name), config) for name, config in with_tools.items()}


class ToolTable(dict):
    """``with_tools`` as a provider's context carries it: the user's dicts, plus the
    checked entries so the helpers need not infer descriptors again."""

    def __init__(self, original: Mapping[str, Any], entries: Dict[str, ToolEntry]) -> None:
        super().__init__(original)
        self.entries = entries


def _allowed(context: Mapping[str, Any]) -> Optional[List[str]]:
    allowed = context.get("allowed_tools")
    if isinstance(allowed, str):
        return [allowed]
    if isinstance(allowed, (list, tuple)) and allowed:
        return [str(a) for a in allowed]
    return None


def describe_tools(context: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The descriptions of the context's ``with_tools``, filtered by ``allowed_tools``,
    in OpenAI format; also sets ``context["tools"]`` (§6)."""
    entries = tool_entries(context.get("with_tools"))
    allowed = _allowed(context)
    tools = [
        {"type": "function", "function": entry.descriptor}
        for name, entry in entries.items()
        if allowed is None or name in allowed
    ]
    context["tools"] = tools
    return tools


def _result(call_id: Any, content: Any, with_error: bool) -> Dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content, "with_error": with_error}


async def call_tool(tool_call: Dict[str, Any], context: Dict[str, Any]) -> Dict[str, Any]:
    """Runs one OpenAI-style tool call with the context's ``with_tools`` and returns the
    tool call result (§6). Failures are results with ``with_error`` set, never raised."""
    call_id = tool_call.get("id") if isinstance(tool_call, Mapping) else None
    function = tool_call.get("function") if isinstance(tool_call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        return _result(call_id, "Invalid tool call: expected function.name", True)
    name = function["name"]
    entries = tool_entries(context.get("with_tools"))
    entry = entries.get(name)
    if entry is None:
        return _result(call_id, f"Unknown tool: {name}", True)
    allowed = _allowed(context)
    if allowed is not None and name not in allowed:
        return _result(call_id, f"Tool not allowed: {name}", True)
    arguments = function.get("arguments", "{}")
    try:
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
    except ValueError as e:
        return _result(call_id, f"Invalid tool arguments: {e}", True)
    if not isinstance(arguments, Mapping):
        return _result(call_id, "Invalid tool arguments: expected a JSON object", True)
    try:
        content = await entry.invoke(dict(arguments), context)
    except Exception as e:  # a tool failure is a result, never the caller's exception
        return _result(call_id, f"{type(e).__name__}: {e}", True)
    return _result(call_id, content, False)


async def call_tools(pending_tool_calls: List[Dict[str, Any]], context: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Runs each tool call in order with :func:`call_tool` (§6)."""
    return [await call_tool(call, context) for call in pending_tool_calls]


class SchemaValidationError(ValueError):
    """``result_json`` does not match ``output_structure``."""


def validate_schema(result_json: Any, context: Dict[str, Any]) -> bool:
    """Checks ``result_json`` against the JSON Schema in ``context["output_structure"]``
    (§6): ``True``, or raises :class:`SchemaValidationError` after appending the message
    to ``context["errors"]``. Without a schema every value is valid."""
    schema = context.get("output_structure")
    if schema is None or schema == "":
        return True
    schema_json = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        problems = _aplc.schema_errors(json.dumps(result_json), schema_json)
    except (TypeError, ValueError) as e:
        problems = [str(e)]
    if not problems:
        return True
    message = "; ".join(problems)
    errors = context.setdefault("errors", [])
    if isinstance(errors, list):
        errors.append(message)
    raise SchemaValidationError(message)
