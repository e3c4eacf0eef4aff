"""The aiohttp application: routes, SSE streams and the OpenAPI document."""
