"""flask-limiter with rl as its storage: the usual flask-limiter code, with
the storage URI ``rl://`` (and the import that registers it).

    pip install '.[limits]' Flask Flask-Limiter
    RL_STORAGE_URI=rl://127.0.0.1:6379 python examples/flask_limiter_app.py
    curl -i http://127.0.0.1:8000/hello
"""

import os

from flask import Flask
from flask_limiter import Limiter
from flask_limiter.util import get_remote_address

import rl_server.limits_storage  # noqa: F401  registers the rl:// storage

app = Flask(__name__)
limiter = Limiter(
    get_remote_address,
    app=app,
    storage_uri=os.environ.get("RL_STORAGE_URI", "rl://127.0.0.1:6379"),
    strategy=os.environ.get("RL_STRATEGY", "sliding-window-counter"),
    headers_enabled=True,
)


@app.route("/hello")
@limiter.limit("30/minute")
def hello() -> dict[str, bool]:
    return {"ok": True}


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), threaded=True)
