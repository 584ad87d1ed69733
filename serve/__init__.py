"""`k3 serve`: the OpenAI-compatible HTTP API over one resident engine (docs/SERVER.md).

The room: schema.py (request bodies -> typed requests, OpenAI-shaped errors), worker.py (the one thread
that advances every admitted request through the engine), api.py (what the routes of every dialect share),
chat_completions.py, anthropic.py and responses.py (the three dialects), app.py (their routes on one
APIRouter that `k3 ui` also mounts, and the app `k3 serve` runs), http.py (where it listens, who may call it,
the server flags `k3 ui` takes too), plugin.py (the subcommand). Imports only `k3core`'s front door and
public modules, FastAPI and uvicorn; the browser UI imports this room, never the reverse.
"""
