"""The transport: sockets, HTTP/1.1 framing and uvicorn. Nothing else in the server imports uvicorn."""
