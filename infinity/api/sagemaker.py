"""Amazon SageMaker's container contract: GET /ping, and POST /invocations taking and answering what /predict
does (SageMaker passes the client's body through as it is)."""
from __future__ import annotations

import dataclasses
from typing import Any

from infinity.api import hf, ops
from infinity.api.endpoint import Endpoint
from infinity.api.operations.base import Operation

PING, INVOCATIONS = "/ping", "/invocations"


def endpoints(operation: Operation[Any, Any], limit: int) -> list[Endpoint]:
    task = operation.task
    predict = hf.endpoints(operation, limit)[0]
    return [dataclasses.replace(predict, path=INVOCATIONS, summary=f"Run {task.name} (SageMaker; the /predict body "
                                                                   "and answer)"),
            Endpoint(PING, hf.HF, "SageMaker's health check: 200 once the model is warm", ops.PLAIN, view=ops.ready,
                     method="GET", protected=False, errors={503: "Not ready"})]
