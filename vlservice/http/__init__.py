"""The HTTP layer: OpenAI-compatible routes and SSE, operational routes, auth, errors, OpenAPI."""
