"""Amazon SageMaker's container contract: GET /ping, and POST /invocations taking and answering what /predict
does (SageMaker passes the client's body through as it is)."""
from __future__ import annotations

import dataclasses

from infinity.api import hf, ops
from infinity.api.endpoint import Endpoint
from infinity.tasks import Task

PING, INVOCATIONS = "/ping", "/invocations"


def endpoints(task: Task, limit: int) -> list[Endpoint]:
    predict = hf.endpoints(task, limit)[0]
    return [dataclasses.replace(predict, path=INVOCATIONS, summary=f"Run {task.name} (SageMaker; the /predict body "
                                                                   "and answer)"),
            Endpoint(PING, hf.HF, "SageMaker's health check: 200 once the model is warm", ops.PLAIN, view=ops.ready,
                     method="GET", protected=False, errors={503: "Not ready"})]
