"""`start` and `check` as defuss-apl takes them (`options` a dict), run by aplc."""

from typing import Any, Dict, Optional

import aplc

#: The dialect every call runs in.
DIALECT = "defuss-1.1"

#: defuss-apl's run failure is `defuss_apl.runtime.RuntimeError`; aplc's is
#: `aplc.RunError` (a builtin `RuntimeError`), which carries the same message.
RuntimeError = aplc.RunError  # noqa: A001 (the reference's name)


def _relaxed(options: Dict[str, Any]) -> bool:
    # defuss-apl's relaxed syntax is on unless the caller turns it off; aplc's is off.
    return bool(options.get("relaxed", True))


def _aplc_options(options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    options = dict(options or {})
    options["relaxed"] = _relaxed(options)
    options["dialect"] = DIALECT
    providers = dict(options.get("with_providers") or {})
    if "*" not in providers and _default_provider() is not None:
        providers["*"] = _default_provider()
    options["with_providers"] = providers
    return options


def _default_provider():
    """defuss-apl's provider for a model without one: OpenAI's client when the `openai`
    package is installed, else its test mock (`providers.get_default_provider`). aplc's
    default is its own HTTP client, so the shim adds the mock in the second case only."""
    try:
        import openai  # noqa: F401
    except ImportError:
        from .test_utils import create_mock_provider

        return create_mock_provider()
    return None


async def start(apl: str, options: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return await aplc.start(apl, _aplc_options(options))


def check(apl: str, options: Optional[Dict[str, Any]] = None) -> bool:
    return aplc.check(apl, relaxed=_relaxed(options or {}), dialect=DIALECT)


class APLRuntime:
    """defuss-apl's executor class, which some test modules import. Only its public
    shape is mapped (`APLRuntime(options).start(apl)`); its internals (the relaxed
    syntax rewriter) have no counterpart, and the tests that call them are not
    applicable."""

    def __init__(self, options: Optional[Dict[str, Any]] = None) -> None:
        self.options = dict(options or {})

    async def start(self, apl: str) -> Dict[str, Any]:
        return await start(apl, self.options)
