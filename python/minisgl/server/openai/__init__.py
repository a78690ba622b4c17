"""The OpenAI-compatible API: request models and their checks, the chat, completions and native
``/generate`` handlers' parts (tools and their parsers, reasoning, structured output, echo), and
the plumbing of one HTTP request onto the backend that every API shares."""
