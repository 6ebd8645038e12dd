"""The HTTP face: the app and its middleware (bodies, browsers, auth), the routes of each API, what goes on to
an upstream Ollama, and running it all under uvicorn."""
