"""The local OpenAI-compatible server: the core's chat behind the API the ecosystem speaks.

`lane` runs the core's work one request at a time on the thread that owns the core;
`protocol` reads requests and writes replies in OpenAI's shapes; `app` is the Starlette
application (authentication, limits, streaming); `running` starts it on uvicorn.
"""

DEFAULT_PORT = 8642  # the command's port when none is given (free of the usual 8080/1234)
