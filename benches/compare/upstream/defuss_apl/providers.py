"""defuss-apl's OpenAI provider factory has no counterpart in aplc's package (aplc's
HTTP provider is the `base_url`/`api_key` options); no upstream test calls it."""


def create_openai_provider(options=None):
    raise NotImplementedError("aplc calls OpenAI itself: pass base_url and api_key to start()")
