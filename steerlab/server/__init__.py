"""An OpenAI-compatible steering server: FastAPI + uvicorn around one engine thread.

Needs the ``server`` extra (``pip install steerlab[server]``). Start one with
``steerlab serve steerlab-tiny --backend hf --port 8000``, or in Python::

    app = create_app(ServedModels(sl.load("steerlab-tiny", backend="hf")))
    uvicorn.run(app, host="127.0.0.1", port=8000)

Talk to it with the ``openai`` client (steering through ``extra_body``) or ``sl.connect``.
"""

from steerlab.server.app import create_app
from steerlab.server.models import ServedModels
from steerlab.server.plan import Limits

__all__ = ["Limits", "ServedModels", "create_app"]
