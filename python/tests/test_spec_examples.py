"""The spec's Python examples (§4.1, §5.2), verbatim but for the import."""

import asyncio
import json

import aplc
from aplc import start

from conftest import response, tool_call


def test_provider_example_4_1():
    agent = """
# prompt:
Mock a provider function that returns a greeting.
"""

    async def provider(context: dict) -> dict:
        prompts      = context["prompts"]   # list of message dicts (schema §3)
        model        = context.get("model", "gpt-4o")
        temperature  = context.get("temperature")  # None if not set
        # ... other user vars ...
        # Do steps described in §2.2.*
        # Then return OpenAI-standard format:
        return {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": "Mocked response",
                        # tool_calls would go here if the LLM made any
                    }
                }
            ],
            "usage": {  # optional
                "prompt_tokens": 5,
                "completion_tokens": 2,
                "total_tokens": 7
            }
        }

    async def main():
        status = await start(agent, options={
            "with_providers": {"gpt-4o": provider},
        })
        return status

    status = asyncio.run(main())
    assert status["result_text"] == "Mocked response"
    assert status["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert status["errors"] == []
    [prompt] = status["prompts"]
    assert prompt["role"] == "user"


def test_tool_example_5_2(fake_model):
    # §5.2 names no provider: the default HTTP provider answers, here a fake model on
    # 127.0.0.1 that calls the tool.
    model = fake_model([response("", [tool_call("call_1", "calc", {"num1": 40, "num2": 2})])])
    agent = """
# pre: greet
{{ set_context('model', 'gpt-4o') }}
{{ set_context('temperature', 0.7) }}
{{ set_context('allowed_tools', ['calc']) }}

# prompt: greet
## system
You can use the calc tool to add two numbers.

## user
What's the sum of 40 and 2?
"""

    seen_context = []

    async def calc(num1: int, num2: int, context=None):
        """Return the arithmetic sum of two numbers."""
        seen_context.append(context)
        return num1 + num2

    # with automatic function descriptor inference (Python runtime)
    calc_tool = {
        "fn": calc,
        "with_context": True
    }

    secret = "sk-test-secret-0123456789abcdef"
    events = []

    async def main():
        return await start(agent, options={
            "with_tools": {"calc": calc_tool},
            "base_url": model.base_url,
            "api_key": secret,
            "on_event": events.append,
        })

    status = asyncio.run(main())
    assert status["result_tool_calls"][0]["content"] == 42
    assert status["errors"] == []
    # The inferred descriptor went to the model.
    [request] = model.requests
    assert request["tools"][0]["function"]["parameters"]["properties"] == {
        "num1": {"type": "integer", "description": "num1 parameter"},
        "num2": {"type": "integer", "description": "num2 parameter"},
    }
    assert request["temperature"] == 0.7
    # with_context: the tool saw the run's context.
    assert seen_context[0]["allowed_tools"] == ["calc"]
    # The key went to the server, and nowhere else.
    assert model.headers[0].get("authorization") == f"Bearer {secret}"
    assert secret not in json.dumps(status)
    assert secret not in json.dumps(events)
