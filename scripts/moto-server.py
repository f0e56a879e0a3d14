"""moto's server, as `moto_server -H HOST -p PORT` runs it, with one difference: DynamoDB
requests are served one at a time. DynamoDB guarantees that a conditional write is atomic;
moto's in-memory tables check a condition and then write without a lock, so concurrent
conditional writes (lease contention) could both pass. Everything else stays concurrent
(SQS long polls must not block other calls).

Usage: python moto-server.py HOST PORT   (with moto's virtualenv's python)
"""

import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple

DYNAMODB = threading.Lock()


def serialize_dynamodb(app):
    def wrapped(environ, start_response):
        if environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB_"):
            with DYNAMODB:
                # The whole body is produced under the lock.
                return list(app(environ, start_response))
        return app(environ, start_response)

    return wrapped


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        host,
        port,
        serialize_dynamodb(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
