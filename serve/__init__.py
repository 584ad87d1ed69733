"""`k3 serve`: the OpenAI-compatible HTTP API over one resident engine (docs/SERVER.md).

The room: schema.py (request bodies -> typed requests, OpenAI-shaped errors), worker.py (the one thread
that advances every admitted request through the engine), app.py (the routes, an APIRouter that `k3 ui`
also mounts), http.py (where it listens and who may call it), plugin.py (the subcommand). Imports only
`k3core`'s front door, FastAPI and uvicorn; the browser UI imports this room, never the reverse.
"""
